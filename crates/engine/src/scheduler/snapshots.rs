//! The prefix cache's points on the scheduler's sequences and rows: the
//! branch decision applied, in-step snapshots reserved for a planned row
//! (or the row cut at a point), states published after a committed step,
//! reservations given back after a failed one. Where the points lie is the
//! prefix cache's policy ([`crate::prefix_cache`]'s `points.rs`).

use super::plan::{Plan, Scheduled};
use super::state::Scheduler;
use crate::executor::RowSnapshot;
use crate::prefix_cache::{branch_point, Branch, Reservation, Sharer};
use crate::request::RequestId;

impl Scheduler {
    /// The branch decision for waiting `id` with a hit at `hit` and the
    /// cached KV matching its tokens up to `kv_matched`
    /// ([`crate::prefix_cache`]'s `points.rs`), applied: a running sequence
    /// chosen to carry the point gets it, its row of this step (if planned
    /// past the point) taking the snapshot inside the step or stopping
    /// there.
    pub(super) fn branch(
        &mut self,
        id: RequestId,
        hit: usize,
        kv_matched: usize,
        plan: &mut Plan,
        budget: &mut usize,
    ) -> Branch {
        let seq = &self.seqs[&id];
        let running = self.running.iter().map(|r| {
            let other = &self.seqs[r];
            Sharer {
                tokens: &other.tokens,
                points: &other.points,
                computed: other.computed,
            }
        });
        let decision = branch_point(
            &seq.tokens,
            hit,
            kv_matched,
            self.alloc.page_size(),
            running,
        );
        if let Branch::Carry { running, at } = decision {
            let r = self.running[running];
            if let Some(i) = plan.rows.iter().position(|row| row.id == r) {
                if plan.rows[i].start + plan.rows[i].len > at {
                    self.point_in_row(&mut plan.rows[i], at, budget);
                }
            }
            self.add_point(r, at);
            if let Some(prefix) = self.cache.as_mut() {
                prefix.note_branch_point();
            }
        }
        decision
    }

    /// Schedules `len` tokens of `id` from `start` (its snapshot points
    /// reserved, which may end the chunk earlier) and returns the tokens
    /// the row takes from the step's budget.
    pub(super) fn schedule_row(
        &mut self,
        plan: &mut Plan,
        id: RequestId,
        start: usize,
        len: usize,
    ) -> usize {
        let (len, snapshots) = self.reserve_row_snapshots(id, start, len);
        plan.rows.push(Scheduled {
            id,
            start,
            len,
            sample: start + len == self.seqs[&id].tokens.len(),
            snapshots,
        });
        len
    }

    /// Reserves a snapshot for each point inside the chunk of `len` tokens
    /// from `start` (already capped: at most `row_snapshots` of them). A
    /// point whose snapshot exists takes none; a point that can get none
    /// (the pool is all reserved) ends the chunk there instead, as without
    /// the in-step snapshot. Returns the chunk's length and its snapshots.
    pub(super) fn reserve_row_snapshots(
        &mut self,
        id: RequestId,
        start: usize,
        len: usize,
    ) -> (usize, Vec<RowSnapshot>) {
        let mut taken = Vec::new();
        let Some(prefix) = self.cache.as_mut() else {
            return (len, taken);
        };
        let seq = &self.seqs[&id];
        // A later point's snapshot saves only what lies past the row's
        // previous one (reserved here, so not yet in the trie).
        let mut floor = 0;
        for &q in seq.points.iter().filter(|&&q| q > start && q < start + len) {
            let tokens = &seq.tokens[..q];
            match prefix.reserve(tokens, floor, &mut self.alloc, &mut self.cache_ops) {
                Reservation::Exists => floor = q,
                Reservation::Reserved(snapshot) => {
                    taken.push(RowSnapshot { at: q, snapshot });
                    floor = q;
                }
                Reservation::NotWorth => {}
                Reservation::Unavailable => return (q - start, taken),
            }
        }
        (len, taken)
    }

    /// Gives back the snapshots reserved for `row` (dropped from the plan,
    /// or its step failed).
    pub(super) fn release_row_snapshots(&mut self, snapshots: &[RowSnapshot]) {
        if let Some(prefix) = self.cache.as_mut() {
            for s in snapshots {
                prefix.release(s.snapshot, &mut self.cache_ops);
            }
        }
    }

