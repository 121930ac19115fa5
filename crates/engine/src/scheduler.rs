//! Which tokens of which sequences run in the next step.
//!
//! One step is one forward under a token budget (`max_num_batched_tokens`):
//! first the running sequences that decode (one token each), then the
//! running sequences part-way through their prefill (chunked), then waiting
//! sequences in arrival order (FCFS) while a state slot, pages for the
//! granted chunk and budget remain. Admission stops at the first waiting
//! sequence that does not fit, so a long prompt at the head is never
//! overtaken forever. Pages are taken as positions need them; admission
//! leaves one free page per running sequence (their next growth) and is
//! skipped in a step that had to preempt, so newcomers are not admitted
//! only to be thrown out at the next page boundary.
//!
//! When a running sequence needs a page and none is free, the most recently
//! admitted running sequence is preempted by recompute (if that is the one
//! in need, it waits a step instead, keeping its work): its slot and pages
//! are freed and it goes back to the front of the waiting queue with its
//! output so far; readmitted, it prefills prompt + output again and samples
//! its next token with the same draw index, so its continuation is the one
//! it would have had. The earliest admitted sequence therefore always makes
//! progress, and it cannot be blocked by requests that arrived after it.
//!
//! The scheduler is single-threaded and pure (no clocks, no channels): the
//! engine thread drives it and the tests drive it directly.

use std::collections::{HashMap, VecDeque};

use crate::allocator::{Allocator, SeqCache};
use crate::executor::{CacheGeometry, SampleSeed, SampleSpec, SampledToken, StepRow};
use crate::request::{FinishReason, RequestId, SamplingParams, StopParams};

/// The limits the scheduler enforces (already capped by the executor's geometry).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_model_len: usize,
    /// Cap per prefill chunk; 0: the budget only.
    pub long_prefill_token_threshold: usize,
    pub eos_token_ids: Vec<u32>,
}

/// A request as the scheduler keeps it.
#[derive(Debug)]
struct Sequence {
    /// Prompt, then the output so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampling: SamplingParams,
    stop: StopParams,
    seed: u64,
    /// Tokens whose state and KV are in the cache (0 when waiting).
    computed: usize,
    cache: Option<SeqCache>,
    /// Admitted at least once (a preempted sequence is waiting again but
    /// has been admitted).
    admitted_once: bool,
}

impl Sequence {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// One sequence's part of a planned step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: RequestId,
    pub start: usize,
    pub len: usize,
    /// The chunk ends at the sequence's last token: the step samples.
    pub sample: bool,
}

/// A planned step: its rows, and what planning did to the queues.
#[derive(Debug, Default)]
pub struct Plan {
    pub rows: Vec<Scheduled>,
    /// Admitted for the first time in this step.
    pub first_admitted: Vec<RequestId>,
    /// Preempted while planning (now at the front of the waiting queue).
    pub preempted: Vec<RequestId>,
}

impl Plan {
    pub fn num_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.len).sum()
    }
}

