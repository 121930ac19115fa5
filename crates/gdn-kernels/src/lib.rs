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

mod attention;
mod deltanet;
mod gemm;
mod model_ops;
mod moe;
mod sampling;
mod shared;

mod bundle_embed {
    include!(concat!(env!("OUT_DIR"), "/bundle_embed.rs"));
}

pub use attention::{AttentionKernel, AttentionRequest};
pub use deltanet::oracle::{self, GdnGeometry, HEAD_DIM};
pub use deltanet::{
    flashinfer_would_use_cp, prefer_context_parallel, Backend, BackendRequest, DispatchDecision,
    GdnPrefill, HostState, PrefillBuffers, RecurrentState, StateDtype, UnknownBackend,
};
pub use gemm::{
    route_in, swiglu_route, Gemm, GemmOutput, GemmShape, LinearRoute, SkinnyConfig, SkinnyLinear,
    SkinnyRule, SwigluGemm, SwigluRequest, SwigluRoute, SKINNY_MAX_ROWS, SKINNY_RULES,
    SWIGLU_FUSED_MIN_ROWS,
};
pub use model_ops::{
    AttentionShape, DeltaNetInputs, DeltaNetShape, DeltaNetWeights, ModelOps,
};
pub use moe::{
    moe_path, MoeExperts, MoePath, MoeScratch, MoeShape, SharedExpert, MOE_DIRECT_MAX_TOKENS,
    MOE_MAX_EXPERTS, MOE_MAX_TOP_K,
};
pub use sampling::{
    mask_words, DeviceSampler, MaskUpload, RowSampling, SampledRow, TokenAdjustment, TokenMasks,
    MAX_TOP_LOGPROBS,
};
pub use shared::batch::{BatchLayout, DeviceBatch, Padding};
pub use shared::error::{ErrorKind, GdnError, Ineligible, Op};

/// The C ABI version these bindings speak; checked against the linked launcher.
pub const ABI_VERSION: u32 = deltanet::prefill::ffi::GDN_ABI_VERSION;

/// `path=sha256` of the locked FlashInfer cubins linked into this build.
pub fn flashinfer_cubin_identity() -> &'static str {
    bundle_embed::FLASHINFER_CUBINS
}
