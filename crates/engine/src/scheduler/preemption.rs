//! Pages for running sequences: a prefill chunk shrinks to the free pages,
//! the prefix cache is evicted first, and when not one more token fits the
//! most recently admitted running sequence is preempted by recompute (the
//! rule is in the module doc of [`super`]).

use super::plan::{Plan, Scheduled};
use super::state::Scheduler;
use crate::request::RequestId;

impl Scheduler {
    /// Pages for `want` more tokens of running `id`. A prefill chunk shrinks
    /// to what the free pages hold; when not one more token fits, the latest
    /// admitted sequence is preempted (repeatedly). `None`: `id` is itself
    /// the latest admitted and waits for pages (no row this step).
    pub(super) fn grant_pages(
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

    /// Frees the most recently admitted running sequence and requeues it at
    /// the front of the waiting queue; drops its row from `rows` if it had one.
    fn preempt_latest(&mut self, rows: &mut Vec<Scheduled>, budget: &mut usize) -> RequestId {
        let victim = self.running.pop().expect("a running sequence to preempt");
        let seq = self.seqs.get_mut(&victim).expect("running sequence");
        if let Some(cache) = seq.cache.take() {
            self.alloc.close(cache);
        }
        seq.lost = seq.lost.max(seq.computed);
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
}
