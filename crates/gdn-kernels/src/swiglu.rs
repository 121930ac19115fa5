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
//! The rule ([`swiglu_route`]), measured on the H200 (2026-12-02,
//! `checks/gpu/swiglu_gemm_harness.cu`, 4B shape n 18432, k 2560, times in
//! us, fused vs cuBLAS + silu_mul, `docs/benchmarks.md`):
//! - m = 1: 55.6 vs 30.8; 17: 56.6 vs 31.4; 64: 45.7 vs 31.4; 128: 44.9 vs
//!   34.7 (a 128 x 192 tile grid reads the weight at about half of cuBLAS's
//!   bandwidth when m is small);
//! - m = 256: 41.1 vs 41.7; 384: 62.2 vs 60.3 (even);
//! - m = 512: 64.0 vs 77.7; 768: 99.9 vs 111.8; 1024: 121.4 vs 146.2; 2048:
//!   237.4 vs 277.9; 8192: 923.5 vs 1089-1271;
//!
//! so calls of at least [`SWIGLU_FUSED_MIN_ROWS`] rows take the fused kernel
//! on an SM 9.0 GPU; fewer rows, other GPUs and operands the kernel cannot
//! take (misaligned, k or inter not a multiple of 8) take the unfused route.
//! On an SM 9.0 GPU the kernel must load: a bundle whose kernel does not is
//! an error when [`crate::Gemm`] is created, not a silent fallback.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{op_error, GdnError};

const OP: &str = "swiglu_gemm";

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
            (false, _) => Err(GdnError::Unsupported {
                backend: OP,
                reason: "the fused SwiGLU GEMM runs on SM 9.0 GPUs only".into(),
            }),
            (true, Some(why)) => Err(op_error(OP, format!("the fused kernel cannot take {why}"))),
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

mod ffi {
    use std::ffi::{c_char, c_void};

    pub const GDN_SWIGLU_ABI_VERSION: u32 = 1;

