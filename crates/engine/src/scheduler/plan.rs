//! The step plan: what [`super::Scheduler::schedule`] decided for the next
//! step and what [`super::Scheduler::commit`] makes of its result, as plain
//! data (every field says what it holds). The engine thread reads it to run
//! the step, to count admissions and preemptions, and to stamp the request
//! timeline; the tests check it against the scheduler's rules.

use crate::executor::{MemoryOp, RowSnapshot, SampledToken};
use crate::prefix_cache::CacheOp;
use crate::request::{FinishReason, RequestId};

/// One sequence's part of a planned step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The sequence.
    pub id: RequestId,
    /// Position of the row's first token (the sequence's tokens computed
    /// so far, or a prefix-cache hit's position at admission).
    pub start: usize,
    /// Tokens the row runs: 1 for a decode, a chunk for a prefill.
    pub len: usize,
    /// The chunk ends at the sequence's last token: the step samples.
    pub sample: bool,
    /// Snapshot points inside the chunk, each with the snapshot id
    /// reserved for it (the executor takes them during the step; commit
    /// publishes them, a failed step gives them back:
    /// [`super::Scheduler::abandon`]).
    pub snapshots: Vec<RowSnapshot>,
}

/// A planned step: its rows, and what planning did to the queues.
#[derive(Debug, Default)]
pub struct Plan {
    /// The step's rows, in the order the executor gets them: decodes,
    /// prefills in progress, then the sequences admitted in this step.
    pub rows: Vec<Scheduled>,
    /// Admitted for the first time in this step.
    pub first_admitted: Vec<RequestId>,
    /// Preempted while planning (now at the front of the waiting queue).
    pub preempted: Vec<RequestId>,
    /// Tokens the step's readmitted sequences compute a second time (what
    /// their preemption threw away, less a prefix-cache hit).
    pub recomputed_tokens: usize,
    /// Passed over by admission: each waits for a snapshot a running
    /// sequence publishes (the sequences behind it could be admitted).
    pub waiting_for_snapshot: Vec<RequestId>,
    /// Arena maps and unmaps to run, in order, before the cache work.
    pub memory_ops: Vec<MemoryOp>,
    /// Executor work to run, in order, before the step (prefix-cache hits'
    /// page copies and restores; drops of evicted snapshots).
    pub cache_ops: Vec<CacheOp>,
}

impl Plan {
    /// Tokens the step runs (what it took of the budget).
    pub fn num_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.len).sum()
    }
}

/// A sampled token applied to its sequence.
#[derive(Debug)]
pub struct Outcome {
    /// The sequence.
    pub id: RequestId,
    /// The token the executor sampled, with its logprobs.
    pub sampled: SampledToken,
    /// The request ended with this token (its resources are already freed).
    pub finish: Option<FinishReason>,
    /// The sequence's prompt length.
    pub prompt_len: usize,
    /// Its output length, this token included.
    pub output_len: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}
