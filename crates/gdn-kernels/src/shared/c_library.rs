//! What the bundle's C libraries share. Each family binds its own C ABI
//! next to its op: `deltanet/prefill/ffi.rs` (`gdn_abi.h`,
//! `gdn_vsplit_abi.h`: FlashInfer's C++ GDN prefill),
//! `deltanet/prefill/dsl_ffi.rs` (`gdn_dsl_abi.h`: the CuTe DSL GDN
//! kernels), `attention/ffi.rs` (`gdn_attention_abi.h`: FlashInfer's SM90
//! paged attention) and `gemm/swiglu_ffi.rs` (`gdn_swiglu_abi.h`: quack's
//! SwiGLU GEMM). Hand-written; each binding's layout test compares every
//! field offset with the C compiler's own `offsetof`, exported by the
//! library.
//!
//! Every library reports failures the same way (a non-zero status and a
//! thread-local message) and exports its ABI version: [`CLibrary`] turns
//! both into [`GdnError`]s, so no wrapper checks a status by hand.

use std::ffi::{c_char, CStr};

use crate::shared::error::{ErrorKind, GdnError, Op};

/// The status every launcher returns on success.
pub const GDN_OK: i32 = 0;

/// One C library of the bundle as the safe wrappers see it: its name in
/// messages, the ABI version these bindings speak, and its exported version
/// and last-error functions.
pub(crate) struct CLibrary {
    pub name: &'static str,
    pub abi_version: u32,
    pub(crate) linked_abi_version: unsafe extern "C" fn() -> u32,
    pub(crate) last_error: unsafe extern "C" fn() -> *const c_char,
}

impl CLibrary {
    /// The detail of the library's last failure on this thread.
    pub fn last_error(&self) -> String {
        // SAFETY: every library's last-error function returns a pointer to
        // a NUL-terminated thread-local buffer, never NULL.
        unsafe { CStr::from_ptr((self.last_error)()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The ABI version of the linked library.
    pub fn linked_abi_version(&self) -> u32 {
        // SAFETY: no arguments; returns the library's compiled-in constant.
        unsafe { (self.linked_abi_version)() }
    }

    /// An error of `op` unless the linked library speaks our ABI version.
    pub fn check_abi(&self, op: Op) -> Result<(), GdnError> {
        let actual = self.linked_abi_version();
        if actual == self.abi_version {
            return Ok(());
        }
        Err(GdnError::new(
            op,
            ErrorKind::AbiMismatch {
                library: self.name,
                expected: self.abi_version,
                actual,
            },
        ))
    }

    /// `Ok` for [`GDN_OK`], else an error of `op` with the status and the
    /// library's message.
    pub fn check(&self, op: Op, status: i32) -> Result<(), GdnError> {
        if status == GDN_OK {
            return Ok(());
        }
        Err(GdnError::new(
            op,
            ErrorKind::Launcher {
                library: self.name,
                status,
                detail: self.last_error(),
            },
        ))
    }
}
