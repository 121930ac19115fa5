//! How much page room admission leaves for the running sequences' growth:
//! the pages each admission policy ([`AdmissionPolicy`], `policy.rs`)
//! holds back, and the ratio policy's course. Preemption by recompute throws a sequence's prefill away,
//! so admitting a request that the decodes then push out costs its whole
//! prompt again; a policy decides how much of the outputs still to come it
//! counts before it admits. The policies were compared on the fake
//! executor by `checks/bench/admission_sim` (docs/performance.md,
//! "Admission").

use super::policy::{
    AdmissionPolicy, CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY_STEPS,
};
use super::state::{Scheduler, Sequence};

/// After a preemption SGLang counts this many more decode steps per
/// running sequence as used (`RETRACT_DECODE_STEPS`).
const RETRACT_DECODE_STEPS: usize = 20;

impl Scheduler {
    /// Positions `seq` is expected to reach under the policy (its tokens
    /// known now plus the weighted outputs still to come), at most
    /// `max_model_len`.
    fn projected_len(&self, seq: &Sequence) -> usize {
        let remaining = seq.stop.max_tokens.saturating_sub(seq.output_len());
        let counted = match self.config.admission {
            AdmissionPolicy::Watermark => 0,
            AdmissionPolicy::Reserve => remaining,
            AdmissionPolicy::NewTokenRatio => {
                let clipped = remaining.min(CLIP_MAX_NEW_TOKENS);
                (clipped as f64 * self.new_token_ratio).ceil() as usize
            }
        };
        seq.tokens
            .len()
            .saturating_add(counted)
            .min(self.config.max_model_len)
    }

    /// Pages admission keeps free for the running sequences: one each under
    /// the watermark, else the pages each still lacks for its projected
    /// length.
    pub(super) fn running_headroom(&self) -> usize {
        if self.config.admission == AdmissionPolicy::Watermark {
            return self.running.len();
        }
        self.running
            .iter()
            .map(|id| {
                let seq = &self.seqs[id];
                let held = seq.cache.as_ref().map_or(0, |c| c.pages.len());
                self.alloc
                    .pages_for(self.projected_len(seq))
                    .saturating_sub(held)
            })
            .sum()
    }

    /// Pages waiting `id` needs beyond its first chunk, which ends at
    /// position `chunk_end` (0 under the watermark: only the chunk counts).
    pub(super) fn own_headroom(&self, id: crate::request::RequestId, chunk_end: usize) -> usize {
        if self.config.admission == AdmissionPolicy::Watermark {
            return 0;
        }
        let seq = &self.seqs[&id];
        self.alloc
            .pages_for(self.projected_len(seq))
            .saturating_sub(self.alloc.pages_for(chunk_end))
    }

    /// Before planning: an engine with nothing running starts again from
    /// the initial ratio (SGLang resets it when idle).
    pub(super) fn reset_new_token_ratio_when_idle(&mut self) {
        if self.running.is_empty() {
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO;
        }
    }

    /// The ratio after a step planned with `preempted` preemptions: raised
    /// after a preemption to the share of their clipped budgets the running
    /// sequences have used (plus [`RETRACT_DECODE_STEPS`] each), else one
    /// decay step down.
    pub(super) fn update_new_token_ratio(&mut self, preempted: usize) {
        if self.config.admission != AdmissionPolicy::NewTokenRatio {
            return;
        }
        if preempted > 0 {
            let (used, budget) = self.running.iter().fold((0, 0), |(u, b), id| {
                let seq = &self.seqs[id];
                let out = seq.output_len();
                let budget = seq.stop.max_tokens.min(out + CLIP_MAX_NEW_TOKENS);
                (u + out + RETRACT_DECODE_STEPS, b + budget.max(1))
            });
            self.new_token_ratio = (used as f64 / budget as f64).clamp(MIN_NEW_TOKEN_RATIO, 1.0);
        } else {
            let decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS;
            self.new_token_ratio = (self.new_token_ratio - decay).max(MIN_NEW_TOKEN_RATIO);
        }
    }

    /// The ratio the policy weighs remaining outputs by now.
    pub fn new_token_ratio(&self) -> f64 {
        self.new_token_ratio
    }
}
