//! What every kernel family uses: the error type, the C libraries' common
//! status and version checks, the cubin lookup, and the packed batch the
//! model ops index by.

pub(crate) mod batch;
pub(crate) mod c_library;
pub(crate) mod cubins;
pub(crate) mod error;
