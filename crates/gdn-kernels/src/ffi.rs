//! Bindings to `gdn_abi.h`, the bundle's C ABI. Hand-written; the layout test
//! below compares every field offset with the C compiler's own `offsetof`,
//! exported by the launcher as `gdn_prefill_args_layout`.

use std::ffi::{c_char, c_void};

pub const GDN_ABI_VERSION: u32 = 1;
pub const GDN_OK: i32 = 0;

/// Mirrors `gdn_prefill_args`. Every pointer is a device pointer except `stream`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GdnPrefillArgs {
    pub abi_version: u32,
    pub struct_size: u32,
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
    /// i64 [N + 1]
    pub cu_seqlens: *const i64,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub total_tokens: i64,
    pub num_seqs: i32,
    pub num_qk_heads: i32,
    pub num_v_heads: i32,
    pub sm_count: i32,
    pub scale: f32,
    pub reserved: u32,
    /// cudaStream_t (== CUstream)
    pub stream: *mut c_void,
}

extern "C" {
    pub fn gdn_abi_version() -> u32;
    pub fn gdn_prefill_sm90_workspace_bytes(sm_count: i32) -> u64;
    pub fn gdn_prefill_sm90(args: *const GdnPrefillArgs) -> i32;
    pub fn gdn_last_error() -> *const c_char;
    /// `gdn_vsplit_abi.h`: the same call on the value-split kernel (the
    /// flashinfer_sm90_gva_vsplit unit); same struct and workspace.
    pub fn gdn_prefill_sm90_vsplit(args: *const GdnPrefillArgs) -> i32;
    pub fn gdn_vsplit_last_error() -> *const c_char;
    // Read only by the layout test.
    #[allow(dead_code)]
    pub static gdn_prefill_args_layout: [u64; 22];
}

pub const GDN_DSL_ABI_VERSION: u32 = 1;

/// Mirrors `gdn_dsl_prefill_args` (`gdn_dsl_abi.h`): the C ABI over the
/// CuTe DSL kernels. Device pointers except `stream`; shapes as
/// [`GdnPrefillArgs`]; `kernel` is a `gdn_dsl_kernel` (1 SM90, 2 SM90 CP,
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

pub const GDN_ATTENTION_ABI_VERSION: u32 = 1;
/// Head dim of the shipped FA3 instantiation (`GDN_ATTENTION_HEAD_DIM`).
pub const GDN_ATTENTION_HEAD_DIM: usize = 256;
/// Query rows per CTA tile of that instantiation (`GDN_ATTENTION_CTA_Q`).
pub const GDN_ATTENTION_CTA_Q: usize = 128;
/// `GDN_ATTENTION_MAX_WORKS_PER_HEAD`: above it FlashInfer's plan picks the
/// same-schedule kernel, which the bundle does not ship.
pub const GDN_ATTENTION_MAX_WORKS_PER_HEAD: usize = 4096;

/// Mirrors `gdn_attention_args` (`gdn_attention_abi.h`): FlashInfer's SM90
/// paged prefill. Device pointers except `qo_indptr` and `kv_len` (host) and
/// `stream`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GdnAttentionArgs {
    pub abi_version: u32,
    pub struct_size: u32,
    /// bf16 [T, Hq, 256]
    pub out: *mut c_void,
    /// bf16 [T, Hq, 256]
    pub q: *const c_void,
    /// bf16 [pages, page_size, Hkv, 256]
    pub k_cache: *const c_void,
    pub v_cache: *const c_void,
    /// i32 [N, max_blocks] (device)
    pub block_table: *const i32,
    /// i32 [N + 1] (host)
    pub qo_indptr: *const i32,
    /// i32 [N] (host)
    pub kv_len: *const i32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub num_seqs: i32,
    pub num_qo_heads: i32,
    pub num_kv_heads: i32,
    pub page_size: i32,
    pub max_blocks: i32,
    pub sm_scale: f32,
    /// cudaStream_t (== CUstream)
    pub stream: *mut c_void,
}

extern "C" {
    pub fn gdn_attention_abi_version() -> u32;
    pub fn gdn_attention_sm90_workspace_bytes(
        total_q: i64,
        num_seqs: i32,
        num_qo_heads: i32,
        sm_count: i32,
    ) -> u64;
    pub fn gdn_attention_sm90(args: *const GdnAttentionArgs) -> i32;
    pub fn gdn_attention_last_error() -> *const c_char;
    // Read only by the layout test.
    #[allow(dead_code)]
    pub static gdn_attention_args_layout: [u64; 18];
}

