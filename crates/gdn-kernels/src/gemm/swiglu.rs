//! The MLP's gate/up projection with the SwiGLU fused into the GEMM:
//! `out[m, j] = silu(x·W_gate[j]ᵀ) * (x·W_up[j]ᵀ)` for a weight stored as one
//! `[W_gate; W_up]` tensor of `[2 * inter, k]` (how the runtime loads it).
//!
//! The fused kernel is quack-kernels 0.6.5's SM90 GEMM with its SwiGLU
//! epilogue, exported ahead of time with the CuTe DSL (bundle unit
//! `dsl_quack_sm90`, C ABI `cuda/gdn_swiglu_abi.h`). It never writes the
//! `[m, 2 * inter]` pre-activation, and keeps g and u in fp32 through the
//! activation with one bf16 rounding of the product (eager PyTorch rounds g,
//! u, silu(g) and the product). The unfused route is the GEMM of
//! [`crate::Gemm::linear`] into a scratch buffer, then `silu_mul_bf16`.
//!
//! The rule ([`swiglu_route`]) follows the measured crossover of the fused
//! kernel against cuBLAS + `silu_mul` on the 4B's shape (n 18432, k 2560,
//! `checks/gpu/swiglu_gemm_harness.cu`; figures in docs/performance.md,
//! "Kernels inside the forward", raw data in
//! docs/results/h200-2026-12-02-s6/): with few rows the fused kernel's
//! 128 x 192 tile grid reads the weight at about half of cuBLAS's bandwidth
//! and loses; the two are even around 256-384 rows; from 512 rows on the
//! fused kernel wins at every measured size. So calls of at least
//! [`SWIGLU_FUSED_MIN_ROWS`] rows take the fused kernel on an SM 9.0 GPU;
//! fewer rows, other GPUs and operands the kernel cannot take (misaligned,
//! k or inter not a multiple of 8) take the unfused route.
//! On an SM 9.0 GPU the kernel must load: a bundle whose kernel does not is
//! an error when [`crate::Gemm`] is created, not a silent fallback.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::gemm::linear::GemmShape;
use crate::gemm::swiglu_ffi::{self as ffi, SWIGLU};
use crate::model_ops::{exact, grid, i32_of, ModelOps};
use crate::shared::error::{invalid, During, ErrorKind, GdnError, Op};

const OP: Op = Op::SwigluGemm;

/// Fewest rows that take the fused kernel under [`SwigluRequest::Auto`]
/// (see the module doc for the measurements).
pub const SWIGLU_FUSED_MIN_ROWS: usize = 512;

/// Which route a gate/up + SwiGLU call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwigluRoute {
    /// quack's GEMM with the SwiGLU epilogue (sm_90a).
    Fused,
    /// [`crate::Gemm::linear`] into a scratch buffer, then `silu_mul_bf16`.
    Unfused,
}

/// How [`crate::Gemm`] picks the route (benchmarks and tests force one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SwigluRequest {
    /// The measured rule of [`swiglu_route`].
    #[default]
    Auto,
    /// Always unfused.
    Unfused,
    /// Always fused: an error where the fused kernel cannot run the call.
    Fused,
}

/// The route of `m` rows under `request`, given whether the fused kernel is
/// loaded and why the operands cannot take it (`None`: they can).
pub fn swiglu_route(
    request: SwigluRequest,
    fused_loaded: bool,
    operands_refused: Option<&str>,
    m: usize,
) -> Result<SwigluRoute, GdnError> {
    match request {
        SwigluRequest::Unfused => Ok(SwigluRoute::Unfused),
        SwigluRequest::Fused => match (fused_loaded, operands_refused) {
            (false, _) => Err(GdnError::new(
                OP,
                ErrorKind::Unsupported {
                    backend: "swiglu_gemm",
                    reason: "the fused SwiGLU GEMM runs on SM 9.0 GPUs only".into(),
                },
            )),
            (true, Some(why)) => Err(invalid(
                OP,
                "operands",
                format!("the fused kernel cannot take {why}"),
            )),
            (true, None) => Ok(SwigluRoute::Fused),
        },
        SwigluRequest::Auto => Ok(
            if fused_loaded && operands_refused.is_none() && m >= SWIGLU_FUSED_MIN_ROWS {
                SwigluRoute::Fused
            } else {
                SwigluRoute::Unfused
            },
        ),
    }
}

/// The fused kernel, loaded on every device (reference counted in C).
pub struct SwigluGemm {
    stream: Arc<CudaStream>,
    max_active_clusters: i32,
}

