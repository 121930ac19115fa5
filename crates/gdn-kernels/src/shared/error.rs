//! The crate's one error type: which semantic op failed ([`Op`]) and how
//! ([`ErrorKind`]), with the CUDA or cuBLAS error underneath kept as the
//! source.
//!
//! Every message is complete on its own: it starts with the op, names the
//! argument, the rule and the value, and ends with the underlying error's
//! text. Callers above (the runtime, the engine, the server) log and return
//! `to_string()`, so nothing is lost where they do; `source()` hands the
//! same underlying error out as a value for callers that inspect it.

use std::fmt;

use cudarc::cublas::result::CublasError;
use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;

/// The semantic op an error comes from; its name leads every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`crate::GdnPrefill`]: the chunked GDN prefill on any backend.
    GdnPrefill,
    /// [`crate::deltanet::oracle::gated_delta_rule_reference`], the CPU oracle.
    GdnReference,
    /// [`crate::Gemm::linear`] and the cuBLAS handle behind it.
    Linear,
    /// [`crate::SkinnyLinear`], the few-row linear kernels.
    SkinnyLinear,
    /// [`crate::SwigluGemm`] and [`crate::Gemm::gate_up_swiglu`].
    SwigluGemm,
    /// [`crate::DeviceBatch`]: checking and uploading a step's batch.
    Batch,
    /// Loading [`crate::ModelOps`]' kernels.
    ModelKernels,
    /// [`crate::ModelOps::check_model`]: a model's shapes against the GPU.
    CheckModel,
    Embedding,
    AddRmsNorm,
    SiluMul,
    /// [`crate::ModelOps::move_state`]: state slots to a packed buffer and back.
    MoveState,
    GatherLastTokens,
    /// The random fills of benchmark weights.
    FillUniform,
    /// [`crate::DeltaNetShape::check`].
    DeltaNet,
    DeltaNetConv,
    DeltaNetDecode,
    DeltaNetDecodeFused,
    DeltaNetOutNorm,
    /// Paged attention (ours or FlashInfer's), and [`crate::AttentionShape::check`].
    Attention,
    AttentionPrep,
    /// [`crate::ModelOps::moe_experts`], [`crate::MoeScratch`] and
    /// [`crate::MoeShape::check`]: the routed experts of a MoE layer.
    MoeExperts,
    /// [`crate::DeviceSampler`].
    SampleRows,
}

impl Op {
    /// The op's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Op::GdnPrefill => "gdn_prefill",
            Op::GdnReference => "gdn_reference",
            Op::Linear => "linear",
            Op::SkinnyLinear => "skinny_linear",
            Op::SwigluGemm => "swiglu_gemm",
            Op::Batch => "batch",
            Op::ModelKernels => "model_kernels",
            Op::CheckModel => "check_model",
            Op::Embedding => "embedding",
            Op::AddRmsNorm => "add_rmsnorm",
            Op::SiluMul => "silu_mul",
            Op::MoveState => "move_state",
            Op::GatherLastTokens => "gather_last_tokens",
            Op::FillUniform => "fill_uniform",
            Op::DeltaNet => "deltanet",
            Op::DeltaNetConv => "deltanet_conv",
            Op::DeltaNetDecode => "deltanet_decode",
            Op::DeltaNetDecodeFused => "deltanet_decode_fused",
            Op::DeltaNetOutNorm => "deltanet_out_norm",
            Op::Attention => "attention",
            Op::AttentionPrep => "attention_prep",
            Op::MoeExperts => "moe_experts",
            Op::SampleRows => "sample_rows",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an op failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument violates the op's contract (shape, length, range).
    #[error("{arg}: {message}")]
    InvalidArgument { arg: &'static str, message: String },
    /// The backend or kernel cannot run on this GPU or for this geometry.
    #[error("backend {backend} unsupported: {reason}")]
    Unsupported {
        backend: &'static str,
        reason: String,
    },
    /// The linked C library speaks another ABI version (a bad artifact).
    #[error(
        "the linked {library} speaks C ABI version {actual}, these bindings speak {expected}; rebuild the bundle"
    )]
    AbiMismatch {
        library: &'static str,
        expected: u32,
        actual: u32,
    },
    /// A C launcher of the bundle returned a non-zero status.
    #[error("{library} failed with status {status}: {detail}")]
    Launcher {
        library: &'static str,
        status: i32,
        detail: String,
    },
    /// The device ran out of memory.
    #[error("out of device memory: {0}")]
    OutOfMemory(#[source] DriverError),
    /// Any other CUDA driver failure.
    #[error("CUDA error: {0}")]
    Cuda(#[source] DriverError),
    /// cuBLAS failed (or could not be loaded).
    #[error("cuBLAS {call}: {source}")]
    Blas {
        /// What was called, with its shape.
        call: String,
        #[source]
        source: CublasError,
    },
}

/// An op's failure: `"{op}: {kind}"`.
#[derive(Debug)]
pub struct GdnError {
    op: Op,
    kind: ErrorKind,
}

impl GdnError {
    pub fn new(op: Op, kind: ErrorKind) -> Self {
        GdnError { op, kind }
    }

    /// The op that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// How it failed.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// How it failed, by value (to match on its fields).
    pub fn into_kind(self) -> ErrorKind {
        self.kind
    }

    /// A driver error of `op`, out-of-memory told apart.
    pub fn cuda(op: Op, e: DriverError) -> Self {
        let kind = match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::OutOfMemory(e),
            _ => ErrorKind::Cuda(e),
        };
        GdnError::new(op, kind)
    }
}

