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
//! The sources are grouped by kernel family, as `cuda/` is by file prefix;
//! each family folder holds its ops, its C ABI bindings and its selection
//! rule:
//! - `deltanet/`: the GDN prefill ([`GdnPrefill`]: backend rule, FlashInfer
//!   and CuTe DSL bindings, launches), the recurrent state, the DeltaNet
//!   conv/decode ops and the CPU [`oracle`];
//! - `attention/`: paged attention, the kernel rule and FA3's binding;
//! - `moe/`: the routed experts and their path rule;
//! - `gemm/`: linear layers (cuBLAS, skinny, fused SwiGLU) and their route;
//! - `sampling/`: the device sampler and allowed-token masks;
//! - `model_ops/`: the shared [`ModelOps`] context (kernel table, stream,
//!   argument checks) and the ops outside any family; each family adds its
//!   methods in its own `impl ModelOps`;
//! - `shared/`: errors, the C libraries' checks, cubin lookup, the batch.
//!
//! Families use `shared/` and `model_ops/`, not each other; the context in
//! turn names only `attention/select.rs` (the request and the FA3 probe,
//! which use `shared/` alone), so no module reaches itself back.
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
mod model_check;
mod model_ops;
mod moe;
mod sampling;
mod shared;

mod bundle_embed {
    include!(concat!(env!("OUT_DIR"), "/bundle_embed.rs"));
}
// build.rs writes the bundle's DSL table with `crate::dsl::DslFamilyInfo`
// paths; this name keeps them resolving (build.rs is locked by hash).
use deltanet::prefill::dsl;

pub use attention::{AttentionKernel, AttentionRequest, AttentionShape};
pub use deltanet::oracle::{self, GdnGeometry, HEAD_DIM};
pub use deltanet::{
    flashinfer_would_use_cp, prefer_context_parallel, Backend, BackendRequest, DeltaNetInputs,
    DeltaNetShape, DeltaNetWeights, DispatchDecision, GdnPrefill, HostState, PrefillBuffers,
    RecurrentState, StateDtype, UnknownBackend,
};
pub use gemm::{
    route_in, swiglu_route, Gemm, GemmOutput, GemmShape, LinearRoute, SkinnyConfig, SkinnyLinear,
    SkinnyRule, SwigluGemm, SwigluRequest, SwigluRoute, SKINNY_MAX_ROWS, SKINNY_RULES,
    SWIGLU_FUSED_MIN_ROWS,
};
pub use model_ops::ModelOps;
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