impl SwigluGemm {
    /// `Ok(None)` on GPUs other than SM 9.0 (the unfused route serves
    /// them); an error where an SM 9.0 GPU cannot load the kernel or the
    /// linked wrapper speaks another ABI.
    pub fn new(stream: Arc<CudaStream>) -> Result<Option<Self>, GdnError> {
        let ctx = stream.context();
        if ctx.compute_capability().during(OP)? != (9, 0) {
            return Ok(None);
        }
        SWIGLU.check_abi(OP)?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during(OP)?;
        // The module loads into the current context of each device.
        ctx.bind_to_thread().during(OP)?;
        // SAFETY: no arguments; loads the bundle's cubin.
        SWIGLU.check(OP, unsafe { ffi::gdn_swiglu_load() })?;
        Ok(Some(SwigluGemm {
            stream,
            // 2-CTA clusters, one CTA an SM (the kernel's shared memory):
            // half the SMs, as quack's own launcher computes it on the H200.
            max_active_clusters: (sms / 2).max(1),
        }))
    }

    /// Why these operands cannot take the fused kernel (`None`: they can):
    /// every extent within i32, k and inter multiples of 8, 16-byte aligned
    /// pointers. Lengths are the caller's check.
    /// `shape.n` is the output width (the intermediate size).
    pub fn unsupported(x_ptr: u64, w_ptr: u64, out_ptr: u64, shape: GemmShape) -> Option<String> {
        let GemmShape { m, n: inter, k } = shape;
        if m == 0 || inter == 0 || k == 0 {
            return Some(format!("m = {m}, inter = {inter}, k = {k} (all positive)"));
        }
        if i32::try_from(m).is_err()
            || i32::try_from(2 * inter).is_err()
            || i32::try_from(k).is_err()
        {
            return Some(format!("m = {m}, inter = {inter}, k = {k} exceed i32"));
        }
        if k % 8 != 0 || inter % 8 != 0 {
            return Some(format!("inter = {inter}, k = {k} (multiples of 8)"));
        }
        if x_ptr % 16 != 0 || w_ptr % 16 != 0 || out_ptr % 16 != 0 {
            return Some("x, w and out must be 16-byte aligned".into());
        }
        None
    }

    /// `out[m, n] = silu(g) * u` on the fused kernel (`shape.n` is the
    /// intermediate size); x `[m, k]` and out `[m, n]` dense (may be longer
    /// than m rows), w exactly `[2n, k]`.
    pub fn run<X, W, O>(&self, x: &X, w: &W, out: &mut O, shape: GemmShape) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        O: DevicePtrMut<bf16>,
    {
        check_lengths(x.len(), w.len(), out.len(), shape)?;
        let GemmShape { m, n: inter, k } = shape;
        let s = &self.stream;
        let (xp, _xg) = x.device_ptr(s);
        let (wp, _wg) = w.device_ptr(s);
        let (op, _og) = out.device_ptr_mut(s);
        if let Some(why) = Self::unsupported(xp, wp, op, shape) {
            return Err(invalid(OP, "operands", why));
        }
        let args = ffi::GdnSwigluGemmArgs {
            abi_version: ffi::GDN_SWIGLU_ABI_VERSION,
            struct_size: std::mem::size_of::<ffi::GdnSwigluGemmArgs>() as u32,
            output: op as *mut c_void,
            x: xp as *const c_void,
            w: wp as *const c_void,
            m: m as i64,
            n: 2 * inter as i64,
            k: k as i64,
            x_stride: k as i64,
            output_stride: inter as i64,
            max_active_clusters: self.max_active_clusters,
            reserved: 0,
            stream: s.cu_stream() as *mut c_void,
        };
        s.context().bind_to_thread().during(OP)?;
        // SAFETY: the pointers are live device allocations of the checked
        // lengths, held by the guards until the launch is enqueued; the
        // wrapper re-checks shapes, alignment and overlap.
        SWIGLU.check(OP, unsafe { ffi::gdn_swiglu_gemm(&args) })
    }
}

impl Drop for SwigluGemm {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: balances the load in `new` (the stream keeps the context alive).
        if unsafe { ffi::gdn_swiglu_unload() } != crate::shared::c_library::GDN_OK {
            log::warn!("gdn_swiglu_unload: {}", SWIGLU.last_error());
        }
    }
}

