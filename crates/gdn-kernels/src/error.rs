use std::fmt;

/// Everything the GDN op can refuse or fail at. Messages name the argument,
/// the rule and the value.
#[derive(Debug)]
pub enum GdnError {
    /// An argument violates the op's contract (shape, length, geometry).
    InvalidArgument { arg: &'static str, message: String },
    /// The requested backend cannot run this GPU/geometry.
    Unsupported {
        backend: &'static str,
        reason: String,
    },
    /// The linked launcher speaks another ABI version (a bad artifact).
    AbiMismatch { expected: u32, actual: u32 },
    /// The FlashInfer launcher returned a non-zero status.
    Launcher { status: i32, detail: String },
    /// A CUDA driver call failed.
    Cuda(cudarc::driver::DriverError),
    /// A model op (norm, conv, attention, ...) refused its arguments.
    Op { op: &'static str, message: String },
    /// cuBLAS failed (or could not be loaded).
    Blas(String),
}

impl fmt::Display for GdnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GdnError::InvalidArgument { arg, message } => write!(f, "gdn_prefill: {arg}: {message}"),
            GdnError::Unsupported { backend, reason } => write!(f, "gdn_prefill: backend {backend} unsupported: {reason}"),
            GdnError::AbiMismatch { expected, actual } => write!(
                f,
                "gdn_prefill: the linked launcher speaks C ABI version {actual}, these bindings speak {expected}; rebuild the bundle"
            ),
            GdnError::Launcher { status, detail } => write!(f, "gdn_prefill: FlashInfer launcher failed with status {status}: {detail}"),
            GdnError::Cuda(e) => write!(f, "gdn_prefill: CUDA error: {e}"),
            GdnError::Op { op, message } => write!(f, "{op}: {message}"),
            GdnError::Blas(e) => write!(f, "cuBLAS: {e}"),
        }
    }
}

impl std::error::Error for GdnError {}

impl From<cudarc::driver::DriverError> for GdnError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        GdnError::Cuda(e)
    }
}

pub(crate) fn invalid(arg: &'static str, message: impl Into<String>) -> GdnError {
    GdnError::InvalidArgument {
        arg,
        message: message.into(),
    }
}

pub(crate) fn op_error(op: &'static str, message: impl Into<String>) -> GdnError {
    GdnError::Op {
        op,
        message: message.into(),
    }
}