/// The attention launcher's last error detail on this thread.
pub fn attention_last_error() -> String {
    // SAFETY: gdn_attention_last_error returns a pointer to a NUL-terminated thread-local buffer, never NULL.
    unsafe { std::ffi::CStr::from_ptr(gdn_attention_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The DSL wrapper's last error detail on this thread.
pub fn dsl_last_error() -> String {
    // SAFETY: gdn_dsl_last_error returns a pointer to a NUL-terminated thread-local buffer, never NULL.
    unsafe { std::ffi::CStr::from_ptr(gdn_dsl_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The launcher's last error detail on this thread.
pub fn last_error() -> String {
    // SAFETY: gdn_last_error returns a pointer to a NUL-terminated thread-local buffer, never NULL.
    unsafe { std::ffi::CStr::from_ptr(gdn_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The value-split launcher's last error detail on this thread.
pub fn vsplit_last_error() -> String {
    // SAFETY: gdn_vsplit_last_error returns a pointer to a NUL-terminated thread-local buffer, never NULL.
    unsafe { std::ffi::CStr::from_ptr(gdn_vsplit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// One of the two launchers behind `gdn_prefill_args`, with its error detail.
pub type PrefillLauncher = (
    unsafe extern "C" fn(*const GdnPrefillArgs) -> i32,
    fn() -> String,
);
pub const PREFILL_SM90: PrefillLauncher = (gdn_prefill_sm90, last_error);
pub const PREFILL_SM90_VSPLIT: PrefillLauncher = (gdn_prefill_sm90_vsplit, vsplit_last_error);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn field_offsets_match_the_c_header() {
        let rust = [
            offset_of!(GdnPrefillArgs, abi_version),
            offset_of!(GdnPrefillArgs, struct_size),
            offset_of!(GdnPrefillArgs, output),
            offset_of!(GdnPrefillArgs, output_state),
            offset_of!(GdnPrefillArgs, q),
            offset_of!(GdnPrefillArgs, k),
            offset_of!(GdnPrefillArgs, v),
            offset_of!(GdnPrefillArgs, input_state),
            offset_of!(GdnPrefillArgs, alpha),
            offset_of!(GdnPrefillArgs, beta),
            offset_of!(GdnPrefillArgs, cu_seqlens),
            offset_of!(GdnPrefillArgs, workspace),
            offset_of!(GdnPrefillArgs, workspace_bytes),
            offset_of!(GdnPrefillArgs, total_tokens),
            offset_of!(GdnPrefillArgs, num_seqs),
            offset_of!(GdnPrefillArgs, num_qk_heads),
            offset_of!(GdnPrefillArgs, num_v_heads),
            offset_of!(GdnPrefillArgs, sm_count),
            offset_of!(GdnPrefillArgs, scale),
            offset_of!(GdnPrefillArgs, reserved),
            offset_of!(GdnPrefillArgs, stream),
            size_of::<GdnPrefillArgs>(),
        ];
        // SAFETY: a plain immutable array defined by the linked launcher.
        let c = unsafe { gdn_prefill_args_layout };
        for (i, (r, c)) in rust.iter().zip(c.iter()).enumerate() {
            assert_eq!(
                *r as u64, *c,
                "field #{i} of gdn_prefill_args: Rust offset {r}, C offset {c}"
            );
        }
    }

    #[test]
    fn linked_launcher_speaks_our_abi_version() {
        // SAFETY: no arguments, returns a constant.
        assert_eq!(unsafe { gdn_abi_version() }, GDN_ABI_VERSION);
    }

    #[test]
    fn launcher_rejects_bad_struct_headers_without_a_gpu() {
        // These checks run before any CUDA call, so they work on CI machines.
        for (launch, last_error) in [PREFILL_SM90, PREFILL_SM90_VSPLIT] {
            let mut args: GdnPrefillArgs = unsafe { std::mem::zeroed() };
            // SAFETY: args is a valid struct; the launcher only reads it.
            assert_eq!(unsafe { launch(std::ptr::null()) }, 3);
            args.abi_version = GDN_ABI_VERSION + 1;
            args.struct_size = size_of::<GdnPrefillArgs>() as u32;
            assert_eq!(unsafe { launch(&args) }, 1, "{}", last_error());
            args.abi_version = GDN_ABI_VERSION;
            args.struct_size -= 8;
            assert_eq!(unsafe { launch(&args) }, 2, "{}", last_error());
            args.struct_size += 8;
            assert_eq!(
                unsafe { launch(&args) },
                3,
                "null pointers: {}",
                last_error()
            );
            assert!(last_error().contains("NULL"));
        }
    }

    #[test]
    fn launcher_refuses_overlapping_buffers_before_launching() {
        // Fake, never dereferenced addresses: the overlap checks run first.
        let base = 0x7000_0000_0000usize;
        let (t, n, hq, hv) = (10i64, 1i32, 2i32, 4i32);
        let state_bytes = n as usize * hv as usize * 128 * 128 * 4;
        let mut args: GdnPrefillArgs = unsafe { std::mem::zeroed() };
        args.abi_version = GDN_ABI_VERSION;
        args.struct_size = size_of::<GdnPrefillArgs>() as u32;
        args.q = base as *const c_void;
        args.k = (base + 0x10_0000) as *const c_void;
        args.v = (base + 0x20_0000) as *const c_void;
        args.output = (base + 0x30_0000) as *mut c_void;
        args.output_state = (base + 0x40_0000) as *mut f32;
        args.alpha = (base + 0x80_0000) as *const f32;
        args.beta = (base + 0x90_0000) as *const f32;
        args.cu_seqlens = (base + 0xA0_0000) as *const i64;
        args.workspace = (base + 0xB0_0000) as *mut c_void;
        args.workspace_bytes = 1 << 20;
        (
            args.total_tokens,
            args.num_seqs,
            args.num_qk_heads,
            args.num_v_heads,
            args.sm_count,
        ) = (t, n, hq, hv, 132);
        for (launch, last_error) in [PREFILL_SM90, PREFILL_SM90_VSPLIT] {
            let mut args = args;
            // Initial state starting inside the output state.
            args.input_state = (base + 0x40_0000 + state_bytes / 2) as *const f32;
            // SAFETY: the launcher only reads the struct before refusing it.
            assert_eq!(unsafe { launch(&args) }, 4, "{}", last_error());
            assert!(last_error().contains("input_state overlaps"));
            // Output overlapping v.
            args.input_state = std::ptr::null();
            args.output = (base + 0x20_0000 + 256) as *mut c_void;
            assert_eq!(unsafe { launch(&args) }, 4, "{}", last_error());
            assert!(last_error().contains("output overlaps"));
        }
    }

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
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4, "{}", dsl_last_error());
        a = dsl_args(2);
        a.cp_chunk_len = 100;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(dsl_last_error().contains("multiple of 64"));
        // SM100 bakes in 148 SMs and Hqk 16.
        let mut a = dsl_args(3);
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(dsl_last_error().contains("148"), "{}", dsl_last_error());
        a.sm_count = 148;
        a.num_qk_heads = 8;
        a.num_v_heads = 16;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(dsl_last_error().contains("Hqk 16"), "{}", dsl_last_error());
        // SM100 needs the int32 cu_seqlens.
        let mut a = dsl_args(3);
        a.sm_count = 148;
        a.cu_seqlens_i32 = std::ptr::null();
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 3);
        // Overlaps and a short workspace.
        let mut a = dsl_args(1);
        a.output = a.v as *mut c_void;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 4);
        assert!(dsl_last_error().contains("output overlaps"));
        let mut a = dsl_args(1);
        a.workspace_bytes = 132 * 128 - 1;
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 5);
        // A family never loaded is refused, not launched.
        let a = dsl_args(4);
        assert_eq!(unsafe { gdn_dsl_prefill(&a) }, 6);
        assert!(
            dsl_last_error().contains("not loaded"),
            "{}",
            dsl_last_error()
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

    #[test]
    fn attention_field_offsets_match_the_c_header() {
        let rust = [
            offset_of!(GdnAttentionArgs, abi_version),
            offset_of!(GdnAttentionArgs, struct_size),
            offset_of!(GdnAttentionArgs, out),
            offset_of!(GdnAttentionArgs, q),
            offset_of!(GdnAttentionArgs, k_cache),
            offset_of!(GdnAttentionArgs, v_cache),
            offset_of!(GdnAttentionArgs, block_table),
            offset_of!(GdnAttentionArgs, qo_indptr),
            offset_of!(GdnAttentionArgs, kv_len),
            offset_of!(GdnAttentionArgs, workspace),
            offset_of!(GdnAttentionArgs, workspace_bytes),
            offset_of!(GdnAttentionArgs, num_seqs),
            offset_of!(GdnAttentionArgs, num_qo_heads),
            offset_of!(GdnAttentionArgs, num_kv_heads),
            offset_of!(GdnAttentionArgs, page_size),
            offset_of!(GdnAttentionArgs, max_blocks),
            offset_of!(GdnAttentionArgs, sm_scale),
            offset_of!(GdnAttentionArgs, stream),
        ];
        // SAFETY: a plain immutable array defined by the linked launcher.
        let c = unsafe { gdn_attention_args_layout };
        for (i, (r, c)) in rust.iter().zip(c.iter()).enumerate() {
            assert_eq!(
                *r as u64, *c,
                "field #{i} of gdn_attention_args: Rust offset {r}, C offset {c}"
            );
        }
        assert_eq!(c.len(), rust.len());
        // SAFETY: no arguments, returns a constant.
        assert_eq!(
            unsafe { gdn_attention_abi_version() },
            GDN_ATTENTION_ABI_VERSION
        );
    }

    /// A well-formed call (2 sequences: 5 queries over 21 keys, 3 over 3;
    /// Hq 16, Hkv 4, pages of 16, 2 a row) on fake, never dereferenced
    /// device addresses; the host arrays are real.
    fn attention_args(qo: &[i32; 3], kv: &[i32; 2]) -> GdnAttentionArgs {
        let base = 0x7000_0000_0000usize;
        let mut a: GdnAttentionArgs = unsafe { std::mem::zeroed() };
        a.abi_version = GDN_ATTENTION_ABI_VERSION;
        a.struct_size = size_of::<GdnAttentionArgs>() as u32;
        a.q = base as *const c_void;
        a.out = (base + 0x1000_0000) as *mut c_void;
        a.k_cache = (base + 0x2000_0000) as *const c_void;
        a.v_cache = (base + 0x3000_0000) as *const c_void;
        a.block_table = (base + 0x4000_0000) as *const i32;
        a.workspace = (base + 0x5000_0000) as *mut c_void;
        a.workspace_bytes = 1 << 20;
        a.qo_indptr = qo.as_ptr();
        a.kv_len = kv.as_ptr();
        (a.num_seqs, a.num_qo_heads, a.num_kv_heads) = (2, 16, 4);
        (a.page_size, a.max_blocks, a.sm_scale) = (16, 2, 0.0625);
        a
    }

    #[test]
    fn attention_launcher_refuses_bad_calls_before_any_cuda_call() {
        let (qo, kv) = ([0, 5, 8], [21, 3]);
        let code = |a: &GdnAttentionArgs| {
            // SAFETY: every refusal below happens before a pointer is dereferenced.
            let c = unsafe { gdn_attention_sm90(a) };
            (c, attention_last_error())
        };
        // SAFETY: NULL is refused first.
        assert_eq!(unsafe { gdn_attention_sm90(std::ptr::null()) }, 3);
        let mut a = attention_args(&qo, &kv);
        a.abi_version += 1;
        assert_eq!(code(&a).0, 1);
        let mut a = attention_args(&qo, &kv);
        a.struct_size -= 8;
        assert_eq!(code(&a).0, 2);
        let mut a = attention_args(&qo, &kv);
        a.block_table = std::ptr::null();
        assert_eq!(code(&a).0, 3);
        let mut a = attention_args(&qo, &kv);
        a.num_qo_heads = 18;
        assert_eq!(code(&a).0, 4);
        // Fewer keys than queries, and more keys than the pages hold.
        let bad_kv = [4, 3];
        let (c, e) = code(&attention_args(&qo, &bad_kv));
        assert_eq!(c, 4, "{e}");
        assert!(e.contains("sequence 0: 5 queries over 4 keys"), "{e}");
        let bad_kv = [21, 33];
        let (c, e) = code(&attention_args(&qo, &bad_kv));
        assert_eq!(c, 4, "{e}");
        assert!(e.contains("sequence 1"), "{e}");
        let bad_qo = [0, 5, 5];
        assert_eq!(code(&attention_args(&bad_qo, &kv)).0, 4);
        // Output over q.
        let mut a = attention_args(&qo, &kv);
        a.out = (a.q as usize + 256) as *mut c_void;
        let (c, e) = code(&a);
        assert_eq!(c, 4);
        assert!(e.contains("out overlaps q"), "{e}");
    }

    #[test]
    fn attention_workspace_covers_flashinfers_schedule() {
        // SAFETY: pure function of its arguments.
        let bytes = |t, n, h, sm| unsafe { gdn_attention_sm90_workspace_bytes(t, n, h, sm) };
        // 8192 tokens, 1 sequence, 16 heads: 64 tiles x 16 heads = 1024 work
        // items; seven int32 arrays of them, work_indptr of 133, 16 slack.
        assert_eq!(bytes(8192, 1, 16, 132), 7 * 4096 + 544 + 16);
        // Two sequences of 1 and 129 tokens: tiles ceil(130 / 128) + 1 = 3.
        assert_eq!(bytes(130, 2, 4, 132), 7 * 48 + 544 + 16);
        assert_eq!(bytes(0, 1, 16, 132), 0);
        assert_eq!(bytes(8, 1, 16, 0), 0);
    }

    #[test]
    fn workspace_is_one_tma_descriptor_per_sm() {
        // SAFETY: pure function of its argument.
        assert_eq!(unsafe { gdn_prefill_sm90_workspace_bytes(132) }, 132 * 128);
        assert_eq!(unsafe { gdn_prefill_sm90_workspace_bytes(0) }, 0);
    }
}
