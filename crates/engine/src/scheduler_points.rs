//! Where the scheduler publishes states to the prefix cache: the points a
//! prompt carries from the start ([`snapshot_points`]), and branch points
//! found at admission ([`Scheduler::branch`]).
//!
//! **Branch points.** A shared prefix without a snapshot point of its own
//! (a system prompt sent through raw completions, documents that share a
//! preamble) would never be served: every sharer's KV match runs past the
//! last snapshot and the state there does not exist. So when a waiting
//! sequence shares at least a page of tokens beyond its hit, either with
//! the cached KV or with a running sequence's tokens, the point where the
//! sharing ends becomes a snapshot point: the next sharers resume there.
//! The point is exact to the token, not rounded down to a page: the
//! kernels can end a chunk at any token, and the sharers diverge exactly
//! there; a page-aligned point would make every hit recompute up to a page
//! of shared tokens to save one page copy per hit and one tail page held.
//!
//! Who takes it: the earliest admitted running sequence that shares the
//! prefix and has not computed past it (its prefill stops there, its row
//! of the step being planned shortened if it went past, or taking the
//! snapshot inside the row; nothing is computed twice) and the newcomer
//! waits; else the newcomer itself (the others passed the point already). A newcomer that finds a running
//! sequence's point still ahead (a branch, marker or last-but-one point it
//! shares, at least a page beyond its own hit) waits for it rather than
//! taking a second snapshot of the same prefix: requests of one group that
//! arrive together are served by one snapshot. Waiting ends: the point is
//! ahead of a running sequence, which either reaches it or leaves the
//! running set. Meanwhile the sequences behind the waiter may be admitted
//! (it is passed over for the step, keeping its place in the queue): a
//! group's pending snapshot does not hold up the other groups' requests.
//!
//! A snapshot is published only after a committed step, copied from the
//! slot of the sequence standing at the point (after the step, or inside
//! it into an id reserved at planning: the in-step snapshot) into the pool
//! (never a running slot), and resumed by copy: a published snapshot is
//! never written. With the in-step snapshot a running sharer's planned row
//! that runs past a new branch point takes the snapshot inside the row
//! instead of being cut there.

use super::{Plan, RequestId, Scheduler};
use crate::executor::RowSnapshot;
use crate::prefix_cache::{common_prefix, PrefixCacheConfig, Reservation};

/// What admission does about the prefix a waiting sequence shares beyond
/// its hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Branch {
    /// Nothing worth a snapshot.
    None,
    /// A running sequence will publish a snapshot this one can use.
    Wait,
    /// This sequence's prefill stops at the point and publishes there.
    Own(usize),
}

impl Scheduler {
    /// The branch decision for waiting `id` with a hit at `hit` and the
    /// cached KV matching its tokens up to `kv_matched` (see the module
    /// doc). May add the point to a running sequence.
    pub(super) fn branch(
        &mut self,
        id: RequestId,
        hit: usize,
        kv_matched: usize,
        plan: &mut Plan,
        budget: &mut usize,
    ) -> Branch {
        let seq = &self.seqs[&id];
        // The last prompt token is always computed (its logits sample).
        let limit = seq.tokens.len() - 1;
        let worth = |q: usize| q <= limit && q >= hit + self.alloc.page_size();
        let mut deepest = kv_matched.min(limit);
        // (running sequence, tokens shared with it, computed before this step).
        let mut shares = Vec::with_capacity(self.running.len());
        for &r in &self.running {
            let other = &self.seqs[&r];
            let shared = common_prefix(&seq.tokens, &other.tokens).min(limit);
            let pending = other
                .points
                .iter()
                .any(|&q| q > other.computed && q <= shared && worth(q));
            if pending {
                return Branch::Wait;
            }
            shares.push((r, shared, other.computed));
            deepest = deepest.max(shared);
        }
        if !worth(deepest) {
            return Branch::None;
        }
        let carrier = shares
            .iter()
            .find(|&&(_, shared, computed)| shared >= deepest && computed < deepest);
        let Some(&(r, _, _)) = carrier else {
            return Branch::Own(deepest);
        };
        // Its row of this step, if planned past the point, takes the
        // snapshot inside the step, or else stops there.
        if let Some(at) = plan.rows.iter().position(|row| row.id == r) {
            if plan.rows[at].start + plan.rows[at].len > deepest {
                self.point_in_row(&mut plan.rows[at], deepest, budget);
            }
        }
        self.add_point(r, deepest);
        if let Some(prefix) = self.cache.as_mut() {
            prefix.note_branch_point();
        }
        Branch::Wait
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
    fn point_in_row(&mut self, row: &mut super::Scheduled, q: usize, budget: &mut usize) {
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

/// A marker point this close to the prompt's end makes the last-but-one
/// point redundant: a repeat resumes there and recomputes a few tokens
/// (chat: `<think>\n` after `<|im_start|>assistant\n`), which costs less
/// than another snapshot and another prefill chunk.
pub const MARKER_COVERS_END: usize = 16;

/// Where a prompt's state is published: after the last occurrence of each
/// marker; after its last-but-one token when the config asks (an exact
/// repeat must still compute the last prompt token, whose logits give the
/// first output token, so a snapshot at the very end could never serve it)
/// unless a marker point lies within [`MARKER_COVERS_END`] tokens before it; every
/// `snapshot_interval` tokens. Ascending, each at most once, all within the
/// prompt, none at 0.
pub fn snapshot_points(prompt: &[u32], config: &PrefixCacheConfig) -> Vec<usize> {
    let mut points = vec![];
    for marker in config.snapshot_after.iter().filter(|m| !m.is_empty()) {
        if let Some(at) = prompt.windows(marker.len()).rposition(|w| w == &marker[..]) {
            points.push(at + marker.len());
        }
    }
    let last_but_one = prompt.len() - 1;
    if config.snapshot_before_last_token
        && !points
            .iter()
            .any(|&q| q + MARKER_COVERS_END >= last_but_one)
    {
        points.push(last_but_one);
    }
    if config.snapshot_interval > 0 {
        points.extend(
            (1..)
                .map(|k| k * config.snapshot_interval)
                .take_while(|&q| q < prompt.len()),
        );
    }
    points.retain(|&q| q > 0 && q < prompt.len());
    points.sort_unstable();
    points.dedup();
    points
}
