//! The crate's errors, one type per phase:
//! - [`LoadError`]: bringing a model up: config.json, the safetensors
//!   checkpoint, the tokenizer files, an executor's sizing, and the device
//!   work of setting the model up. Each names the file, tensor or field.
//! - [`RunError`]: a forward, a step, a cache operation or a tokenizer call
//!   on a loaded model.
//! - [`StepError`]: a GPU step refused before any device work, or failed
//!   after it (a [`RunError`]).
//! - [`DeviceError`]: their common cause on the GPU: a `gdn_kernels` op
//!   (its [`gdn_kernels::GdnError`] says which op and how) or a CUDA driver
//!   call.
//!
//! Every message is complete on its own (it ends with its cause's text):
//! the engine's `ExecError` and the server carry `to_string()`. The cause
//! is also kept as `source()`, so callers can inspect it (a
//! `GdnError`'s op and kind, a `DriverError`'s code).

use std::path::{Path, PathBuf};

use cudarc::driver::DriverError;
use gdn_kernels::GdnError;

/// A failure on the GPU.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A `gdn_kernels` op refused its arguments or failed (its message
    /// leads with the op).
    #[error("{0}")]
    Kernel(#[from] GdnError),
    /// A CUDA driver call of this crate's own failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// This machine has no CUDA driver library.
    #[error("no CUDA driver library (libcuda) on this machine")]
    NoDriver,
    /// A stream capture ended without a graph.
    #[error("stream capture produced no graph")]
    NoGraph,
}

/// Why a model could not be loaded or set up.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("I/O error: {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `what`: the file (and part of it) that did not parse.
    #[error("invalid JSON: {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A JSON file parsed but does not say what it must.
    #[error("invalid JSON: {}: {message}", path.display())]
    JsonContent { path: PathBuf, message: String },
    #[error("unsupported config: {0}")]
    UnsupportedConfig(String),
    #[error("tensor {tensor} is missing from the checkpoint")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor} has shape {actual:?}, expected {expected:?}")]
    WrongShape {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// A MoE layer whose experts are stored both as fused 3-D tensors and
    /// per expert (a checkpoint uses one layout per layer).
    #[error(
        "tensors {fused} and {per_expert} store one layer's experts in two layouts \
         (fused 3-D tensors and per-expert matrices): a checkpoint must use one"
    )]
    MixedExpertLayouts { fused: String, per_expert: String },
    #[error("tensor {tensor} has dtype {actual}, expected BF16, F16 or F32")]
    WrongDtype { tensor: String, actual: String },
    #[error("safetensors: {}: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("tokenizer: {}: {source}", path.display())]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    /// An executor's or cache's sizing (slots, pages, memory share) that
    /// cannot work.
    #[error("invalid sizing: {0}")]
    Sizing(String),
    /// Setting the model up on the GPU failed (kernel modules, cuBLAS,
    /// uploads, cache memory).
    #[error("GPU: {0}")]
    Device(#[from] DeviceError),
}

impl LoadError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> LoadError {
        LoadError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<GdnError> for LoadError {
    fn from(e: GdnError) -> Self {
        LoadError::Device(e.into())
    }
}

impl From<DriverError> for LoadError {
    fn from(e: DriverError) -> Self {
        LoadError::Device(e.into())
    }
}

/// Why a forward, step, cache operation or tokenizer call on a loaded
/// model failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The call's input is not something the model can run.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("GPU: {0}")]
    Device(#[from] DeviceError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[source] tokenizers::Error),
}

impl From<GdnError> for RunError {
    fn from(e: GdnError) -> Self {
        RunError::Device(e.into())
    }
}

impl From<DriverError> for RunError {
    fn from(e: DriverError) -> Self {
        RunError::Device(e.into())
    }
}

/// Why a step did not run, or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// Refused before any device work: every slot and page is unchanged.
    #[error("step refused: {0}")]
    Refused(String),
    /// Failed once device work was queued: the states of the step's slots
    /// (and the KV positions it writes) are undefined, other slots intact.
    #[error("step failed: {0}")]
    Failed(#[from] RunError),
}

// Every error past the checks is a failure of queued device work.
impl From<DeviceError> for StepError {
    fn from(e: DeviceError) -> Self {
        StepError::Failed(e.into())
    }
}

impl From<gdn_kernels::GdnError> for StepError {
    fn from(e: gdn_kernels::GdnError) -> Self {
        StepError::Failed(e.into())
    }
}

impl From<cudarc::driver::DriverError> for StepError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        StepError::Failed(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn kernel_errors_stay_causes_with_their_op() {
        let kernel = gdn_kernels::oracle::gated_delta_rule_reference(
            &gdn_kernels::oracle::ReferenceInputs {
                geometry: gdn_kernels::GdnGeometry {
                    num_qk_heads: 1,
                    num_v_heads: 1,
                    head_dim: 0,
                },
                q: &[],
                k: &[],
                v: &[],
                alpha: &[],
                beta: &[],
                cu_seqlens: &[0],
                initial_state: None,
                scale: 1.0,
            },
        )
        .err()
        .expect("head dim 0 is refused");
        let text = kernel.to_string();
        let e = RunError::from(kernel);
        assert_eq!(e.to_string(), format!("GPU: {text}"));
        // The chain: RunError -> DeviceError -> the GdnError.
        let device = e.source().expect("the device error");
        assert!(device.downcast_ref::<DeviceError>().is_some());
        let gdn = device.source().expect("the kernel error");
        let gdn = gdn.downcast_ref::<GdnError>().expect("a GdnError");
        assert_eq!(gdn.op(), gdn_kernels::Op::GdnReference);
        assert!(LoadError::from(DeviceError::NoDriver)
            .to_string()
            .contains("no CUDA driver library"));
    }

    #[test]
    fn load_errors_name_the_file() {
        let e = LoadError::io(
            Path::new("/m/config.json"),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert!(
            e.to_string().starts_with("I/O error: /m/config.json: "),
            "{e}"
        );
        assert!(e.source().is_some());
    }
}