/// A sampled token applied to its sequence.
#[derive(Debug)]
pub struct Outcome {
    pub id: RequestId,
    pub sampled: SampledToken,
    /// The request ended with this token (its resources are already freed).
    pub finish: Option<FinishReason>,
    pub prompt_len: usize,
    pub output_len: usize,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    alloc: Allocator,
    seqs: HashMap<RequestId, Sequence>,
    waiting: VecDeque<RequestId>,
    /// Admission order (oldest first); preemption takes from the back.
    running: Vec<RequestId>,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, geometry: &CacheGeometry) -> Self {
        assert!(config.max_num_batched_tokens >= config.max_num_seqs.max(1));
        Scheduler {
            config,
            alloc: Allocator::new(geometry),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request (already validated: prompt not empty and shorter
    /// than `max_model_len`).
    pub fn add(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        sampling: SamplingParams,
        stop: StopParams,
        seed: u64,
    ) {
        assert!(!prompt.is_empty() && prompt.len() < self.config.max_model_len);
        let prompt_len = prompt.len();
        let seq = Sequence {
            tokens: prompt,
            prompt_len,
            sampling,
            stop,
            seed,
            computed: 0,
            cache: None,
            admitted_once: false,
        };
        assert!(self.seqs.insert(id, seq).is_none(), "duplicate {id:?}");
        self.waiting.push_back(id);
    }

    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.seqs.contains_key(&id)
    }

    pub fn ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.seqs.keys().copied()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Removes a request wherever it is and frees its slot and pages.
    /// Returns whether it was there.
    pub fn remove(&mut self, id: RequestId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        if let Some(cache) = seq.cache.take() {
            self.alloc.close(cache);
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&r| r != id);
        true
    }

    fn chunk_cap(&self, remaining: usize, budget: usize) -> usize {
        let mut chunk = remaining.min(budget);
        if self.config.long_prefill_token_threshold > 0 {
            chunk = chunk.min(self.config.long_prefill_token_threshold);
        }
        chunk
    }

    /// Frees the most recently admitted running sequence and requeues it at
    /// the front of the waiting queue; drops its row from `rows` if it had one.
    fn preempt_latest(&mut self, rows: &mut Vec<Scheduled>, budget: &mut usize) -> RequestId {
        let victim = self.running.pop().expect("a running sequence to preempt");
        let seq = self.seqs.get_mut(&victim).expect("running sequence");
        if let Some(cache) = seq.cache.take() {
            self.alloc.close(cache);
        }
        seq.computed = 0;
        if let Some(pos) = rows.iter().position(|r| r.id == victim) {
            *budget += rows.remove(pos).len;
        }
        self.waiting.push_front(victim);
        self.preemptions += 1;
        victim
    }

    /// Plans the next step (empty when there is nothing to run).
    pub fn schedule(&mut self) -> Plan {
        let mut plan = Plan::default();
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
                    self.chunk_cap(remaining, budget)
                };
                let Some(len) = self.grant_pages(id, want, &mut plan, &mut budget) else {
                    // The latest admitted waits for pages: it is the last
                    // running sequence, so this phase is done.
                    break;
                };
                let seq = &self.seqs[&id];
                plan.rows.push(Scheduled {
                    id,
                    start: seq.computed,
                    len,
                    sample: seq.computed + len == seq.tokens.len(),
                });
                budget -= len;
                i += 1;
            }
        }
        self.admit(&mut plan, &mut budget);
        plan
    }

    /// Pages for `want` more tokens of running `id`. A prefill chunk shrinks
    /// to what the free pages hold; when not one more token fits, the latest
    /// admitted sequence is preempted (repeatedly). `None`: `id` is itself
    /// the latest admitted and waits for pages (no row this step).
    fn grant_pages(
        &mut self,
        id: RequestId,
        want: usize,
        plan: &mut Plan,
        budget: &mut usize,
    ) -> Option<usize> {
        loop {
            let seq = self.seqs.get_mut(&id).expect("running sequence");
            let cache = seq.cache.as_mut().expect("running sequence has a cache");
            let held = cache.pages.len() * self.alloc.page_size();
            let can_hold = held + self.alloc.pages_free() * self.alloc.page_size();
            let len = want.min(can_hold.saturating_sub(seq.computed));
            if len > 0 {
                let grown = self.alloc.grow(cache, seq.computed + len);
                debug_assert!(grown);
                return Some(len);
            }
            if self.running.last() == Some(&id) {
                // It is the latest admitted itself: rather than throw its
                // work away, it sits this step out holding what it has;
                // older sequences preempt it if they need its pages.
                return None;
            }
            let victim = self.preempt_latest(&mut plan.rows, budget);
            plan.preempted.push(victim);
        }
    }

    /// FCFS admission of waiting sequences into the remaining budget.
    fn admit(&mut self, plan: &mut Plan, budget: &mut usize) {
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            // Pages ran out in this step: admitting now would only make the
            // next preemption victim (vLLM v1 skips admission likewise).
            if !plan.preempted.is_empty() {
                break;
            }
            let seq = &self.seqs[&id];
            // Leave one free page per running sequence for its growth in the
            // next steps, or the newcomer would be preempted at once (and
            // its prefill thrown away) as soon as an older one needs a page.
            let reserve = self.running.len();
            let spare_pages = self.alloc.pages_free().saturating_sub(reserve);
            let len = self
                .chunk_cap(seq.tokens.len(), *budget)
                .min(spare_pages * self.alloc.page_size());
            if len == 0 {
                break;
            }
            let Some(cache) = self.alloc.open(len) else {
                break; // no free slot
            };
            self.waiting.pop_front();
            let seq = self.seqs.get_mut(&id).expect("waiting sequence");
            seq.cache = Some(cache);
            if !seq.admitted_once {
                seq.admitted_once = true;
                plan.first_admitted.push(id);
            }
            self.running.push(id);
            plan.rows.push(Scheduled {
                id,
                start: 0,
                len,
                sample: len == seq.tokens.len(),
            });
            *budget -= len;
        }
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

    /// The executor rows of `plan`; `banned[i]` is [`Self::banned`] of row i.
    pub fn step_rows<'a>(&'a self, plan: &Plan, banned: &'a [Vec<u32>]) -> Vec<StepRow<'a>> {
        plan.rows
            .iter()
            .zip(banned)
            .map(|(row, banned)| {
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
                    }),
                }
            })
            .collect()
    }

    /// Applies a step's result: advances every row, appends sampled tokens
    /// (one per sampling row, in row order; the caller checked the count)
    /// and ends the sequences that stop. Ended sequences are removed and
    /// their resources freed before this returns.
    pub fn commit(&mut self, plan: &Plan, sampled: Vec<SampledToken>) -> Vec<Outcome> {
        let mut sampled = sampled.into_iter();
        let mut outcomes = Vec::new();
        for row in &plan.rows {
            let seq = self.seqs.get_mut(&row.id).expect("scheduled sequence");
            seq.computed += row.len;
            if !row.sample {
                continue;
            }
            let token = sampled.next().expect("one sampled token per sampling row");
            seq.tokens.push(token.token);
            let finish = finish_reason(seq, token.token, &self.config);
            outcomes.push(Outcome {
                id: row.id,
                sampled: token,
                finish,
                prompt_len: seq.prompt_len,
                output_len: seq.output_len(),
            });
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

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