    /// The step of `plan` did not run to the end (it failed or was
    /// refused): the snapshots its rows reserved are given back unpublished.
    /// Call before removing the step's requests.
    pub fn abandon(&mut self, plan: &Plan) {
        for row in &plan.rows {
            self.release_row_snapshots(&row.snapshots);
        }
    }

    /// A point `q` found for planned `row`, inside it: the row takes the
    /// snapshot inside the step when it has room for one more and one can
    /// be reserved; else it stops at `q` (its later reservations given
    /// back, the tokens past `q` back in the step's budget).
    fn point_in_row(&mut self, row: &mut Scheduled, q: usize, budget: &mut usize) {
        debug_assert!(row.start < q && q < row.start + row.len);
        if row.snapshots.iter().any(|s| s.at == q) {
            return;
        }
        if row.snapshots.len() < self.config.row_snapshots {
            if let Some(prefix) = self.cache.as_mut() {
                let tokens = &self.seqs[&row.id].tokens[..q];
                let at = row.snapshots.partition_point(|s| s.at < q);
                let floor = at.checked_sub(1).map_or(0, |i| row.snapshots[i].at);
                match prefix.reserve(tokens, floor, &mut self.alloc, &mut self.cache_ops) {
                    Reservation::Reserved(snapshot) => {
                        row.snapshots.insert(at, RowSnapshot { at: q, snapshot });
                        return;
                    }
                    Reservation::Exists | Reservation::NotWorth => return,
                    Reservation::Unavailable => {}
                }
            }
        }
        *budget += row.start + row.len - q;
        row.len = q - row.start;
        row.sample = false;
        let (keep, past): (Vec<RowSnapshot>, Vec<RowSnapshot>) =
            row.snapshots.iter().partition(|s| s.at < q);
        row.snapshots = keep;
        self.release_row_snapshots(&past);
    }

    /// The caller's points for queued `id` (e.g. the end of a chat's
    /// system preamble), kept when there is a cache and the point lies
    /// within the prompt at least a page in: a shorter prefix saves less
    /// prefill than its snapshot costs.
    pub fn add_snapshot_points(&mut self, id: RequestId, points: &[usize]) {
        if self.cache.is_none() {
            return;
        }
        let prompt_len = self.seqs[&id].prompt_len;
        for &q in points {
            if q >= self.alloc.page_size() && q < prompt_len {
                self.add_point(id, q);
            }
        }
    }

    /// Adds snapshot point `q` to `id`; false if it was there already.
    pub(super) fn add_point(&mut self, id: RequestId, q: usize) -> bool {
        let points = &mut self.seqs.get_mut(&id).expect("known sequence").points;
        match points.binary_search(&q) {
            Ok(_) => false,
            Err(at) => {
                points.insert(at, q);
                true
            }
        }
    }

    pub(super) fn remove_point(&mut self, id: RequestId, q: usize) {
        let points = &mut self.seqs.get_mut(&id).expect("known sequence").points;
        if let Ok(at) = points.binary_search(&q) {
            points.remove(at);
        }
    }

    /// After a committed row: publishes the snapshots the executor took
    /// inside it (reserved at planning), in order.
    pub(super) fn publish_taken(&mut self, id: RequestId, snapshots: &[RowSnapshot]) {
        let Some(prefix) = self.cache.as_mut() else {
            return;
        };
        let seq = &self.seqs[&id];
        let cache = seq.cache.as_ref().expect("scheduled sequence has a cache");
        for s in snapshots {
            prefix.publish_taken(
                &seq.tokens[..s.at],
                &cache.pages,
                s.snapshot,
                &mut self.alloc,
                &mut self.cache_ops,
            );
        }
    }

    /// After a committed row: publishes the sequence's state to the prefix
    /// cache when it stands at a snapshot point, or when the sequence ends
    /// (the state after its last computed token: the next turn of a
    /// conversation re-sends prompt + answer).
    pub(super) fn publish_state(&mut self, id: RequestId, finishing: bool) {
        let Some(prefix) = self.cache.as_mut() else {
            return;
        };
        let seq = &self.seqs[&id];
        if !(finishing || seq.points.binary_search(&seq.computed).is_ok()) {
            return;
        }
        let cache = seq.cache.as_ref().expect("scheduled sequence has a cache");
        prefix.insert(
            &seq.tokens[..seq.computed],
            &cache.pages,
            cache.slot,
            &mut self.alloc,
            &mut self.cache_ops,
        );
    }
}
