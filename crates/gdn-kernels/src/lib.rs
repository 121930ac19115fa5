//! The GPU kernels of the Qwen3.5 runtime, from the verified bundle: Gated
//! DeltaNet (GDN) chunked prefill ([`GdnPrefill`]), our model kernels
//! ([`ModelOps`]: norms, DeltaNet conv/decode step, paged attention, SwiGLU),
//! sampling on the device ([`DeviceSampler`], with allowed-token masks:
//! [`TokenMasks`], [`MaskUpload`]) and linear layers ([`Gemm`]:
//! cuBLAS, or our skinny kernels ([`SkinnyLinear`]) for the few-row calls
//! its measured rule names; the MLP's gate/up + SwiGLU fused into one GEMM
//! on SM 9.0, [`SwigluGemm`]).
//!
//! This crate is the only place that knows the bundle: generated symbols, the
//! C ABI of the FlashInfer launcher, cubin names and the state layout the
//! kernels use. Callers see [`GdnPrefill`], a semantic op over typed cudarc
//! buffers, and [`Backend`], the dispatch decision it made. Every op fails
//! with a [`GdnError`]: the [`Op`] that failed and the [`ErrorKind`], with
//! the CUDA or cuBLAS error underneath as its source.
//!
//! Layouts (packed varlen batch of `N` sequences, `T` tokens in all, head dim 128):
//! - `q`, `k`: bf16 `[T, Hqk, 128]`, already L2-normalised by the caller
//!   (scale is applied by the op); `v`, `output`: bf16 `[T, Hv, 128]`
//! - `alpha` (linear decay `exp(g)`), `beta`: f32 `[T, Hv]`
//! - `cu_seqlens`: `[N + 1]` token offsets, on the host
//! - recurrent state: f32 `[N, Hv, 128 (v), 128 (k)]`, k contiguous (the
//!   slots of the model ops may store it in bf16: [`StateDtype`])
//! - `Hv = r * Hqk`; value head `h` reads q/k head `h / r`.

mod attention_select;
mod batch;
mod dispatch;
mod dsl;
mod error;
mod ffi;
mod gemm;
mod linear;
mod model_ops;
pub mod oracle;
mod prefill;
mod sampling;
mod skinny;
mod state;
mod swiglu;
mod token_masks;

mod bundle_embed {
    include!(concat!(env!("OUT_DIR"), "/bundle_embed.rs"));
}

pub use attention_select::{AttentionKernel, AttentionRequest};
pub use batch::{BatchLayout, DeviceBatch, Padding};
pub use dispatch::{
    prefer_context_parallel, Backend, BackendRequest, DispatchDecision, UnknownBackend,
};
pub use dsl::flashinfer_would_use_cp;
pub use error::{ErrorKind, GdnError, Ineligible, Op};
pub use gemm::{route_in, Gemm, LinearRoute, SkinnyRule, SKINNY_RULES};
pub use linear::{GemmOutput, GemmShape};
pub use model_ops::{
    moe_path, AttentionShape, DeltaNetInputs, DeltaNetShape, DeltaNetWeights, ModelOps, MoeExperts,
    MoePath, MoeScratch, MoeShape, SharedExpert, MOE_DIRECT_MAX_TOKENS, MOE_MAX_EXPERTS,
    MOE_MAX_TOP_K,
};
pub use oracle::{GdnGeometry, HEAD_DIM};
pub use prefill::{GdnPrefill, PrefillBuffers};
pub use sampling::{DeviceSampler, RowSampling, SampledRow, TokenAdjustment, MAX_TOP_LOGPROBS};
pub use skinny::{SkinnyConfig, SkinnyLinear, SKINNY_MAX_ROWS};
pub use state::{HostState, RecurrentState, StateDtype};
pub use swiglu::{swiglu_route, SwigluGemm, SwigluRequest, SwigluRoute, SWIGLU_FUSED_MIN_ROWS};
pub use token_masks::{mask_words, MaskUpload, TokenMasks};

/// The C ABI version these bindings speak; checked against the linked launcher.
pub const ABI_VERSION: u32 = ffi::prefill::GDN_ABI_VERSION;

/// `path=sha256` of the locked FlashInfer cubins linked into this build.
pub fn flashinfer_cubin_identity() -> &'static str {
    bundle_embed::FLASHINFER_CUBINS
}
