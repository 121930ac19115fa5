//! Planning a step: decodes first, then prefills in progress, then
//! admission, under the token budget; and the plan's rows as the executor
//! gets them.

use super::plan::Plan;
use super::state::Scheduler;
use crate::executor::{AllowedTokens, SampleSeed, SampleSpec, StepRow};
use crate::request::RequestId;

impl Scheduler {
    /// Plans the next step (empty when there is nothing to run).
    pub fn schedule(&mut self) -> Plan {
        let mut plan = Plan::default();
        self.reset_new_token_ratio_when_idle();
        let mut budget = self.config.max_num_batched_tokens;
        for decodes in [true, false] {
            let mut i = 0;
            while i < self.running.len() && budget > 0 {
                let id = self.running[i];
                let seq = &self.seqs[&id];
                let remaining = seq.tokens.len() - seq.computed;
                if (remaining == 1) != decodes {
                    i += 1;
                    continue;
                }
                let want = if decodes {
                    1
                } else {
                    let want = self.chunk_cap(remaining, budget);
                    self.cap_to_point(id, seq.computed, want)
                };
                let Some(len) = self.grant_pages(id, want, &mut plan, &mut budget) else {
                    // The latest admitted waits for pages: it is the last
                    // running sequence, so this phase is done.
                    break;
                };
                let start = self.seqs[&id].computed;
                budget -= self.schedule_row(&mut plan, id, start, len);
                i += 1;
            }
        }
        self.admit(&mut plan, &mut budget);
        self.update_new_token_ratio(plan.preempted.len());
        // Drops of snapshots evicted while planning go with the restores,
        // in the order they were decided.
        plan.cache_ops = std::mem::take(&mut self.cache_ops);
        plan.memory_ops = self.alloc.take_memory_ops();
        plan
    }

    /// The output so far of a sequence the scheduler holds.
    pub fn output(&self, id: RequestId) -> &[u32] {
        let seq = &self.seqs[&id];
        &seq.tokens[seq.prompt_len..]
    }

    /// EOS (unless `ignore_eos`) and stop ids while `min_tokens` is not reached.
    pub fn banned(&self, id: RequestId) -> Vec<u32> {
        let seq = &self.seqs[&id];
        if seq.output_len() >= seq.stop.min_tokens {
            return Vec::new();
        }
        let mut banned = seq.stop.stop_token_ids.clone();
        if !seq.stop.ignore_eos {
            banned.extend_from_slice(&self.config.eos_token_ids);
        }
        banned
    }

    /// The executor rows of `plan`; `banned[i]` is [`Self::banned`] of row
    /// i, `allowed[i]` its constraint's mask (`None`: unconstrained; a
    /// shorter slice leaves the rest unconstrained).
    pub fn step_rows<'a>(
        &'a self,
        plan: &'a Plan,
        banned: &'a [Vec<u32>],
        allowed: &'a [Option<AllowedTokens>],
    ) -> Vec<StepRow<'a>> {
        plan.rows
            .iter()
            .zip(banned)
            .enumerate()
            .map(|(i, (row, banned))| {
                let seq = &self.seqs[&row.id];
                let cache = seq.cache.as_ref().expect("scheduled sequence has a cache");
                StepRow {
                    slot: cache.slot,
                    start: row.start,
                    tokens: &seq.tokens[row.start..row.start + row.len],
                    pages: &cache.pages,
                    sample: row.sample.then_some(SampleSpec {
                        params: &seq.sampling,
                        history: &seq.tokens,
                        prompt_len: seq.prompt_len,
                        seed: SampleSeed {
                            seed: seq.seed,
                            draw: seq.output_len() as u64,
                        },
                        banned,
                        allowed: allowed.get(i).and_then(Option::as_ref),
                    }),
                    snapshots: &row.snapshots,
                }
            })
            .collect()
    }
}
