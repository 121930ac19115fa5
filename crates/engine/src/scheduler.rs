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
//! `scheduler_points.rs`). Pages are taken as positions need them; admission
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
//! [`crate::prefix_cache`]'s `points.rs`). Running sequences short of
//! pages evict the cache before anyone is preempted; admission evicts it
//! too.
//!
//! The scheduler is single-threaded and pure (no clocks, no channels): the
//! engine thread drives it and the tests drive it directly.

use std::collections::{HashMap, VecDeque};

use crate::allocator::{Allocator, SeqCache};
use crate::executor::{CacheGeometry, RowSnapshot, SampleSeed, SampleSpec, SampledToken, StepRow};
use crate::prefix_cache::{Branch, CacheOp, Hit, PrefixCache, PrefixCacheConfig, PrefixCacheStats};
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
    /// `enabled` with `max_snapshots > 0` turns the prefix cache on.
    pub prefix_cache: PrefixCacheConfig,
    /// Snapshot points a prefill row may carry inside it (the executor's
    /// [`crate::Executor::max_row_snapshots`], 0 when the config turns the
    /// in-step snapshot off): a chunk runs through up to this many points
    /// in one step and ends at the next one.
    pub row_snapshots: usize,
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
    /// Positions after which the state is published to the prefix cache
    /// (ascending; empty without a cache). Prefill chunks end there.
    points: Vec<usize>,
    /// Prompt tokens served from the prefix cache at first admission.
    cached_tokens: usize,
}

impl Sequence {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// One sequence's part of a planned step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: RequestId,
    pub start: usize,
    pub len: usize,
    /// The chunk ends at the sequence's last token: the step samples.
    pub sample: bool,
    /// Snapshot points inside the chunk, each with the snapshot id
    /// reserved for it (the executor takes them during the step; commit
    /// publishes them, a failed step gives them back: [`Scheduler::abandon`]).
    pub snapshots: Vec<RowSnapshot>,
}

