//! Committing a step: every row advances, sampled tokens are appended,
//! snapshots are published, and sequences that stop end here.

use super::plan::{Outcome, Plan};
use super::state::{Scheduler, SchedulerConfig, Sequence};
use crate::executor::SampledToken;
use crate::request::{FinishReason, RequestId};

impl Scheduler {
    /// Applies a step's result: advances every row, appends sampled tokens
    /// (one per sampling row, in row order; the caller checked the count)
    /// and ends the sequences that stop. Ended sequences are removed and
    /// their resources freed before this returns.
    pub fn commit(&mut self, plan: &Plan, sampled: Vec<SampledToken>) -> Vec<Outcome> {
        self.commit_with(plan, sampled, &[])
    }

    /// [`Self::commit`], where the sequences in `completed` end with the
    /// token they sampled in this step (their constraint is complete:
    /// reason `stop`).
    pub fn commit_with(
        &mut self,
        plan: &Plan,
        sampled: Vec<SampledToken>,
        completed: &[RequestId],
    ) -> Vec<Outcome> {
        let mut sampled = sampled.into_iter();
        let mut outcomes = Vec::new();
        for row in &plan.rows {
            let seq = self.seqs.get_mut(&row.id).expect("scheduled sequence");
            seq.computed += row.len;
            self.publish_taken(row.id, &row.snapshots);
            let seq = self.seqs.get_mut(&row.id).expect("scheduled sequence");
            if !row.sample {
                self.publish_state(row.id, false);
                continue;
            }
            let token = sampled.next().expect("one sampled token per sampling row");
            seq.tokens.push(token.token);
            let finish = if completed.contains(&row.id) {
                Some(FinishReason::Stop { token: token.token })
            } else {
                finish_reason(seq, token.token, &self.config)
            };
            outcomes.push(Outcome {
                id: row.id,
                sampled: token,
                finish,
                prompt_len: seq.prompt_len,
                output_len: seq.output_len(),
                cached_tokens: seq.cached_tokens,
            });
            self.publish_state(row.id, finish.is_some());
            if finish.is_some() {
                self.remove(row.id);
            }
        }
        outcomes
    }
}

/// vLLM's `check_stop` order: EOS (unless `ignore_eos`), stop ids, then
/// `max_tokens`, then `max_model_len`.
fn finish_reason(seq: &Sequence, token: u32, config: &SchedulerConfig) -> Option<FinishReason> {
    let output_len = seq.output_len();
    if output_len >= seq.stop.min_tokens
        && ((!seq.stop.ignore_eos && config.eos_token_ids.contains(&token))
            || seq.stop.stop_token_ids.contains(&token))
    {
        return Some(FinishReason::Stop { token });
    }
    if output_len >= seq.stop.max_tokens || seq.tokens.len() >= config.max_model_len {
        return Some(FinishReason::Length);
    }
    None
}
