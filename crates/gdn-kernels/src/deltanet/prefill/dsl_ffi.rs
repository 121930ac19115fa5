//! `gdn_dsl_abi.h`: the C ABI over the CuTe DSL GDN kernels (FlashInfer
//! 0.7.2.post1, exported ahead of time). The C side owns the tensor views
//! and the workspace layout.

use std::ffi::{c_char, c_void};

use crate::shared::c_library::CLibrary;

pub const GDN_DSL_ABI_VERSION: u32 = 1;

/// Mirrors `gdn_dsl_prefill_args` (`gdn_dsl_abi.h`): the C ABI over the
/// CuTe DSL kernels. Device pointers except `stream`; shapes as
/// [`super::ffi::GdnPrefillArgs`]; `kernel` is a `gdn_dsl_kernel` (1 SM90, 2 SM90 CP,
/// 3 SM100, 4 SM120).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GdnDslPrefillArgs {
    pub abi_version: u32,
    pub struct_size: u32,
    pub kernel: i32,
    /// SM90 CP: tokens per chunk, a multiple of 64; otherwise 0.
    pub cp_chunk_len: i32,
    /// bf16 [T, Hv, 128]
    pub output: *mut c_void,
    /// f32 [N, Hv, 128, 128]
    pub output_state: *mut f32,
    /// bf16 [T, Hqk, 128]
    pub q: *const c_void,
    /// bf16 [T, Hqk, 128]
    pub k: *const c_void,
    /// bf16 [T, Hv, 128]
    pub v: *const c_void,
    /// f32 [N, Hv, 128, 128] or null
    pub input_state: *const f32,
    /// f32 [T, Hv]
    pub alpha: *const f32,
    /// f32 [T, Hv]
    pub beta: *const f32,
    /// i64 [N + 1] (SM90, SM90 CP, SM120)
    pub cu_seqlens: *const i64,
    /// i32 [N + 1] (SM100)
    pub cu_seqlens_i32: *const i32,
    /// `gdn_dsl_workspace_bytes(args)` bytes, 256-byte aligned
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub total_tokens: i64,
    pub num_seqs: i32,
    pub max_seqlen: i32,
    pub num_qk_heads: i32,
    pub num_v_heads: i32,
    pub sm_count: i32,
    pub scale: f32,
    /// cudaStream_t (== CUstream)
    pub stream: *mut c_void,
}

extern "C" {
    pub fn gdn_dsl_abi_version() -> u32;
    pub fn gdn_dsl_workspace_bytes(args: *const GdnDslPrefillArgs) -> u64;
    // Read by the tests, which check them against the artifact table's values.
    #[allow(dead_code)]
    pub fn gdn_dsl_sm100_baked_sm_count() -> i32;
    #[allow(dead_code)]
    pub fn gdn_dsl_sm100_baked_qk_heads() -> i32;
    pub fn gdn_dsl_load(kernel: i32) -> i32;
    pub fn gdn_dsl_unload(kernel: i32) -> i32;
    pub fn gdn_dsl_prefill(args: *const GdnDslPrefillArgs) -> i32;
    pub fn gdn_dsl_last_error() -> *const c_char;
    // Read only by the layout test.
    #[allow(dead_code)]
    pub static gdn_dsl_prefill_args_layout: [u64; 25];
}

