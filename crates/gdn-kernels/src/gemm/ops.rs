//! Row-major linear layers: `y[m, n] = x[m, k] · w[n, k]ᵀ`, bf16 inputs,
//! fp32 accumulation, bf16 or fp32 output — what a PyTorch `nn.Linear` in
//! bf16 computes. On cuBLAS (`CUBLAS_COMPUTE_32F`, loaded at run time from
//! libcublas.so.13, the handle bound to one stream) or, for the few-row
//! calls of decode steps that [`SKINNY_RULES`] names, on our skinny kernels
//! ([`SkinnyLinear`]). [`Gemm::linear`] picks; the two paths are also
//! callable by name (benchmarks, tests). The MLP's gate/up projection with
//! its SwiGLU is [`Gemm::gate_up_swiglu`], fused into one GEMM where
//! [`crate::gemm::swiglu`]'s rule says so.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::gemm::linear::{check_lengths, GemmOutput, GemmShape};
use crate::gemm::route::{route_in, LinearRoute, SKINNY_RULES};
use crate::gemm::skinny::{SkinnyConfig, SkinnyLinear};
use crate::gemm::swiglu::{swiglu_route, SwigluGemm, SwigluRequest, SwigluRoute};
use crate::model_ops::ModelOps;
use crate::shared::error::{invalid, During, ErrorKind, GdnError, Op};

const OP: Op = Op::Linear;

