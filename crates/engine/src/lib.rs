//! Continuous-batching engine for Qwen3.5 (no CUDA types: compiles and is
//! tested without a GPU).
//!
//! - [`Engine::start`] spawns the engine thread, which creates the
//!   [`Executor`] (the model runtime) and owns it; [`EngineHandle::submit`]
//!   validates and queues a [`GenerateRequest`] and returns its
//!   [`RequestStream`] of [`Event`]s. Dropping the stream aborts the request.
//!   The handle (`engine.rs`) and the engine thread (`worker.rs`) share
//!   only `protocol.rs`: the commands and the state both sides read.
//! - [`scheduler`]: one forward per step under a token budget; decodes,
//!   then chunked prefills in progress, then FCFS admission; preemption by
//!   recompute when KV pages run out.
//! - [`allocator`]: state slots and refcounted KV pages.
//! - [`prefix_cache`]: a trie over full KV pages with recurrent-state
//!   snapshots at exact positions (docs/prefix-caching.md); a hit resumes a
//!   request from a snapshot copied into its own slot.
//! - [`sampler`]: the CPU sampler (vLLM semantics, counter-based seeds).
//! - [`metrics`]: the vLLM-named Prometheus series.
//! - [`timeline`]: the request timeline (off by default): where a
//!   request's time to first token goes, step by step.

pub mod allocator;
mod config;
mod engine;
pub mod executor;
pub mod metrics;
pub mod prefix_cache;
mod protocol;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod timeline;
mod worker;

pub use config::{ConfigError, EngineConfig};
pub use engine::{Engine, EngineHandle, EngineStartError, RequestStream};
pub use executor::{
    check_row_snapshots, in_row_order, split_rows, CacheGeometry, ExecError, Executor, PageId,
    RowSnapshot, RowSnapshotError, SampleSeed, SampleSpec, SampledToken, SlotId, SnapshotGeometry,
    SnapshotId, StepRow,
};
pub use protocol::EngineStats;
pub use request::{
    EngineState, Event, FinishReason, GenerateRequest, InvalidParam, RequestId, SamplingParams,
    StopParams, SubmitError, TokenEvent, Usage,
};
pub use timeline::{EngineTimeline, StepMark, StepPhases};
