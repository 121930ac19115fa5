//! `gdn_attention_abi.h`: FlashInfer 0.6.13's SM90 paged prefill attention
//! (FA3), the bundle's `flashinfer_attention_sm90` unit.

use std::ffi::{c_char, c_void};

use crate::shared::c_library::CLibrary;

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

pub(crate) const ATTENTION: CLibrary = CLibrary {
    name: "FlashInfer attention launcher",
    abi_version: GDN_ATTENTION_ABI_VERSION,
    linked_abi_version: gdn_attention_abi_version,
    last_error: gdn_attention_last_error,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
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
            (c, ATTENTION.last_error())
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
}