/// A cuBLAS handle on one stream, the skinny kernels where the bundle has
/// them for this GPU, and the fused SwiGLU GEMM on SM 9.0 GPUs.
pub struct Gemm {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    skinny: Option<SkinnyLinear>,
    swiglu: Option<SwigluGemm>,
    swiglu_request: SwigluRequest,
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        let blas = CudaBlas::new(stream.clone()).map_err(|source| {
            GdnError::new(
                OP,
                ErrorKind::Blas {
                    call: "handle creation".into(),
                    source,
                },
            )
        })?;
        // No skinny cubin for this GPU: every call stays on cuBLAS.
        let skinny = match SkinnyLinear::new(stream.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                log::info!("skinny linear kernels unavailable, cuBLAS only: {e}");
                None
            }
        };
        // An SM 9.0 GPU must load the fused kernel (a bad artifact is an
        // error); other GPUs take the unfused route.
        let swiglu = SwigluGemm::new(stream.clone())?;
        Ok(Gemm {
            blas,
            stream,
            skinny,
            swiglu,
            swiglu_request: SwigluRequest::Auto,
        })
    }

    /// Forces a route for [`Gemm::gate_up_swiglu`] (benchmarks, tests).
    pub fn set_swiglu_request(&mut self, request: SwigluRequest) {
        self.swiglu_request = request;
    }

    /// Where [`Gemm::gate_up_swiglu`] sends these operands (`shape.n` is
    /// the output width, see there).
    pub fn swiglu_route(
        &self,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        out: &CudaSlice<bf16>,
        shape: GemmShape,
    ) -> Result<SwigluRoute, GdnError> {
        let refused = {
            let s = &self.stream;
            let (xp, _xg) = x.device_ptr(s);
            let (wp, _wg) = w.device_ptr(s);
            let (op, _og) = out.device_ptr(s);
            SwigluGemm::unsupported(xp, wp, op, shape)
        };
        swiglu_route(
            self.swiglu_request,
            self.swiglu.is_some(),
            refused.as_deref(),
            shape.m,
        )
    }

    /// The MLP's input projection: `out[m, n] = silu(x·W_gateᵀ) *
    /// (x·W_upᵀ)` with `w = [W_gate; W_up]` (`[2n, k]`: `shape.n` is the
    /// intermediate size, the output width), x `[m, k]` (may be longer)
    /// and out exactly `[m, n]`. Fused into one GEMM where
    /// [`crate::swiglu_route`]'s rule says so, else [`Gemm::linear`] into a
    /// scratch buffer and `ops`' `silu_mul`. Returns the route taken.
    pub fn gate_up_swiglu(
        &self,
        ops: &ModelOps,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
        shape: GemmShape,
    ) -> Result<SwigluRoute, GdnError> {
        let GemmShape { m, n: inter, k } = shape;
        crate::gemm::swiglu::check_lengths(x.len(), w.len(), out.len(), shape)?;
        if out.len() != m * inter {
            return Err(invalid(
                Op::SwigluGemm,
                "out",
                format!("has {} elements, is not [{m}, {inter}]", out.len()),
            ));
        }
        let route = self.swiglu_route(x, w, out, shape)?;
        match (route, &self.swiglu) {
            (SwigluRoute::Fused, Some(fused)) => fused.run(x, w, out, shape)?,
            _ => {
                // SAFETY: written in full by the GEMM before silu_mul reads it.
                let mut gate_up =
                    unsafe { self.stream.alloc::<bf16>(m * 2 * inter) }.during(Op::SwigluGemm)?;
                self.linear(x, w, &mut gate_up, GemmShape::new(m, 2 * inter, k))?;
                ops.silu_mul(&gate_up, out, inter)?;
            }
        }
        Ok(route)
    }

    /// The skinny kernels, where the bundle has them for this GPU.
    pub fn skinny(&self) -> Option<&SkinnyLinear> {
        self.skinny.as_ref()
    }

    /// Where [`Gemm::linear`] sends `shape` by [`SKINNY_RULES`] (before
    /// the operand checks: misaligned operands still go to cuBLAS).
    pub fn route(shape: GemmShape) -> LinearRoute {
        route_in(SKINNY_RULES, shape)
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with every matrix dense row-major.
    /// `x` and `y` may be longer than `m` rows (only the first `m` are used).
    /// On the skinny kernels where [`SKINNY_RULES`] say so and the operands
    /// suit them, else on cuBLAS.
    pub fn linear<X, W, Y, O>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        shape: GemmShape,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        Y: DevicePtrMut<O>,
        O: GemmOutput,
    {
        if let (LinearRoute::Skinny(config), Some(skinny)) = (Self::route(shape), &self.skinny) {
            let fits = {
                let (xp, _xg) = x.device_ptr(&self.stream);
                let (wp, _wg) = w.device_ptr(&self.stream);
                SkinnyLinear::unsupported(xp, wp, shape).is_none()
            };
            if fits {
                return skinny.linear(x, w, y, shape, config);
            }
        }
        self.linear_cublas(x, w, y, shape)
    }

    /// [`Gemm::linear`] on the skinny kernels with `config`, whatever the
    /// rule says (an error where the bundle has no skinny cubin for this
    /// GPU or the operands do not suit them).
    pub fn linear_skinny<X, W, Y, O>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        shape: GemmShape,
        config: SkinnyConfig,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        Y: DevicePtrMut<O>,
        O: GemmOutput,
    {
        let skinny = self.skinny.as_ref().ok_or_else(|| {
            GdnError::new(
                Op::SkinnyLinear,
                ErrorKind::Unsupported {
                    backend: "skinny_linear",
                    reason: "the bundle has no skinny_linear cubin for this GPU".into(),
                },
            )
        })?;
        skinny.linear(x, w, y, shape, config)
    }

    /// [`Gemm::linear`] on cuBLAS, whatever the rule says.
    pub fn linear_cublas<X, W, Y, O>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        shape: GemmShape,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        Y: DevicePtrMut<O>,
        O: GemmOutput,
    {
        if shape.m == 0 {
            return Ok(());
        }
        check_lengths(OP, x.len(), w.len(), y.len(), shape)?;
        let dims: Vec<i32> = [shape.m, shape.n, shape.k]
            .iter()
            .map(|&d| {
                i32::try_from(d).map_err(|_| {
                    invalid(OP, "shape", format!("dimension {d} exceeds i32 ({shape})"))
                })
            })
            .collect::<Result<_, _>>()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let s = &self.stream;
        let (xp, _xg) = x.device_ptr(s);
        let (wp, _wg) = w.device_ptr(s);
        let (yp, _yg) = y.device_ptr_mut(s);
        // Column-major view: yᵀ[n, m] = w[n, k] (stored as wᵀ, k-major) · xᵀ[k, m].
        // SAFETY: the pointers are live allocations of this stream's context
        // with at least the element counts checked above; alpha/beta are host
        // scalars (the handle's default pointer mode); the guards order the
        // accesses on `s`.
        unsafe {
            gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                dims[1],
                dims[0],
                dims[2],
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                cudaDataType::CUDA_R_16BF,
                dims[2],
                xp as *const c_void,
                cudaDataType::CUDA_R_16BF,
                dims[2],
                &beta as *const f32 as *const c_void,
                yp as *mut c_void,
                O::CUDA_TYPE,
                dims[1],
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| {
            GdnError::new(
                OP,
                ErrorKind::Blas {
                    call: format!("gemm_ex ({shape})"),
                    source,
                },
            )
        })
    }
}