pub(crate) const DSL: CLibrary = CLibrary {
    name: "CuTe DSL wrapper",
    abi_version: GDN_DSL_ABI_VERSION,
    linked_abi_version: gdn_dsl_abi_version,
    last_error: gdn_dsl_last_error,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    #[test]
    fn dsl_field_offsets_match_the_c_header() {
        let rust = [
            offset_of!(GdnDslPrefillArgs, abi_version),
            offset_of!(GdnDslPrefillArgs, struct_size),
            offset_of!(GdnDslPrefillArgs, kernel),
            offset_of!(GdnDslPrefillArgs, cp_chunk_len),
            offset_of!(GdnDslPrefillArgs, output),
            offset_of!(GdnDslPrefillArgs, output_state),
            offset_of!(GdnDslPrefillArgs, q),
            offset_of!(GdnDslPrefillArgs, k),
            offset_of!(GdnDslPrefillArgs, v),
            offset_of!(GdnDslPrefillArgs, input_state),
            offset_of!(GdnDslPrefillArgs, alpha),
            offset_of!(GdnDslPrefillArgs, beta),
            offset_of!(GdnDslPrefillArgs, cu_seqlens),
            offset_of!(GdnDslPrefillArgs, cu_seqlens_i32),
            offset_of!(GdnDslPrefillArgs, workspace),
            offset_of!(GdnDslPrefillArgs, workspace_bytes),
            offset_of!(GdnDslPrefillArgs, total_tokens),
            offset_of!(GdnDslPrefillArgs, num_seqs),
            offset_of!(GdnDslPrefillArgs, max_seqlen),
            offset_of!(GdnDslPrefillArgs, num_qk_heads),
            offset_of!(GdnDslPrefillArgs, num_v_heads),
            offset_of!(GdnDslPrefillArgs, sm_count),
            offset_of!(GdnDslPrefillArgs, scale),
            offset_of!(GdnDslPrefillArgs, stream),
            size_of::<GdnDslPrefillArgs>(),
        ];
        // SAFETY: a plain immutable array defined by the linked wrapper.
        let c = unsafe { gdn_dsl_prefill_args_layout };
        for (i, (r, c)) in rust.iter().zip(c.iter()).enumerate() {
            assert_eq!(
                *r as u64, *c,
                "field #{i} of gdn_dsl_prefill_args: Rust offset {r}, C offset {c}"
            );
        }
        // SAFETY: no arguments, constants.
        unsafe {
            assert_eq!(gdn_dsl_abi_version(), GDN_DSL_ABI_VERSION);
            assert_eq!(gdn_dsl_sm100_baked_sm_count(), 148);
            assert_eq!(gdn_dsl_sm100_baked_qk_heads(), 16);
        }
    }

    /// A well-formed SM90 CP call on fake, never dereferenced addresses.
    fn dsl_args(kernel: i32) -> GdnDslPrefillArgs {
        let base = 0x7000_0000_0000usize;
        let mut a: GdnDslPrefillArgs = unsafe { std::mem::zeroed() };
        a.abi_version = GDN_DSL_ABI_VERSION;
        a.struct_size = size_of::<GdnDslPrefillArgs>() as u32;
        a.kernel = kernel;
        a.cp_chunk_len = if kernel == 2 { 2048 } else { 0 };
        a.q = base as *const c_void;
        a.k = (base + 0x1000_0000) as *const c_void;
        a.v = (base + 0x2000_0000) as *const c_void;
        a.output = (base + 0x3000_0000) as *mut c_void;
        a.output_state = (base + 0x4000_0000) as *mut f32;
        a.alpha = (base + 0x5000_0000) as *const f32;
        a.beta = (base + 0x5100_0000) as *const f32;
        a.cu_seqlens = (base + 0x5200_0000) as *const i64;
        a.cu_seqlens_i32 = (base + 0x5300_0000) as *const i32;
        a.workspace = (base + 0x6000_0000) as *mut c_void;
        a.workspace_bytes = 1 << 30;
        (a.total_tokens, a.num_seqs, a.max_seqlen) = (8192, 1, 8192);
        (a.num_qk_heads, a.num_v_heads, a.sm_count) = (16, 32, 132);
        a.scale = 0.088;
        a
    }

    #[test]
    fn dsl_wrapper_refuses_bad_calls_before_any_cuda_call() {
        // SAFETY (every call below): the wrapper only reads the struct before refusing it.
        assert_eq!(unsafe { gdn_dsl_prefill(std::ptr::null()) }, 3);
        let mut a = dsl_args(2);
        a.abi_version += 1;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 1);
        let mut a = dsl_args(2);
        a.struct_size -= 8;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 2);
        let mut a = dsl_args(9);
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4, "{}", DSL.last_error());
        a = dsl_args(2);
        a.cp_chunk_len = 100;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(DSL.last_error().contains("multiple of 64"));
        // SM100 bakes in 148 SMs and Hqk 16.
        let mut a = dsl_args(3);
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(DSL.last_error().contains("148"), "{}", DSL.last_error());
        a.sm_count = 148;
        a.num_qk_heads = 8;
        a.num_v_heads = 16;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(DSL.last_error().contains("Hqk 16"), "{}", DSL.last_error());
        // SM100 needs the int32 cu_seqlens.
        let mut a = dsl_args(3);
        a.sm_count = 148;
        a.cu_seqlens_i32 = std::ptr::null();
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 3);
        // Overlaps and a short workspace.
        let mut a = dsl_args(1);
        a.output = a.v as *mut c_void;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(DSL.last_error().contains("output overlaps"));
        let mut a = dsl_args(1);
        a.workspace_bytes = 132 * 128 - 1;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 5);
        // A family never loaded is refused, not launched.
        let a = dsl_args(4);
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 6);
        assert!(
            DSL.last_error().contains("not loaded"),
            "{}",
            DSL.last_error()
        );
        assert_eq!(unsafe { gdn_dsl_unload(4) }, 4);
    }

    #[test]
    fn panics_still_unwind_with_the_dsl_objects_linked() {
        // The DSL objects are in this binary (the wrapper references them).
        // SAFETY: NULL is refused before anything is read.
        assert_eq!(unsafe { gdn_dsl_prefill(std::ptr::null()) }, 3);
        // With the DSL's own unwind table linked, this aborted the process
        // (see detach_unwind_table in build.rs).
        let caught = std::panic::catch_unwind(|| panic!("unwinds"));
        assert!(caught.is_err());
    }

    #[test]
    fn dsl_workspace_sizes_follow_flashinfer() {
        // SAFETY: pure functions of the struct.
        let bytes = |a: &GdnDslPrefillArgs| unsafe { gdn_dsl_workspace_bytes(a) };
        assert_eq!(bytes(&dsl_args(1)), 132 * 128);
        assert_eq!(bytes(&dsl_args(4)), 132 * 128);
        assert_eq!(bytes(&dsl_args(3)), 148 * 4 * 128);
        // CP, 1x8192, Hv 32, chunk 2048: T blocks 128 x 32 x 64 x 64 bf16,
        // 3 x (4 chunks x 32 x 128 x 128 f32), tensormaps 132 x 128.
        let t = 128 * 32 * 64 * 64 * 2;
        let state = 4 * 32 * 128 * 128 * 4;
        assert_eq!(bytes(&dsl_args(2)), (t + 3 * state + 132 * 128) as u64);
        let mut a = dsl_args(2);
        a.cp_chunk_len = 0;
        assert_eq!(bytes(&a), 0);
    }
}