    /// Mirrors `gdn_swiglu_gemm_args` (`cuda/gdn_swiglu_abi.h`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct GdnSwigluGemmArgs {
        pub abi_version: u32,
        pub struct_size: u32,
        /// bf16 [m, n/2]
        pub output: *mut c_void,
        /// bf16 [m, k]
        pub x: *const c_void,
        /// bf16 [n, k]: gate rows, then up rows
        pub w: *const c_void,
        pub m: i64,
        pub n: i64,
        pub k: i64,
        pub x_stride: i64,
        pub output_stride: i64,
        pub max_active_clusters: i32,
        pub reserved: i32,
        /// cudaStream_t (== CUstream)
        pub stream: *mut c_void,
    }

    extern "C" {
        pub fn gdn_swiglu_abi_version() -> u32;
        pub fn gdn_swiglu_load() -> i32;
        pub fn gdn_swiglu_unload() -> i32;
        pub fn gdn_swiglu_gemm(args: *const GdnSwigluGemmArgs) -> i32;
        pub fn gdn_swiglu_last_error() -> *const c_char;
        // Read only by the layout test.
        #[allow(dead_code)]
        pub static gdn_swiglu_gemm_args_layout: [u64; 14];
    }

    pub fn last_error() -> String {
        // SAFETY: a pointer to a NUL-terminated thread-local buffer, never NULL.
        unsafe { std::ffi::CStr::from_ptr(gdn_swiglu_last_error()) }
            .to_string_lossy()
            .into_owned()
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
        if ctx.compute_capability()? != (9, 0) {
            return Ok(None);
        }
        // SAFETY: no arguments.
        let actual = unsafe { ffi::gdn_swiglu_abi_version() };
        if actual != ffi::GDN_SWIGLU_ABI_VERSION {
            return Err(GdnError::AbiMismatch {
                expected: ffi::GDN_SWIGLU_ABI_VERSION,
                actual,
            });
        }
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        // The module loads into the current context of each device.
        ctx.bind_to_thread()?;
        // SAFETY: no arguments; loads the bundle's cubin.
        let status = unsafe { ffi::gdn_swiglu_load() };
        if status != 0 {
            return Err(GdnError::Launcher {
                status,
                detail: ffi::last_error(),
            });
        }
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
    pub fn unsupported(
        x_ptr: u64,
        w_ptr: u64,
        out_ptr: u64,
        m: usize,
        inter: usize,
        k: usize,
    ) -> Option<String> {
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

    /// `out[m, inter] = silu(g) * u` on the fused kernel; x `[m, k]` and out
    /// `[m, inter]` dense (may be longer than m rows), w exactly
    /// `[2 * inter, k]`.
    pub fn run<X, W, O>(
        &self,
        x: &X,
        w: &W,
        out: &mut O,
        m: usize,
        inter: usize,
        k: usize,
    ) -> Result<(), GdnError>
    where
        X: DevicePtr<bf16>,
        W: DevicePtr<bf16>,
        O: DevicePtrMut<bf16>,
    {
        check_lengths(x.len(), w.len(), out.len(), m, inter, k)?;
        let s = &self.stream;
        let (xp, _xg) = x.device_ptr(s);
        let (wp, _wg) = w.device_ptr(s);
        let (op, _og) = out.device_ptr_mut(s);
        if let Some(why) = Self::unsupported(xp, wp, op, m, inter, k) {
            return Err(op_error(OP, why));
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
        s.context().bind_to_thread()?;
        // SAFETY: the pointers are live device allocations of the checked
        // lengths, held by the guards until the launch is enqueued; the
        // wrapper re-checks shapes, alignment and overlap.
        let status = unsafe { ffi::gdn_swiglu_gemm(&args) };
        if status != 0 {
            return Err(GdnError::Launcher {
                status,
                detail: ffi::last_error(),
            });
        }
        Ok(())
    }
}

impl Drop for SwigluGemm {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: balances the load in `new` (the stream keeps the context alive).
        if unsafe { ffi::gdn_swiglu_unload() } != 0 {
            log::warn!("gdn_swiglu_unload: {}", ffi::last_error());
        }
    }
}

/// x at least `[m, k]`, out at least `[m, inter]`, the gate/up weight
/// exactly `[2 * inter, k]`.
pub(crate) fn check_lengths(
    x: usize,
    w: usize,
    out: usize,
    m: usize,
    inter: usize,
    k: usize,
) -> Result<(), GdnError> {
    let dims = format!("m={m}, inter={inter}, k={k}");
    if x < m * k {
        return Err(op_error(
            OP,
            format!("x has {x} elements, needs {} ({dims})", m * k),
        ));
    }
    if out < m * inter {
        return Err(op_error(
            OP,
            format!("out has {out} elements, needs {} ({dims})", m * inter),
        ));
    }
    if w != 2 * inter * k {
        return Err(op_error(
            OP,
            format!("w has {w} elements, is not [2 * {inter}, {k}] ([W_gate; W_up])"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ffi::*;
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn field_offsets_match_the_c_header() {
        let rust = [
            offset_of!(GdnSwigluGemmArgs, abi_version),
            offset_of!(GdnSwigluGemmArgs, struct_size),
            offset_of!(GdnSwigluGemmArgs, output),
            offset_of!(GdnSwigluGemmArgs, x),
            offset_of!(GdnSwigluGemmArgs, w),
            offset_of!(GdnSwigluGemmArgs, m),
            offset_of!(GdnSwigluGemmArgs, n),
            offset_of!(GdnSwigluGemmArgs, k),
            offset_of!(GdnSwigluGemmArgs, x_stride),
            offset_of!(GdnSwigluGemmArgs, output_stride),
            offset_of!(GdnSwigluGemmArgs, max_active_clusters),
            offset_of!(GdnSwigluGemmArgs, reserved),
            offset_of!(GdnSwigluGemmArgs, stream),
            size_of::<GdnSwigluGemmArgs>(),
        ];
        // SAFETY: a plain immutable array defined by the linked wrapper.
        let c = unsafe { gdn_swiglu_gemm_args_layout };
        for (i, (r, c)) in rust.iter().zip(c.iter()).enumerate() {
            assert_eq!(*r as u64, *c, "field #{i}: Rust offset {r}, C offset {c}");
        }
        // SAFETY: no arguments.
        assert_eq!(unsafe { gdn_swiglu_abi_version() }, GDN_SWIGLU_ABI_VERSION);
    }

    /// A well-formed 4B-shaped call on fake, never dereferenced addresses.
    fn args() -> GdnSwigluGemmArgs {
        let base = 0x7000_0000_0000usize;
        GdnSwigluGemmArgs {
            abi_version: GDN_SWIGLU_ABI_VERSION,
            struct_size: size_of::<GdnSwigluGemmArgs>() as u32,
            output: (base + 0x4000_0000) as *mut c_void,
            x: base as *const c_void,
            w: (base + 0x1000_0000) as *const c_void,
            m: 1024,
            n: 18432,
            k: 2560,
            x_stride: 2560,
            output_stride: 9216,
            max_active_clusters: 66,
            reserved: 0,
            stream: std::ptr::null_mut(),
        }
    }

    /// Calls the wrapper; it only reads the struct before refusing it.
    fn status(a: &GdnSwigluGemmArgs) -> (i32, String) {
        // SAFETY: every call below is refused before any CUDA call.
        (unsafe { gdn_swiglu_gemm(a) }, last_error())
    }

    #[test]
    fn wrapper_refuses_bad_calls_before_any_cuda_call() {
        // SAFETY: a NULL struct is refused first.
        assert_eq!(unsafe { gdn_swiglu_gemm(std::ptr::null()) }, 3);
        let mut a = args();
        a.abi_version += 1;
        assert_eq!(status(&a).0, 1);
        let mut a = args();
        a.struct_size -= 8;
        assert_eq!(status(&a).0, 2);
        type Edit = fn(&mut GdnSwigluGemmArgs);
        let cases: [(&str, Edit, &str); 8] = [
            ("null x", |a| a.x = std::ptr::null(), "NULL"),
            ("odd n", |a| a.n = 18431, "n even"),
            (
                "k not a multiple of 8",
                |a| (a.k, a.x_stride) = (2564, 2564),
                "multiples of 8",
            ),
            (
                "n/2 not a multiple of 8",
                |a| a.n = 2 * 9212,
                "multiples of 8",
            ),
            ("m past i32", |a| a.m = 1 << 31, "below 2^31"),
            (
                "short output stride",
                |a| a.output_stride = 9208,
                "shorter than its row",
            ),
            (
                "misaligned w",
                |a| a.w = (a.w as usize + 8) as *const c_void,
                "16-byte aligned",
            ),
            (
                "output over x",
                |a| a.output = a.x as *mut c_void,
                "overlaps",
            ),
        ];
        for (what, edit, expect) in cases {
            let mut a = args();
            edit(&mut a);
            let (code, msg) = status(&a);
            assert!(code == 3 || code == 4, "{what}: status {code} ({msg})");
            assert!(msg.contains(expect), "{what}: {msg:?} lacks {expect:?}");
        }
        // Well-formed, but nothing loaded in this process: refused, not run.
        let (code, msg) = status(&args());
        assert_eq!(code, 6, "{msg}");
        assert!(msg.contains("not loaded"), "{msg}");
    }

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
        let ok = SwigluGemm::unsupported(0, 16, 32, 1024, 9216, 2560);
        assert_eq!(ok, None);
        let why = |x, m, inter, k| SwigluGemm::unsupported(x, 0, 0, m, inter, k).unwrap();
        assert!(why(0, 0, 9216, 2560).contains("positive"));
        assert!(why(0, 8, 9212, 2560).contains("multiples of 8"));
        assert!(why(0, 8, 9216, 2564).contains("multiples of 8"));
        assert!(why(8, 8, 9216, 2560).contains("aligned"));
        assert!(why(0, 1 << 31, 9216, 2560).contains("exceed i32"));
        let (m, i, k) = (4, 9216, 2560);
        assert!(check_lengths(m * k, 2 * i * k, m * i, m, i, k).is_ok());
        assert!(check_lengths(m * k, i * k, m * i, m, i, k)
            .unwrap_err()
            .to_string()
            .contains("W_gate"));
        assert!(check_lengths(m * k - 1, 2 * i * k, m * i, m, i, k).is_err());
        assert!(check_lengths(m * k, 2 * i * k, m * i - 1, m, i, k).is_err());
    }
}
