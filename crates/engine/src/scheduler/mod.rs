//! Which tokens of which sequences run in the next step.
//!
//! One step is one forward under a token budget (`max_num_batched_tokens`):
//! first the running sequences that decode (one token each), then the
//! running sequences part-way through their prefill (chunked), then waiting
//! sequences in arrival order (FCFS) while a state slot, pages for the
//! granted chunk and budget remain. Admission stops at the first waiting
//! sequence that does not fit, so a long prompt at the head is never
//! overtaken forever (a sequence waiting for a prefix-cache snapshot that a
//! running one is about to publish is passed over for the step instead:
//! `admission.rs`). Pages are taken as positions need them; admission
//! keeps free the pages the policy ([`AdmissionPolicy`], `headroom.rs`)
//! expects the running sequences and the newcomer to grow into (by
//! default SGLang's estimate of the outputs to come) and is skipped in a
//! step that had to preempt, so newcomers are not admitted only to be
//! thrown out at the next page boundary.
//!
//! When a running sequence needs a page and none is free, the most recently
//! admitted running sequence is preempted by recompute (if that is the one
//! in need, it waits a step instead, keeping its work): its slot and pages
//! are freed and it goes back to the front of the waiting queue with its
//! output so far; readmitted, it prefills prompt + output again and samples
//! its next token with the same draw index, so its continuation is the one
//! it would have had. The earliest admitted sequence therefore always makes
//! progress, and it cannot be blocked by requests that arrived after it.
//! Readmission looks the victim up in the prefix cache like any waiting
//! sequence and resumes from the deepest snapshot its prefill published
//! (its snapshot points) if the cache kept it. Its end state is not
//! published at preemption: running sequences evict the cache before
//! anyone is preempted, so the page that forces a preemption would evict
//! that state at once (seen in the scheduler's tests). The tokens computed
//! again are counted ([`Scheduler::recomputed_tokens`]).
//!
//! With the prefix cache ([`crate::prefix_cache`]) on, admission first
//! looks the sequence up: a hit starts it at the cached position (shared
//! pages, a copied tail page, the snapshot restored into its slot: the
//! plan's `cache_ops`). At the sequence's snapshot points (before the
//! prompt's last token, after the last configured marker such as
//! `<|im_start|>assistant\n`, periodic points) the state is published:
//! a prefill chunk runs through up to `row_snapshots` points, the executor
//! taking each snapshot inside the step into an id reserved at planning
//! (the in-step snapshot), and ends at the next one, where
//! [`Scheduler::commit`] publishes the state after the step (with
//! `row_snapshots` 0, every point ends a chunk). Either way a snapshot is
//! published only once its step committed; a failed step's reservations
//! are given back ([`Scheduler::abandon`]). A sequence that finishes
//! publishes the state after its last computed token too. A waiting
//! sequence that shares a prefix beyond its hit (with the cached KV or a
//! running sequence) sets a branch point where the sharing ends, or waits
//! for a running sequence's pending snapshot it can use (the policy:
//! [`crate::prefix_cache`]'s `points.rs`). Running sequences short of pages
//! evict the cache before anyone is preempted; admission evicts it too.
//!
//! The scheduler is single-threaded and pure (no clocks, no channels): the
//! engine thread drives it and the tests drive it directly.
//!
//! One concept per file:
//! - `plan.rs`: the step plan ([`Plan`]) and a committed token
//!   ([`Outcome`]), plain data.
//! - `state.rs`: the sequences, the queues and their resources.
//! - `planning.rs`: [`Scheduler::schedule`] and the plan's executor rows.
//! - `chunking.rs`: how long a prefill chunk is.
//! - `preemption.rs`: pages for running sequences, preemption by recompute.
//! - `admission.rs`: FCFS admission of waiting sequences, prefix-cache hits.
//! - `policy.rs`: the admission policies.
//! - `headroom.rs`: the pages each policy keeps free, the ratio's course.
//! - `snapshots.rs`: the prefix cache's points on sequences and rows.
//! - `commit.rs`: [`Scheduler::commit`], applying a step's result.

mod admission;
mod chunking;
mod commit;
mod headroom;
mod plan;
mod planning;
mod policy;
mod preemption;
mod snapshots;
mod state;

/// Where a prompt's snapshots go; the prefix cache's, re-exported here
/// where callers found them first.
pub use crate::prefix_cache::{snapshot_points, MARKER_COVERS_END};
pub use plan::{Outcome, Plan, Scheduled};
pub use policy::{AdmissionPolicy, CLIP_MAX_NEW_TOKENS};
pub use state::{Scheduler, SchedulerConfig};

#[cfg(test)]
mod tests;
