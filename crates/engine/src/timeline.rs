//! The request timeline (off by default; `EngineConfig::request_timeline`,
//! gdn-server's `--request-timeline`): where a request's time to first token
//! goes on the engine side. With it on, the engine thread stamps each
//! request when it takes it, when it is first scheduled and around every
//! step it takes part in until its first token, and hands the record to the
//! client with that token ([`crate::TokenEvent::timeline`]); the server adds
//! its own stamps (body, tokenizer, the response) and logs one line.
//!
//! With it off nothing is stamped: the engine thread tests one boolean per
//! step and no record exists.

use std::time::{Duration, Instant};

/// What the executor reports of its last step when asked to time steps
/// ([`crate::Executor::set_step_timing`]). The three phases follow each
/// other on the step's critical path; together with the host time the
/// engine sees around the call they account for the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepPhases {
    /// Host work before the forward's first kernel is queued: row checks,
    /// the batch layout and its upload, zeroing new slots.
    pub host_prep: Duration,
    /// Host time spent queueing the forward's kernels (or replaying a
    /// graph). Close to `forward`: the forward is bound by the host.
    pub launch: Duration,
    /// The forward itself (GPU: device time between events around it;
    /// CPU: wall time).
    pub forward: Duration,
    /// From the end of the forward to the sampled tokens on the host:
    /// sampling kernels, copies back, host sampling.
    pub sample: Duration,
}

/// One engine step a request took part in before its first token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepMark {
    /// The step began (planning).
    pub planned: Instant,
    /// `Executor::step` was called (after cache operations and rows).
    pub exec_start: Instant,
    /// `Executor::step` returned.
    pub exec_end: Instant,
    /// Commit, prefix-cache snapshots and metrics done; tokens go out next.
    pub committed: Instant,
    /// The executor's own split of the call (when it reports one).
    pub phases: Option<StepPhases>,
    /// Rows and tokens of the whole step.
    pub rows: usize,
    pub tokens: usize,
    /// This request's row: its first position and token count.
    pub start: usize,
    pub len: usize,
    /// Prefix-cache operations run before the step (page copies, restores).
    pub cache_ops_before: usize,
    /// Prefix-cache snapshots taken inside this request's row (the
    /// in-step snapshot: its chunk ran through that many snapshot points).
    pub snapshots_in_row: usize,
    /// Its row sampled a token in this step.
    pub sampled: bool,
}

/// A request's engine-side record up to its first token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineTimeline {
    /// `EngineHandle::submit` queued it.
    pub submitted: Instant,
    /// The engine thread took it off the channel.
    pub accepted: Instant,
    /// First admitted into a step.
    pub first_scheduled: Option<Instant>,
    /// Every step it took part in, in order, the one that sampled the
    /// first token last.
    pub steps: Vec<StepMark>,
    /// The first token was handed to the request's channel.
    pub first_token_sent: Instant,
    /// Prompt tokens, and those served from the prefix cache.
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
}

/// Stamps being gathered for a request that has no token yet.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub submitted: Instant,
    pub accepted: Instant,
    pub first_scheduled: Option<Instant>,
    pub steps: Vec<StepMark>,
}

impl Pending {
    pub fn new(submitted: Instant, accepted: Instant) -> Self {
        Pending {
            submitted,
            accepted,
            first_scheduled: None,
            steps: Vec::new(),
        }
    }

    /// The record handed out with the first token, sent at `sent`.
    pub fn finish(
        self,
        sent: Instant,
        prompt_tokens: usize,
        cached_tokens: usize,
    ) -> EngineTimeline {
        EngineTimeline {
            submitted: self.submitted,
            accepted: self.accepted,
            first_scheduled: self.first_scheduled,
            steps: self.steps,
            first_token_sent: sent,
            prompt_tokens,
            cached_tokens,
        }
    }
}

/// Milliseconds from `from` to `to` (negative if `to` came first).
pub fn ms_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e3
    } else {
        -((from - to).as_secs_f64() * 1e3)
    }
}
