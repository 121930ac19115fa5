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

use crate::shared::error::{invalid, During, ErrorKind, GdnError, Op};
use crate::gemm::linear::{check_lengths, GemmOutput, GemmShape};
use crate::model_ops::ModelOps;
use crate::gemm::skinny::{SkinnyConfig, SkinnyLinear};
use crate::gemm::swiglu::{swiglu_route, SwigluGemm, SwigluRequest, SwigluRoute};

const OP: Op = Op::Linear;

/// One entry of the routing rule: calls of exactly this `(n, k)` with
/// `min_m <= m <= max_m` rows run on the skinny kernels with `config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkinnyRule {
    pub n: usize,
    pub k: usize,
    pub min_m: usize,
    pub max_m: usize,
    pub config: SkinnyConfig,
}

/// A [`SkinnyRule`] in one line (the rule table's entries).
const fn rule(
    n: usize,
    k: usize,
    min_m: usize,
    max_m: usize,
    warps: u32,
    k_unroll: u32,
) -> SkinnyRule {
    SkinnyRule {
        n,
        k,
        min_m,
        max_m,
        config: SkinnyConfig { warps, k_unroll },
    }
}

/// Which calls leave cuBLAS for the skinny kernels: a (shape, row range)
/// is listed, with the configuration that was fastest there, only where the
/// skinny kernels beat cuBLAS at every measured m of the range (cuBLAS's
/// time including its split-K reduce kernels). Qwen3.5-4B and -35B-A3B
/// shapes only; anything else stays on cuBLAS. One configuration per shape for m <= 8
/// (the r1 kernels do the same work for every m up to 8, so m = 3, 5..7 run
/// as measured at 4 and 8) and one for 9..16 where it won at m = 16 (r2: the
/// same work for every m in 9..16). Measured with
/// `checks/gpu/skinny_harness.cu` at d98e9bf (the kernels and method of
/// `examples/skinny_bench.rs`: CUDA graphs of back-to-back calls over weight
/// copies larger than L2, median of 5): per-shape times in
/// docs/results/h200-2026-12-01/`skinny_harness-d98e9bf.jsonl`, the
/// per-step sums in docs/performance.md ("Kernels inside the forward").
/// The 35B-A3B rows: `skinny_bench --preset 35b-a3b` (the same method),
/// docs/results/h200-2026-12-03-s12/call3/`skinny_bench_35b.jsonl`.
pub const SKINNY_RULES: &[SkinnyRule] = &[
    // DeltaNet in_proj 2560 -> 12352: skinny at m <= 8 and at 9..16.
    rule(12352, 2560, 1, 8, 2, 8),
    rule(12352, 2560, 9, 16, 2, 4),
    // DeltaNet out_proj and attention o_proj 4096 -> 2560: both ranges.
    rule(2560, 4096, 1, 8, 8, 4),
    rule(2560, 4096, 9, 16, 8, 4),
    // Attention qkv 2560 -> 10240: m <= 8 (at m = 16 cuBLAS is faster).
    rule(10240, 2560, 1, 8, 4, 2),
    // MLP gate_up 2560 -> 18432: m <= 8, by a small margin at each of
    // m = 1, 2, 4, 8 (at m = 16 cuBLAS is faster).
    rule(18432, 2560, 1, 8, 8, 4),
    // MLP down 9216 -> 2560: m <= 8 (at m = 16 cuBLAS is faster).
    rule(2560, 9216, 1, 8, 8, 4),
    // lm_head 2560 -> 248320 (fp32 out): both ranges.
    rule(248320, 2560, 1, 8, 1, 2),
    rule(248320, 2560, 9, 16, 2, 4),
    // Qwen3.5-35B-A3B (hidden 2048). DeltaNet in_proj 2048 -> 12352.
    rule(12352, 2048, 1, 8, 4, 8),
    rule(12352, 2048, 9, 16, 2, 4),
    // DeltaNet out_proj and attention o_proj 4096 -> 2048.
    rule(2048, 4096, 1, 8, 16, 4),
    rule(2048, 4096, 9, 16, 16, 2),
    // Attention qkv 2048 -> 9216: m <= 8 (at m = 16 cuBLAS is faster).
    rule(9216, 2048, 1, 8, 8, 4),
    // The MoE router 2048 -> 256 experts, and with the shared expert's gate
    // as one more row (padded to 264, `MoeShape::router_width`), which the
    // model runs: at 264 the same configurations were the fastest again
    // (`skinny_bench --preset 35b-a3b`, 1.4-1.9x cuBLAS; on an H100).
    rule(256, 2048, 1, 8, 8, 8),
    rule(256, 2048, 9, 16, 16, 4),
    rule(264, 2048, 1, 8, 8, 8),
    rule(264, 2048, 9, 16, 16, 4),
    // The shared expert's gate 2048 -> 1 alone (cuBLAS runs a dot product
    // and a reduction kernel for it).
    rule(1, 2048, 1, 8, 16, 4),
    rule(1, 2048, 9, 16, 16, 2),
    // The shared expert's gate_up 2048 -> 1024 and down 512 -> 2048.
    rule(1024, 2048, 1, 8, 8, 8),
    rule(1024, 2048, 9, 16, 16, 4),
    rule(2048, 512, 1, 8, 4, 4),
    rule(2048, 512, 9, 16, 4, 4),
    // lm_head 2048 -> 248320 (fp32 out): both ranges.
    rule(248320, 2048, 1, 8, 1, 2),
    rule(248320, 2048, 9, 16, 2, 4),
];

