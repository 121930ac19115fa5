//! A fake executor that checks what the engine asks of it, for the tests
//! of the engine and of its users (a dev-dependency only, never in a
//! shipped binary).
//!
//! It keeps, per slot, the tokens the slot's state has absorbed and, per
//! page position, a fingerprint of the prefix whose KV it holds, and refuses
//! a step (recording a violation) when the engine breaks the executor
//! contract: a slot twice in a step, a row whose `start` is not what the
//! slot holds, pages that do not cover the row, a page written by two rows
//! or read by one row while another writes it, an earlier position whose KV
//! is not the sequence's own prefix (a page overwritten while still in use,
//! a wrong shared page, a wrong prefix-cache copy), a sampling history that
//! is not the slot's. It also has a snapshot pool (prefix cache): a
//! snapshot keeps a slot's history, a restore puts it back, so restoring
//! the wrong snapshot or at the wrong position is refused at the next row.
//! It takes snapshots inside a row (the in-step snapshot, any number per
//! row unless [`FakeExecutor::with_row_snapshots`] says otherwise): the
//! snapshot keeps the history up to the point, so one published at the
//! wrong point, or before its step ran, is refused when restored and used.
//! Its "model" turns the history into logits by hashing; the real sampler
//! then draws with the row's `SampleSeed`. The output is thus a pure
//! function of (history, seed, draw): a preempted and recomputed request,
//! or one resumed from the prefix cache, must produce the same tokens as
//! one run alone.
//!
//! With an arena ([`FakeExecutor::with_arena`]) it also refuses a row or
//! a cache op on an unmapped group, a group mapped twice or unmapped while
//! not mapped, and more chunks mapped than the pool has; what a group held
//! is forgotten when it is mapped or unmapped, so memory reused without
//! its sequence's state shows at the next row.
//!
//! A [`FakeControl`] shared with the test records every step, injects
//! failures, adds delay, and can gate steps one by one. [`collect`] reads a
//! request's stream to its end (for any executor's tests).
//!
//! - `executor.rs`: [`FakeExecutor`], its checks and its "model".
//! - `control.rs`: [`FakeControl`], the test's side.
//! - `model.rs`: [`fake_logits`] and [`lone_run`], the reference outputs.
//! - `streams.rs`: reading request streams to their end.

mod control;
mod executor;
mod model;
mod streams;

pub use control::{FakeControl, FakeFailure, RowRecord};
pub use executor::{FakeExecutor, FAKE_SNAPSHOT_BYTES};
pub use model::{fake_logits, lone_run};
pub use streams::{collect, finished_tokens};
