//! `gdn_abi.h` and `gdn_vsplit_abi.h`: FlashInfer's C++ SM90 GDN prefill,
//! plain and with the value dimension split across two CTAs. Both take the
//! same argument struct and workspace.

use std::ffi::{c_char, c_void};

use crate::shared::c_library::CLibrary;

pub const GDN_ABI_VERSION: u32 = 1;

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

/// The plain launcher's library.
pub(crate) const FLASHINFER: CLibrary = CLibrary {
    name: "FlashInfer prefill launcher",
    abi_version: GDN_ABI_VERSION,
    linked_abi_version: gdn_abi_version,
    last_error: gdn_last_error,
};

/// The value-split launcher's library (the same ABI version, its own
/// error detail).
pub(crate) const FLASHINFER_VSPLIT: CLibrary = CLibrary {
    name: "FlashInfer value-split prefill launcher",
    abi_version: GDN_ABI_VERSION,
    linked_abi_version: gdn_abi_version,
    last_error: gdn_vsplit_last_error,
};

/// One of the two launchers behind `gdn_prefill_args`.
pub(crate) struct PrefillLauncher {
    pub launch: unsafe extern "C" fn(*const GdnPrefillArgs) -> i32,
    pub library: CLibrary,
}

pub(crate) const PREFILL_SM90: PrefillLauncher = PrefillLauncher {
    launch: gdn_prefill_sm90,
    library: FLASHINFER,
};
pub(crate) const PREFILL_SM90_VSPLIT: PrefillLauncher = PrefillLauncher {
    launch: gdn_prefill_sm90_vsplit,
    library: FLASHINFER_VSPLIT,
};

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
        for PrefillLauncher { launch, library } in [PREFILL_SM90, PREFILL_SM90_VSPLIT] {
            let last_error = || library.last_error();
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
        for PrefillLauncher { launch, library } in [PREFILL_SM90, PREFILL_SM90_VSPLIT] {
            let last_error = || library.last_error();
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
    fn workspace_is_one_tma_descriptor_per_sm() {
        // SAFETY: pure function of its argument.
        assert_eq!(unsafe { gdn_prefill_sm90_workspace_bytes(132) }, 132 * 128);
        assert_eq!(unsafe { gdn_prefill_sm90_workspace_bytes(0) }, 0);
    }
}