impl fmt::Display for GdnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.kind)
    }
}

impl std::error::Error for GdnError {
    /// The CUDA or cuBLAS error underneath, if any (the kind's own text is
    /// this error's message, so the chain does not repeat it).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}

/// Why a backend or kernel cannot run on a GPU or geometry: the reason a
/// dispatch decision records when it falls back, and the detail of
/// [`ErrorKind::Unsupported`] when nothing can run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{backend}: {reason}")]
pub struct Ineligible {
    pub backend: &'static str,
    pub reason: String,
}

impl Ineligible {
    pub(crate) fn new(backend: &'static str, reason: impl Into<String>) -> Self {
        Ineligible {
            backend,
            reason: reason.into(),
        }
    }

    /// The error of `op` when this is why it cannot run.
    pub fn into_error(self, op: Op) -> GdnError {
        GdnError::new(
            op,
            ErrorKind::Unsupported {
                backend: self.backend,
                reason: self.reason,
            },
        )
    }
}

/// `arg` of `op` violates the op's contract.
pub(crate) fn invalid(op: Op, arg: &'static str, message: impl Into<String>) -> GdnError {
    GdnError::new(
        op,
        ErrorKind::InvalidArgument {
            arg,
            message: message.into(),
        },
    )
}

/// Names the op of a failed CUDA driver call: `call().during(OP)?`.
pub(crate) trait During<T> {
    fn during(self, op: Op) -> Result<T, GdnError>;
}

impl<T> During<T> for Result<T, DriverError> {
    fn during(self, op: Op) -> Result<T, GdnError> {
        self.map_err(|e| GdnError::cuda(op, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn messages_lead_with_the_op_and_keep_the_cause() {
        let e = invalid(Op::AddRmsNorm, "weight", "expected 4 elements, got 3");
        assert_eq!(
            e.to_string(),
            "add_rmsnorm: weight: expected 4 elements, got 3"
        );
        assert!(e.source().is_none());
        // (A DriverError's text comes from libcuda: not formatted here.)
        let oom = GdnError::cuda(
            Op::GdnPrefill,
            DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        );
        assert!(matches!(oom.kind(), ErrorKind::OutOfMemory(_)));
        let cause = oom.source().expect("the driver error");
        assert_eq!(
            cause.downcast_ref::<DriverError>().map(|e| e.0),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        let other = GdnError::cuda(
            Op::Attention,
            DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED),
        );
        assert!(matches!(other.kind(), ErrorKind::Cuda(_)));
        assert_eq!(other.op(), Op::Attention);
        let u = Ineligible::new("portable", "no cubin").into_error(Op::GdnPrefill);
        assert_eq!(
            u.to_string(),
            "gdn_prefill: backend portable unsupported: no cubin"
        );
    }
}
