//! The seam between the engine and a model runtime. The engine decides
//! which sequence sits in which state slot, which KV pages it owns and which
//! tokens run in a step; an executor only runs the rows it is given on the
//! device buffers those ids address, and samples where asked.

use thiserror::Error;

use crate::request::SamplingParams;
use crate::timeline::StepPhases;

/// A recurrent/conv state slot of the executor (one per live sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// A KV-cache page of the executor (`page_size` positions of every attention layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

/// A state snapshot of the executor's snapshot pool: a copy of a slot's
/// recurrent and conv state after some number of tokens, kept for the
/// prefix cache. Separate from the slots, so no running sequence ever
/// writes into one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId(pub u32);

/// The executor's snapshot pool (empty: it cannot snapshot, and the engine
/// runs without a prefix cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotGeometry {
    pub num_snapshots: usize,
    /// Device (or host) bytes of one snapshot, for the metrics and budget.
    pub snapshot_bytes: usize,
}

/// What an executor holds; the engine's allocator hands these out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheGeometry {
    pub num_slots: usize,
    pub num_pages: usize,
    /// Positions per KV page.
    pub page_size: usize,
    pub vocab_size: usize,
    /// The longest sequence (prompt + output) the executor can run.
    pub max_model_len: usize,
}

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
    /// unless the executor offers it: [`Executor::max_row_snapshots`]):
    /// the executor runs the row up to each point, copies the slot's state
    /// into the snapshot as [`Executor::snapshot`] would at that position,
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

#[derive(Debug, Error)]
pub enum ExecError {
    /// The executor refused the step before touching any state (a bug in the
    /// engine or an unsupported shape); the rows' states are unchanged.
    #[error("step refused: {0}")]
    Refused(String),
    /// The device failed while running the step: the states of the step's
    /// slots are undefined (the engine fails or recomputes those requests),
    /// other slots are intact.
    #[error("step failed: {0}")]
    StepFailed(String),
    /// The executor is unusable (lost device): the engine stops.
    #[error("executor lost: {0}")]
    Fatal(String),
}

impl ExecError {
    /// A stable label for the kind of failure (a metric label, a log
    /// field): `"refused"`, `"step_failed"` or `"fatal"`.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecError::Refused(_) => "refused",
            ExecError::StepFailed(_) => "step_failed",
            ExecError::Fatal(_) => "fatal",
        }
    }
}

/// A model runtime driven by the engine. It lives on the engine thread (it
/// is created there by a factory, so it need not be `Send`).
pub trait Executor {
    fn geometry(&self) -> CacheGeometry;

    /// Runs one forward over `rows` (each slot at most once) and returns one
    /// [`SampledToken`] per row with `sample: Some(..)`, in row order.
    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError>;

    /// The snapshot pool; an executor without one keeps the default (none)
    /// and the engine never calls the methods below.
    fn snapshot_geometry(&self) -> SnapshotGeometry {
        SnapshotGeometry::default()
    }

    /// How many [`StepRow::snapshots`] one row may carry (0, the default:
    /// none; the engine then ends prefill chunks at snapshot points and
    /// snapshots after the step, each point costing its request a step).
    /// An executor that offers it runs a row with points in pieces, one
    /// more forward per piece (see [`split_rows`]).
    fn max_row_snapshots(&self) -> usize {
        0
    }

    /// Copies the state `slot` holds now (after its last step) into
    /// `snapshot`, replacing what was there. The slot is unchanged.
    fn snapshot(&mut self, slot: SlotId, snapshot: SnapshotId) -> Result<(), ExecError> {
        let _ = (slot, snapshot);
        Err(ExecError::Refused(
            "this executor has no snapshot pool".into(),
        ))
    }

    /// Copies `snapshot` into `slot`: the slot then holds the state after
    /// the snapshot's tokens, and the next row of the slot continues at that
    /// position. The snapshot is unchanged (copy, never in place).
    fn restore(&mut self, snapshot: SnapshotId, slot: SlotId) -> Result<(), ExecError> {
        let _ = (snapshot, slot);
        Err(ExecError::Refused(
            "this executor has no snapshot pool".into(),
        ))
    }

    /// The engine will not restore `snapshot` again (until it takes a new
    /// one there): an executor may free what it holds for it.
    fn drop_snapshot(&mut self, snapshot: SnapshotId) {
        let _ = snapshot;
    }

    /// Copies every position of KV page `from` onto page `to` (a prefix hit
    /// that ends inside a page: the request writes its next positions into
    /// its own copy, never into the shared page).
    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), ExecError> {
        let _ = (from, to);
        Err(ExecError::Refused("this executor cannot copy pages".into()))
    }

    /// Turns per-step phase timing on or off (the request timeline,
    /// [`crate::timeline`]). Timing may cost a little (GPU: events around
    /// the forward), so it is off unless the engine asks.
    fn set_step_timing(&mut self, on: bool) {
        let _ = on;
    }

    /// The phases of the last step, when timing is on and the executor
    /// measures them (default: it does not).
    fn last_step_phases(&self) -> Option<StepPhases> {
        None
    }
}

#[path = "executor_pieces.rs"]
mod pieces;
pub use pieces::{check_row_snapshots, in_row_order, split_rows, Pass, RowSnapshotError};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_stable_labels_and_messages_name_the_kind() {
        let cases = [
            (
                ExecError::Refused("bad row".into()),
                "refused",
                "step refused: bad row",
            ),
            (
                ExecError::StepFailed("xid".into()),
                "step_failed",
                "step failed: xid",
            ),
            (
                ExecError::Fatal("gone".into()),
                "fatal",
                "executor lost: gone",
            ),
        ];
        for (error, kind, message) in cases {
            assert_eq!(error.kind(), kind);
            assert_eq!(error.to_string(), message);
        }
    }
}
