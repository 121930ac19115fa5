//! One step as the executor sees it: its rows, what to sample after each,
//! and what comes back.

use super::allowed::AllowedTokens;
use super::geometry::{PageId, SlotId, SnapshotId};
use crate::request::SamplingParams;

/// Where a sampled token's randomness comes from: a pure function of
/// (`seed`, `draw`), so a request's samples do not depend on the batch it
/// ran in, nor on preemption (a recomputed request draws the same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleSeed {
    pub seed: u64,
    /// Index of this draw within the request (0 for its first output token).
    pub draw: u64,
}

/// A request to sample one token after the last token of a row.
#[derive(Clone, Copy, Debug)]
pub struct SampleSpec<'a> {
    pub params: &'a SamplingParams,
    /// Every token of the sequence so far (prompt, then output), for the
    /// penalties: repetition applies to all of them, presence and frequency
    /// to the output only (`history[prompt_len..]`), as in vLLM.
    pub history: &'a [u32],
    pub prompt_len: usize,
    pub seed: SampleSeed,
    /// Tokens that may not be sampled (EOS and stop ids while `min_tokens`
    /// is not reached).
    pub banned: &'a [u32],
    /// The tokens a constrained row may sample (structured outputs);
    /// `None`: every token.
    pub allowed: Option<&'a AllowedTokens>,
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct StepRow<'a> {
    pub slot: SlotId,
    /// Position of `tokens[0]`. 0: the slot's state starts from zero (the
    /// executor resets it); otherwise the slot holds the state after
    /// exactly `start` tokens of this sequence.
    pub start: usize,
    pub tokens: &'a [u32],
    /// The sequence's KV pages in position order, covering at least
    /// `start + tokens.len()` positions. Pages wholly before `start` may be
    /// shared read-only with other rows and sequences (the prefix cache);
    /// the pages the row writes (from the one holding `start`) are its own.
    pub pages: &'a [PageId],
    /// Sample a token after the row's last token (`None`: a prefill chunk
    /// that is not the prompt's last).
    pub sample: Option<SampleSpec<'a>>,
    /// Snapshots to take inside the row (the in-step snapshot, empty
    /// unless the executor offers it: [`crate::Executor::max_row_snapshots`]):
    /// the executor runs the row up to each point, copies the slot's state
    /// into the snapshot as [`crate::Executor::snapshot`] would at that position,
    /// and runs on. Ascending, each strictly inside the row
    /// (`start < at < start + tokens.len()`), no snapshot named twice in a
    /// step. The engine publishes them only after the step succeeded.
    pub snapshots: &'a [RowSnapshot],
}

/// A snapshot taken inside a row: the state after `at` tokens of the
/// sequence (a position, like `start`), copied into `snapshot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSnapshot {
    pub at: usize,
    pub snapshot: SnapshotId,
}

/// A sampled token with its log-probability and the top alternatives when
/// asked. Log-probabilities are the raw model log-softmax (before penalties,
/// temperature and truncation), as vLLM's default `raw_logprobs` mode.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    pub token: u32,
    /// The chosen token's raw logprob when `params.logprobs` is `Some`; NaN
    /// otherwise (not computed: it costs a pass of `exp` over the
    /// vocabulary, and the worker reports it only when asked).
    pub logprob: f32,
    /// `(token, logprob)`, best first; `params.logprobs` of them.
    pub top_logprobs: Vec<(u32, f32)>,
}
