//! Continuous-batching engine for Qwen3.5 (no CUDA types: compiles and is
//! tested without a GPU).
//!
//! [`Engine::start`] spawns the engine thread, which creates the
//! [`Executor`] (the model runtime) and owns it; [`EngineHandle::submit`]
//! validates and queues a [`GenerateRequest`] and returns its
//! [`RequestStream`] of [`Event`]s. Dropping the stream aborts the request
//! ([`RequestStream::stop`] ends it as finished instead).
//!
//! Layout, one concept per file, dependencies pointing one way (down this
//! list's arrows; no module uses one that uses it):
//!
//! - `engine.rs`: the handle side ([`Engine`], [`EngineHandle`],
//!   [`RequestStream`]); `worker.rs`: the engine thread, which runs the
//!   steps and sends each request its events. Neither uses the other's
//!   items except [`Engine::start`] spawning the thread: both use
//!   `protocol.rs`, the commands sent to the thread and the state both
//!   sides read ([`EngineStats`]). `config.rs`: [`EngineConfig`].
//! - [`request`]: what a request is and what its stream yields.
//! - [`scheduler`]: one forward per step under a token budget; decodes,
//!   then chunked prefills in progress, then FCFS admission; preemption by
//!   recompute when KV pages run out. The step plan ([`scheduler::Plan`])
//!   is plain data. Files: admission, chunking, preemption, planning,
//!   commit, the prefix cache's points on sequences and rows.
//! - [`prefix_cache`]: a trie over full KV pages with recurrent-state
//!   snapshots at exact positions (docs/prefix-caching.md); a hit resumes a
//!   request from a snapshot copied into its own slot. Files: the trie,
//!   eviction, publishing snapshots, where snapshots are taken.
//! - [`allocator`]: state slots and refcounted KV pages.
//! - [`executor`]: the seam with the model runtime: ids and geometry, the
//!   rows of a step, [`ExecError`], and the in-step snapshot's passes.
//! - [`constraint`]: structured outputs: constraints compiled by
//!   llguidance, each constrained request's matcher, the token masks
//!   computed on a pool while the executor runs the step.
//! - [`sampler`]: the CPU sampler (vLLM semantics, counter-based seeds):
//!   penalties, truncation, the race, row reductions.
//! - [`metrics`]: the vLLM-named Prometheus series.
//! - [`timeline`]: the request timeline (off by default): where a
//!   request's time to first token goes, step by step.
//!
//! Tests sit at the bottom of the file they test or in a `tests.rs` of the
//! folder; the fake executor for integration tests is the
//! `gdn-engine-testkit` crate (crates/testkits/engine-testkit).

pub mod allocator;
mod config;
pub mod constraint;
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
pub use constraint::{
    ConstraintError, ConstraintLimits, ConstraintSpec, StructuredOutputs, StructuredOutputsError,
};
pub use engine::{Drained, Engine, EngineHandle, EngineStartError, RequestStream};
pub use executor::{
    check_row_snapshots, in_row_order, split_rows, AllowedTokens, ArenaGeometry, ArenaMap,
    BoxError, CacheGeometry, ExecError, Executor, MemoryOp, PageId, RowSnapshot, RowSnapshotError,
    SampleSeed, SampleSpec, SampledToken, SlotId, SnapshotGeometry, SnapshotId, StateGeometry,
    StepRow,
};
pub use protocol::EngineStats;
pub use request::{
    EngineState, Event, Failure, FailureCause, FinishReason, GenerateRequest, InvalidParam,
    RequestId, SamplingParams, StopParams, SubmitError, TokenEvent, Usage,
};
pub use scheduler::AdmissionPolicy;
pub use timeline::{EngineTimeline, StepMark, StepPhases};