/// x at least `[m, k]`, out at least `[m, inter]`, the gate/up weight
/// exactly `[2 * inter, k]`.
pub(crate) fn check_lengths(
    x: usize,
    w: usize,
    out: usize,
    shape: GemmShape,
) -> Result<(), GdnError> {
    let GemmShape { m, n: inter, k } = shape;
    let dims = format!("m={m}, inter={inter}, k={k}");
    if x < m * k {
        return Err(invalid(
            OP,
            "x",
            format!("has {x} elements, needs {} ({dims})", m * k),
        ));
    }
    if out < m * inter {
        return Err(invalid(
            OP,
            "out",
            format!("has {out} elements, needs {} ({dims})", m * inter),
        ));
    }
    if w != 2 * inter * k {
        return Err(invalid(
            OP,
            "w",
            format!("has {w} elements, is not [2 * {inter}, {k}] ([W_gate; W_up])"),
        ));
    }
    Ok(())
}

impl ModelOps {
    /// SwiGLU: `out[r] = silu(gate_up[r, :I]) * gate_up[r, I:]`.
    pub fn silu_mul(
        &self,
        gate_up: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
        inter: usize,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::SiluMul;
        let rows = out.len() / inter.max(1);
        exact(OP, "out", out.len(), rows * inter)?;
        exact(OP, "gate_up", gate_up.len(), rows * 2 * inter)?;
        let (r, i) = (rows as i64, i32_of(OP, "inter", inter)?);
        let mut b = self.stream.launch_builder(&self.f.silu_mul);
        b.arg(out).arg(gate_up).arg(&r).arg(&i);
        // SAFETY: matches silu_mul_bf16; 8 columns a thread, 2048 a block,
        // every row's blocks in one grid dimension.
        let blocks = rows * inter.div_ceil(2048);
        i32_of(OP, "blocks", blocks)?;
        unsafe { b.launch(grid(blocks, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_takes_the_fused_kernel_only_where_measured_faster_and_able() {
        use SwigluRequest as Req;
        use SwigluRoute as Route;
        let route = |r, loaded, why: Option<&str>, m| swiglu_route(r, loaded, why, m).unwrap();
        let min = SWIGLU_FUSED_MIN_ROWS;
        assert_eq!(route(Req::Auto, true, None, min), Route::Fused);
        assert_eq!(route(Req::Auto, true, None, 8192), Route::Fused);
        assert_eq!(route(Req::Auto, true, None, min - 1), Route::Unfused);
        assert_eq!(route(Req::Auto, true, None, 1), Route::Unfused);
        assert_eq!(route(Req::Auto, false, None, 8192), Route::Unfused);
        assert_eq!(
            route(Req::Auto, true, Some("misaligned"), 8192),
            Route::Unfused
        );
        assert_eq!(route(Req::Unfused, true, None, 8192), Route::Unfused);
        assert_eq!(route(Req::Fused, true, None, 1), Route::Fused);
        assert!(swiglu_route(Req::Fused, false, None, 8192).is_err());
        let e = swiglu_route(Req::Fused, true, Some("k = 12"), 8192).unwrap_err();
        assert!(e.to_string().contains("k = 12"), "{e}");
    }

    #[test]
    fn operand_checks_name_the_problem() {
        let ok = SwigluGemm::unsupported(0, 16, 32, GemmShape::new(1024, 9216, 2560));
        assert_eq!(ok, None);
        let why =
            |x, m, inter, k| SwigluGemm::unsupported(x, 0, 0, GemmShape::new(m, inter, k)).unwrap();
        assert!(why(0, 0, 9216, 2560).contains("positive"));
        assert!(why(0, 8, 9212, 2560).contains("multiples of 8"));
        assert!(why(0, 8, 9216, 2564).contains("multiples of 8"));
        assert!(why(8, 8, 9216, 2560).contains("aligned"));
        assert!(why(0, 1 << 31, 9216, 2560).contains("exceed i32"));
        let (m, i, k) = (4, 9216, 2560);
        let shape = GemmShape::new(m, i, k);
        assert!(check_lengths(m * k, 2 * i * k, m * i, shape).is_ok());
        let e = check_lengths(m * k, i * k, m * i, shape)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("swiglu_gemm: w: ") && e.contains("W_gate"),
            "{e}"
        );
        let e = check_lengths(m * k - 1, 2 * i * k, m * i, shape).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::InvalidArgument { arg: "x", .. }),
            "{e}"
        );
        let e = check_lengths(m * k, 2 * i * k, m * i - 1, shape).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::InvalidArgument { arg: "out", .. }),
            "{e}"
        );
    }
}