/// A planned step: its rows, and what planning did to the queues.
#[derive(Debug, Default)]
pub struct Plan {
    pub rows: Vec<Scheduled>,
    /// Admitted for the first time in this step.
    pub first_admitted: Vec<RequestId>,
    /// Preempted while planning (now at the front of the waiting queue).
    pub preempted: Vec<RequestId>,
    /// Passed over by admission: each waits for a snapshot a running
    /// sequence publishes (the sequences behind it could be admitted).
    pub waiting_for_snapshot: Vec<RequestId>,
    /// Executor work to run, in order, before the step (prefix-cache hits'
    /// page copies and restores; drops of evicted snapshots).
    pub cache_ops: Vec<CacheOp>,
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
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
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
    cache: Option<PrefixCache>,
    /// Executor work for the cache not yet handed out (see
    /// [`Scheduler::take_cache_ops`]).
    cache_ops: Vec<CacheOp>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, geometry: &CacheGeometry) -> Self {
        assert!(config.max_num_batched_tokens >= config.max_num_seqs.max(1));
        let pc = &config.prefix_cache;
        let cache = (pc.enabled && pc.max_snapshots > 0)
            .then(|| PrefixCache::new(geometry.page_size, pc.max_snapshots));
        Scheduler {
            config,
            alloc: Allocator::new(geometry),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
            cache,
            cache_ops: Vec::new(),
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
        let points = match &self.cache {
            Some(_) => snapshot_points(&prompt, &self.config.prefix_cache),
            None => Vec::new(),
        };
        let seq = Sequence {
            tokens: prompt,
            prompt_len,
            sampling,
            stop,
            seed,
            computed: 0,
            cache: None,
            admitted_once: false,
            points,
            cached_tokens: 0,
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

    /// Snapshot markers for the sequences added from now on.
    pub fn set_snapshot_markers(&mut self, markers: Vec<Vec<u32>>) {
        self.config.prefix_cache.snapshot_after = markers;
    }

    /// The prefix cache's counts (`None`: no cache).
    pub fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        self.cache.as_ref().map(PrefixCache::stats)
    }

    /// Executor work for the cache produced since the last plan (snapshots
    /// to take after the step just committed): run it, in order, before
    /// the next step.
    pub fn take_cache_ops(&mut self) -> Vec<CacheOp> {
        std::mem::take(&mut self.cache_ops)
    }

    /// Shortens a chunk of `len` tokens from `start` so that it ends at the
    /// first snapshot point inside it that the row cannot take in the step
    /// (the point after the first `row_snapshots` inside it).
    fn cap_to_point(&self, id: RequestId, start: usize, len: usize) -> usize {
        let points = &self.seqs[&id].points;
        let inside = points.iter().filter(|&&q| q > start && q < start + len);
        match inside.clone().nth(self.config.row_snapshots) {
            Some(&q) => q - start,
            None => len,
        }
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

    /// The next prefill chunk of a prompt with `remaining` tokens to go:
    /// a prompt longer than one step's cap is cut into equal chunks, not
    /// cap-sized ones and a short tail, then the chunk is fitted to what is
    /// left of this step's `budget`. Why: a short chunk deep into a long
    /// prompt has few query rows over many keys, which the attention kernel
    /// spreads badly; on the H200 an 8,416-token prompt under the default
    /// 8,192 budget cost 407 ms + 66 ms for its 224-token tail, against
    /// 426 ms in one piece (docs/benchmarks.md, TTFT breakdown).
    fn chunk_cap(&self, remaining: usize, budget: usize) -> usize {
        let mut cap = self.config.max_num_batched_tokens;
        if self.config.long_prefill_token_threshold > 0 {
            cap = cap.min(self.config.long_prefill_token_threshold);
        }
        let cap = cap.max(1);
        let chunks = remaining.div_ceil(cap).max(1);
        remaining.div_ceil(chunks).min(budget)
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
            let row = rows.remove(pos);
            *budget += row.len;
            self.release_row_snapshots(&row.snapshots);
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
                    let want = self.chunk_cap(remaining, budget);
                    self.cap_to_point(id, seq.computed, want)
                };
                let Some(len) = self.grant_pages(id, want, &mut plan, &mut budget) else {
                    // The latest admitted waits for pages: it is the last
                    // running sequence, so this phase is done.
                    break;
                };
                let start = self.seqs[&id].computed;
                let (len, snapshots) = self.reserve_row_snapshots(id, start, len);
                let seq = &self.seqs[&id];
                plan.rows.push(Scheduled {
                    id,
                    start,
                    len,
                    sample: start + len == seq.tokens.len(),
                    snapshots,
                });
                budget -= len;
                i += 1;
            }
        }
        self.admit(&mut plan, &mut budget);
        // Drops of snapshots evicted while planning go with the restores,
        // in the order they were decided.
        plan.cache_ops = std::mem::take(&mut self.cache_ops);
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
            // Running sequences come before the cache: evict it first.
            if let Some(prefix) = self.cache.as_mut() {
                let seq = &self.seqs[&id];
                let cache = seq.cache.as_ref().expect("running sequence has a cache");
                let need = self.alloc.pages_missing(cache, seq.computed + want);
                if need > self.alloc.pages_free() {
                    prefix.evict_pages(need, &mut self.alloc, &mut self.cache_ops, None);
                }
            }
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

    /// FCFS admission of waiting sequences into the remaining budget. A
    /// sequence that waits for a running one's pending snapshot is passed
    /// over for this step only (it cannot start before that snapshot is
    /// published after a step, and the queue would otherwise idle behind
    /// it); it keeps its place, and anything that does not fit still stops
    /// admission, so nobody overtakes a sequence that waits for resources.
    fn admit(&mut self, plan: &mut Plan, budget: &mut usize) {
        let mut next = 0;
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.get(next) else {
                break;
            };
            // Pages ran out in this step: admitting now would only make the
            // next preemption victim (vLLM v1 skips admission likewise).
            if !plan.preempted.is_empty() {
                break;
            }
            let seq = &self.seqs[&id];
            let (hit, kv_matched) = match self.cache.as_mut() {
                Some(prefix) => prefix.lookup(&seq.tokens, seq.tokens.len() - 1),
                None => (None, 0),
            };
            let branch = match self.cache {
                Some(_) => {
                    let at = hit.as_ref().map_or(0, |h| h.position);
                    self.branch(id, at, kv_matched, plan, budget)
                }
                None => Branch::None,
            };
            // A running sequence will publish a deeper snapshot this one
            // can use: wait for it, and let the sequences behind it in.
            let new_point = match branch {
                Branch::Wait | Branch::Carry { .. } => {
                    plan.waiting_for_snapshot.push(id);
                    next += 1;
                    continue;
                }
                Branch::None => None,
                Branch::Own(q) => self.add_point(id, q).then_some(q),
            };
            // Leave one free page per running sequence for its growth in the
            // next steps, or the newcomer would be preempted at once (and
            // its prefill thrown away) as soon as an older one needs a page.
            let reserve = self.running.len();
            // A hit keeps its own pages from eviction (and needs one more
            // for the tail copy): when that does not fit, start from 0.
            if self.alloc.slots_free() == 0 {
                break;
            }
            let candidates = match hit {
                Some(hit) => vec![Some(hit), None],
                None => vec![None],
            };
            let mut admitted = None;
            for hit in candidates {
                if let Some(fit) = self.fit(id, hit, reserve, *budget) {
                    admitted = Some(fit);
                    break;
                }
            }
            let Some((hit, cache, len)) = admitted else {
                if let Some(q) = new_point {
                    self.remove_point(id, q);
                }
                break;
            };
            if new_point.is_some() {
                if let Some(prefix) = self.cache.as_mut() {
                    prefix.note_branch_point();
                }
            }
            let start = hit.as_ref().map_or(0, |h| h.position);
            if let Some(hit) = &hit {
                if let Some(from) = hit.tail_page {
                    let to = cache.pages[hit.pages.len()];
                    self.cache_ops.push(CacheOp::CopyPage { from, to });
                }
                self.cache_ops.push(CacheOp::Restore {
                    snapshot: hit.snapshot,
                    slot: cache.slot,
                });
            }
            self.waiting.remove(next);
            let seq = self.seqs.get_mut(&id).expect("waiting sequence");
            seq.cache = Some(cache);
            seq.computed = start;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = start;
                plan.first_admitted.push(id);
                let (queried, limit) = (seq.tokens.len(), seq.tokens.len() - 1);
                if let Some(prefix) = self.cache.as_mut() {
                    prefix.record(queried, start, kv_matched, limit);
                }
            }
            self.running.push(id);
            let (len, snapshots) = self.reserve_row_snapshots(id, start, len);
            let seq = &self.seqs[&id];
            plan.rows.push(Scheduled {
                id,
                start,
                len,
                sample: start + len == seq.tokens.len(),
                snapshots,
            });
            *budget -= len;
        }
    }

    /// Pages and a slot for waiting `id` to start at `hit` (or at 0): the
    /// cache gives pages back first. `None` (nothing taken): no slot, or
    /// not one token fits.
    fn fit(
        &mut self,
        id: RequestId,
        hit: Option<Hit>,
        reserve: usize,
        budget: usize,
    ) -> Option<(Option<Hit>, SeqCache, usize)> {
        let seq = &self.seqs[&id];
        let start = hit.as_ref().map_or(0, |h| h.position);
        let shared = hit.as_ref().map_or(&[][..], |h| &h.pages[..]);
        let want = self.cap_to_point(id, start, self.chunk_cap(seq.tokens.len() - start, budget));
        let fresh = self.alloc.pages_for(start + want) - shared.len();
        if let Some(prefix) = self.cache.as_mut() {
            if fresh + reserve > self.alloc.pages_free() {
                let keep = hit.as_ref().map(|h| h.snapshot);
                prefix.evict_pages(fresh + reserve, &mut self.alloc, &mut self.cache_ops, keep);
            }
        }
        let spare_pages = self.alloc.pages_free().saturating_sub(reserve);
        let room = (shared.len() + spare_pages) * self.alloc.page_size();
        let len = want.min(room.saturating_sub(start));
        if len == 0 {
            return None;
        }
        let cache = self.alloc.open_shared(shared, start + len)?;
        Some((hit, cache, len))
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
    pub fn step_rows<'a>(&'a self, plan: &'a Plan, banned: &'a [Vec<u32>]) -> Vec<StepRow<'a>> {
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
                    snapshots: &row.snapshots,
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
            self.publish_taken(row.id, &row.snapshots);
            let seq = self.seqs.get_mut(&row.id).expect("scheduled sequence");
            if !row.sample {
                self.publish_state(row.id, false);
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

#[path = "scheduler_points.rs"]
mod points;
pub use crate::prefix_cache::{snapshot_points, MARKER_COVERS_END};

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
