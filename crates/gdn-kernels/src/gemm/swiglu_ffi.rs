//! `gdn_swiglu_abi.h`: quack-kernels 0.6.5's SM90 GEMM with its SwiGLU
//! epilogue, exported ahead of time with the CuTe DSL (bundle unit
//! `dsl_quack_sm90`).

use std::ffi::{c_char, c_void};

use crate::shared::c_library::CLibrary;

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

pub(crate) const SWIGLU: CLibrary = CLibrary {
    name: "SwiGLU GEMM wrapper",
    abi_version: GDN_SWIGLU_ABI_VERSION,
    linked_abi_version: gdn_swiglu_abi_version,
    last_error: gdn_swiglu_last_error,
};

#[cfg(test)]
mod tests {
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
        (unsafe { gdn_swiglu_gemm(a) }, SWIGLU.last_error())
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
}
