//! FCFS admission of waiting sequences into what is left of the step: a
//! state slot, pages for the granted chunk with the policy's headroom kept
//! free (`headroom.rs`), a prefix-cache hit when one fits, and the branch decision
//! (a sequence that waits for a running one's snapshot is passed over for
//! the step).

use super::plan::Plan;
use super::policy::AdmissionPolicy;
use super::state::Scheduler;
use crate::allocator::SeqCache;
use crate::prefix_cache::{Branch, CacheOp, Hit};
use crate::request::RequestId;

impl Scheduler {
    /// FCFS admission of waiting sequences into the remaining budget. A
    /// sequence that waits for a running one's pending snapshot is passed
    /// over for this step only (it cannot start before that snapshot is
    /// published after a step, and the queue would otherwise idle behind
    /// it); it keeps its place, and anything that does not fit still stops
    /// admission, so nobody overtakes a sequence that waits for resources.
    pub(super) fn admit(&mut self, plan: &mut Plan, budget: &mut usize) {
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
            // Before the lookup: the eviction could take the hit's pages.
            if self.alloc.slots_free() == 0 {
                self.free_a_slot();
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
            // Leave the running sequences room for their growth in the next
            // steps (how much: the policy, `headroom.rs`), or the newcomer
            // would be preempted (its prefill thrown away) as soon as an
            // older one needs a page.
            let reserve = self.running_headroom();
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
            self.recomputed_tokens += seq.lost.saturating_sub(start) as u64;
            plan.recomputed_tokens += seq.lost.saturating_sub(start);
            seq.lost = 0;
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
            *budget -= self.schedule_row(plan, id, start, len);
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
        // Under a reserving policy the rest of the sequence's projected
        // length must fit too, or it is not admitted at all; with an arena
        // the slot's chunks come out of the pages.
        let reserve = reserve + self.own_headroom(id, start + want) + self.alloc.slot_cost_pages();
        if let Some(prefix) = self.cache.as_mut() {
            if fresh + reserve > self.alloc.pages_free() {
                let keep = hit.as_ref().map(|h| h.snapshot);
                prefix.evict_pages(fresh + reserve, &mut self.alloc, &mut self.cache_ops, keep);
            }
        }
        let spare_pages = self.alloc.pages_free().saturating_sub(reserve);
        let room = (shared.len() + spare_pages) * self.alloc.page_size();
        let len = want.min(room.saturating_sub(start));
        let reserving = self.config.admission != AdmissionPolicy::Watermark;
        if len == 0 || (reserving && len < want) {
            return None;
        }
        let cache = self.alloc.open_shared(shared, start + len)?;
        Some((hit, cache, len))
    }

    /// With an arena, slots come from chunks that prefix-cache pages may
    /// hold, scattered over page groups: evicts the cache until a slot can
    /// be had.
    fn free_a_slot(&mut self) {
        let Some(prefix) = self.cache.as_mut() else {
            return;
        };
        while self.alloc.slots_free() == 0 && self.alloc.slots_used() < self.alloc.slots_total() {
            let before = self.alloc.pages_free();
            prefix.evict_pages(before + 1, &mut self.alloc, &mut self.cache_ops, None);
            if self.alloc.pages_free() == before {
                break;
            }
        }
    }
}