/// Where [`Gemm::linear`] sends a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearRoute {
    Cublas,
    Skinny(SkinnyConfig),
}

/// The route of `shape` under `rules` (first match wins; none: cuBLAS).
pub fn route_in(rules: &[SkinnyRule], shape: GemmShape) -> LinearRoute {
    let GemmShape { m, n, k } = shape;
    rules
        .iter()
        .find(|r| r.n == n && r.k == k && (r.min_m..=r.max_m).contains(&m))
        .map_or(LinearRoute::Cublas, |r| LinearRoute::Skinny(r.config))
}

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
    /// [`crate::gemm::swiglu`]'s rule says so, else [`Gemm::linear`] into a
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

#[cfg(test)]
mod tests {
    use super::*;

    /// (n, k) of the 4B's linear layers.
    const QWEN35_4B_SHAPES: [(usize, usize); 6] = [
        (12352, 2560),
        (2560, 4096),
        (10240, 2560),
        (18432, 2560),
        (2560, 9216),
        (248320, 2560),
    ];

    #[test]
    fn measured_rule_covers_decode_rows_of_the_4b_and_nothing_else() {
        // Every 4B shape takes the skinny kernels at m <= 8; the kernels
        // must have each configuration the table names.
        for (n, k) in QWEN35_4B_SHAPES {
            for m in 1..=8 {
                let LinearRoute::Skinny(c) = Gemm::route(GemmShape::new(m, n, k)) else {
                    panic!("m={m} n={n} k={k} on cuBLAS");
                };
                c.check(m).unwrap();
            }
            // Prefill-sized calls always stay on cuBLAS.
            for m in [17, 64, 1024] {
                assert_eq!(
                    Gemm::route(GemmShape::new(m, n, k)),
                    LinearRoute::Cublas,
                    "m={m} n={n} k={k}"
                );
            }
        }
        // At 9..16 rows only where skinny won at 16.
        for (n, k, skinny) in [
            (12352, 2560, true),
            (2560, 4096, true),
            (248320, 2560, true),
            (10240, 2560, false),
            (18432, 2560, false),
            (2560, 9216, false),
        ] {
            for m in 9..=16 {
                let r = Gemm::route(GemmShape::new(m, n, k));
                assert_eq!(r != LinearRoute::Cublas, skinny, "m={m} n={n} k={k}: {r:?}");
                if let LinearRoute::Skinny(c) = r {
                    c.check(m).unwrap();
                }
            }
        }
        // Other shapes (another model's) stay on cuBLAS.
        assert_eq!(
            Gemm::route(GemmShape::new(1, 5120, 5120)),
            LinearRoute::Cublas
        );
        // The ranges of one shape do not overlap (first match would hide one).
        for (i, a) in SKINNY_RULES.iter().enumerate() {
            for b in &SKINNY_RULES[i + 1..] {
                let overlap = a.min_m <= b.max_m && b.min_m <= a.max_m;
                assert!(!(a.n == b.n && a.k == b.k && overlap), "{a:?} / {b:?}");
            }
        }
    }

    #[test]
    fn rule_matches_shape_and_row_range_first_entry_first() {
        let a = SkinnyConfig {
            warps: 4,
            k_unroll: 4,
        };
        let b = SkinnyConfig {
            warps: 8,
            k_unroll: 2,
        };
        let rules = [
            SkinnyRule {
                n: 2560,
                k: 9216,
                min_m: 1,
                max_m: 4,
                config: a,
            },
            SkinnyRule {
                n: 2560,
                k: 9216,
                min_m: 1,
                max_m: 8,
                config: b,
            },
        ];
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 2560, 9216)),
            LinearRoute::Skinny(a)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(4, 2560, 9216)),
            LinearRoute::Skinny(a)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(5, 2560, 9216)),
            LinearRoute::Skinny(b)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(9, 2560, 9216)),
            LinearRoute::Cublas
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 2560, 4096)),
            LinearRoute::Cublas
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 9216, 2560)),
            LinearRoute::Cublas
        );
    }
}
