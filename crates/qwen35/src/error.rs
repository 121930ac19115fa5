use std::fmt;
use std::path::Path;

pub type Result<T> = std::result::Result<T, Error>;

/// Loading and running errors; each names the file or tensor involved.
#[derive(Debug)]
pub enum Error {
    Io(String),
    Json(String),
    UnsupportedConfig(String),
    MissingTensor(String),
    WrongShape {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    WrongDtype {
        tensor: String,
        actual: String,
    },
    Safetensors(String),
    Tokenizer(String),
    InvalidInput(String),
    /// A GPU op, cuBLAS or the CUDA driver failed (or refused an argument).
    Gpu(String),
}

impl From<gdn_kernels::GdnError> for Error {
    fn from(e: gdn_kernels::GdnError) -> Self {
        Error::Gpu(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Gpu(format!("CUDA driver: {e}"))
    }
}

impl Error {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> Error {
        Error::Io(format!("{}: {e}", path.display()))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(m) => write!(f, "I/O error: {m}"),
            Error::Json(m) => write!(f, "invalid JSON: {m}"),
            Error::UnsupportedConfig(m) => write!(f, "unsupported config: {m}"),
            Error::MissingTensor(t) => write!(f, "tensor {t} is missing from the checkpoint"),
            Error::WrongShape {
                tensor,
                expected,
                actual,
            } => {
                write!(
                    f,
                    "tensor {tensor} has shape {actual:?}, expected {expected:?}"
                )
            }
            Error::WrongDtype { tensor, actual } => {
                write!(
                    f,
                    "tensor {tensor} has dtype {actual}, expected BF16, F16 or F32"
                )
            }
            Error::Safetensors(m) => write!(f, "safetensors: {m}"),
            Error::Tokenizer(m) => write!(f, "tokenizer: {m}"),
            Error::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Error::Gpu(m) => write!(f, "GPU: {m}"),
        }
    }
}

impl std::error::Error for Error {}
