//! Continuous-batching engine for Qwen3.5 (no CUDA types: compiles and is
//! tested without a GPU). The API contract: /work/notes/engine-api.md during
//! development; the crate docs below once stable.

pub mod executor;
pub mod request;

pub use executor::{
    CacheGeometry, ExecError, Executor, PageId, SampleSeed, SampleSpec, SampledToken, SlotId,
    StepRow,
};
pub use request::{
    EngineState, Event, FinishReason, GenerateRequest, RequestId, SamplingParams, StopParams,
    SubmitError, TokenEvent, Usage,
};
