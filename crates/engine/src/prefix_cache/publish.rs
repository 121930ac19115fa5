//! Adding snapshots: publishing a slot's state after a step (a copy into
//! the pool), or reserving an id for the executor to take the state into
//! inside a step and publishing it once the step succeeded; giving a
//! reservation back when it did not.

use super::eviction::NoSnapshot;
use super::trie::{CacheOp, PrefixCache, Tail, ROOT};
use crate::allocator::Allocator;
use crate::executor::{PageId, SlotId, SnapshotId};

/// What [`PrefixCache::reserve`] found for a snapshot point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// A snapshot of this exact prefix exists: nothing to take.
    Exists,
    /// The executor takes the state into this snapshot inside the step.
    Reserved(SnapshotId),
    /// No snapshot can be had (every id reserved, or none at all).
    Unavailable,
    /// The pool is full of snapshots that each save more than this one
    /// would: none is taken, and the point is passed (not worth a chunk
    /// boundary either).
    NotWorth,
}

/// Where a published snapshot's state comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Copied from the slot after the step ([`CacheOp::Take`]).
    Slot(SlotId),
    /// Taken by the executor inside the step (reserved).
    Taken(SnapshotId),
}

impl PrefixCache {
    /// Publishes the state `slot` holds after `tokens` (whose KV is in
    /// `pages`, position order): the full pages join the trie (held), and a
    /// snapshot is taken unless one exists at this exact prefix. Returns
    /// false when no snapshot could be had (budget 0, or a full pool whose
    /// every snapshot saves more: see `free_snapshot`).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        pages: &[PageId],
        slot: SlotId,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) -> bool {
        self.attach(tokens, pages, Source::Slot(slot), alloc, ops)
    }

    /// For a snapshot point inside a planned row (the in-step snapshot):
    /// whether a snapshot exists at this exact prefix already, else a
    /// snapshot id for the executor to take the state into during the
    /// step (evicting as [`Self::insert`] would). A reserved id is in no
    /// tail, so no lookup finds it and no eviction takes it, until
    /// [`Self::publish_taken`] (the step succeeded) or [`Self::release`].
    /// `floor`: the row's own point below this one that is reserved or
    /// exists (0 if none), which the snapshot's worth is counted from when
    /// it is deeper than every published snapshot on the path.
    pub fn reserve(
        &mut self,
        tokens: &[u32],
        floor: usize,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) -> Reservation {
        let ps = self.page_size;
        let mut at = Some(ROOT);
        for key in tokens.chunks_exact(ps) {
            at = at.and_then(|n| self.node(n).children.get(key).copied());
        }
        let tail_tokens = &tokens[tokens.len() / ps * ps..];
        if let Some(n) = at {
            if self.node(n).tails.iter().any(|t| t.tokens == tail_tokens) {
                return Reservation::Exists;
            }
        }
        let worth = self
            .saved_by_new(tokens)
            .min(tokens.len() - floor.min(tokens.len()));
        match self.free_snapshot(worth, alloc, ops) {
            Ok(id) => {
                self.reserved += 1;
                Reservation::Reserved(id)
            }
            Err(NoSnapshot::NoId) => Reservation::Unavailable,
            Err(NoSnapshot::WorthLess) => Reservation::NotWorth,
        }
    }

    /// Publishes the state the executor took into reserved `snapshot`
    /// inside a step that succeeded, after `tokens` (KV in `pages`): as
    /// [`Self::insert`], without a copy. If a snapshot of this prefix
    /// appeared meanwhile (another row of the same step), the reserved one
    /// is given back.
    pub fn publish_taken(
        &mut self,
        tokens: &[u32],
        pages: &[PageId],
        snapshot: SnapshotId,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) {
        self.attach(tokens, pages, Source::Taken(snapshot), alloc, ops);
    }

    /// Gives a reserved snapshot back (its step failed, or its row was
    /// dropped or cut before the point): what the executor may have
    /// written there is dropped.
    pub fn release(&mut self, snapshot: SnapshotId, ops: &mut Vec<CacheOp>) {
        assert!(
            self.reserved > 0,
            "release of {snapshot:?}: nothing reserved"
        );
        self.reserved -= 1;
        ops.push(CacheOp::Drop(snapshot));
        self.free_snapshots.push(snapshot);
    }

    /// Snapshot ids reserved and neither published nor released.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    fn attach(
        &mut self,
        tokens: &[u32],
        pages: &[PageId],
        source: Source,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) -> bool {
        let ps = self.page_size;
        let p = tokens.len();
        assert!(
            p > 0 && pages.len() * ps >= p,
            "pages must cover the tokens"
        );
        let now = self.next_tick();
        let mut at = ROOT;
        self.node_mut(ROOT).last_used = now;
        for (j, key) in tokens.chunks_exact(ps).enumerate() {
            at = match self.node(at).children.get(key) {
                Some(&child) => child,
                None => {
                    alloc.cache_retain(pages[j]);
                    self.stats.pages += 1;
                    self.add_node(at, key.to_vec(), pages[j])
                }
            };
            self.node_mut(at).last_used = now;
        }
        let tail_tokens = &tokens[p / ps * ps..];
        if let Some(tail) = self
            .node_mut(at)
            .tails
            .iter_mut()
            .find(|t| t.tokens == tail_tokens)
        {
            tail.last_used = now;
            if let Source::Taken(snapshot) = source {
                self.release(snapshot, ops);
            }
            return true;
        }
        let snapshot = match source {
            Source::Slot(slot) => {
                let worth = self.saved_by_new(tokens);
                let Ok(snapshot) = self.free_snapshot(worth, alloc, ops) else {
                    return false;
                };
                ops.push(CacheOp::Take { slot, snapshot });
                snapshot
            }
            Source::Taken(snapshot) => {
                assert!(self.reserved > 0, "publish of {snapshot:?}: not reserved");
                self.reserved -= 1;
                snapshot
            }
        };
        // Eviction for the snapshot never removes nodes, so `at` stands.
        let page = (!tail_tokens.is_empty()).then(|| pages[p / ps]);
        if let Some(page) = page {
            alloc.cache_retain(page);
            self.stats.pages += 1;
        }
        let tail = Tail {
            tokens: tail_tokens.to_vec(),
            page,
            snapshot,
            last_used: now,
        };
        self.node_mut(at).tails.push(tail);
        self.stats.snapshots += 1;
        self.stats.snapshots_taken += 1;
        true
    }
}
