//! How long a prefill chunk is: the step's budget, the per-chunk cap, equal
//! chunks for a prompt longer than the cap, and the snapshot points a row
//! cannot take inside the step.

use super::state::Scheduler;
use crate::request::RequestId;

impl Scheduler {
    /// The next prefill chunk of a prompt with `remaining` tokens to go:
    /// a prompt longer than one step's cap is cut into equal chunks, not
    /// cap-sized ones and a short tail, then the chunk is fitted to what is
    /// left of this step's `budget`. Why: a short chunk deep into a long
    /// prompt has few query rows over many keys, which the attention kernel
    /// spreads badly: the tail of a prompt just over the budget costs
    /// several times what its tokens cost inside a larger chunk
    /// (docs/results/h200-2026-12-01/README.md, "Where TTFT goes at c = 1").
    pub(super) fn chunk_cap(&self, remaining: usize, budget: usize) -> usize {
        let mut cap = self.config.max_num_batched_tokens;
        if self.config.long_prefill_token_threshold > 0 {
            cap = cap.min(self.config.long_prefill_token_threshold);
        }
        let cap = cap.max(1);
        let chunks = remaining.div_ceil(cap).max(1);
        remaining.div_ceil(chunks).min(budget)
    }

    /// Shortens a chunk of `len` tokens from `start` so that it ends at the
    /// first snapshot point inside it that the row cannot take in the step
    /// (the point after the first `row_snapshots` inside it).
    pub(super) fn cap_to_point(&self, id: RequestId, start: usize, len: usize) -> usize {
        let points = &self.seqs[&id].points;
        let inside = points.iter().filter(|&&q| q > start && q < start + len);
        match inside.clone().nth(self.config.row_snapshots) {
            Some(&q) => q - start,
            None => len,
        }
    }
}
