//! Eviction: what saves the least recompute per byte goes first, the least
//! recently used among equals.
//!
//! **Cost model.** A snapshot at position p saves a hit the prefill of the
//! tokens between p and the next shallower snapshot on its path (the one a
//! hit would fall back to without it), or of all p tokens when there is
//! none: its *saved tokens*. Each prompt token is taken to cost the same
//! to prefill (the linear layers dominate at these lengths; attention's
//! growth with position is ignored), so saved tokens stand for saved time.
//! Bytes are counted per pool, because the two pools are separate memory:
//!
//! - the snapshot pool is full: every snapshot weighs the same, so the
//!   snapshot with the fewest saved tokens goes, unless the new one would
//!   save fewer still (a lower class): then the new one is not taken;
//! - running requests need KV pages: a unit (a tail: its snapshot and its
//!   page; a leaf of the trie: its page and the tails on it) is ranked by
//!   the saved tokens of the snapshots it takes with it per KV page it
//!   frees; a leaf without tails serves no hit and saves nothing. Units
//!   that free no page (their pages are also held by running requests)
//!   come last. Pressure from running requests always wins: eviction goes
//!   on, whatever the value, until the pages are free.
//!
//! Values are compared by their power of two (values within a factor of
//! two are a tie): the model is rough (it knows neither how often a prefix
//! will come back nor the per-position cost), so close values are left to
//! recency. An old snapshot of a long shared prefix outlives recent small
//! ones (a request's last-but-one and end-of-generation snapshots, which
//! save only the tokens past the shared prefix once a branch snapshot
//! exists); a new long prefix replaces an old one of the same class by LRU.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::trie::{CacheOp, PrefixCache, ROOT};
use crate::allocator::Allocator;
use crate::executor::SnapshotId;

/// Why [`PrefixCache::free_snapshot`] gave no id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NoSnapshot {
    /// Every id is reserved, or the pool is empty.
    NoId,
    /// Every snapshot held saves more than the new one would.
    WorthLess,
}

/// What page eviction can remove: a tail (by node and snapshot), or a leaf
/// node with its tails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Tail(usize, SnapshotId),
    Leaf(usize),
}

/// Eviction order, smallest first: frees no page, value class, last use.
type Rank = Reverse<(bool, u32, u64, Unit)>;

/// The class of a value: its bit length (0 for 0), so values within a
/// factor of two compare equal.
pub(super) fn value_class(value: usize) -> u32 {
    usize::BITS - value.leading_zeros()
}

impl PrefixCache {
    /// Position of tail `t` of node `n`.
    fn tail_position(&self, n: usize, t: usize) -> usize {
        let node = self.node(n);
        node.depth * self.page_size + node.tails[t].tokens.len()
    }

    /// The prefill tokens a hit on tail `t` of node `n` saves over the next
    /// shallower snapshot on its path (see the module doc).
    pub(super) fn saved_tokens(&self, n: usize, t: usize) -> usize {
        let ps = self.page_size;
        let node = self.node(n);
        let own = &node.tails[t].tokens;
        // Shallower tails of the same node whose tokens prefix this one's.
        let mut below = node
            .tails
            .iter()
            .filter(|u| u.tokens.len() < own.len() && own.starts_with(&u.tokens))
            .map(|u| node.depth * ps + u.tokens.len())
            .max();
        // Else the deepest tail of an ancestor that prefixes the path.
        let mut child = n;
        while below.is_none() && child != ROOT {
            let key = &self.node(child).key;
            let parent = self.node(self.node(child).parent);
            below = parent
                .tails
                .iter()
                .filter(|u| key.starts_with(&u.tokens))
                .map(|u| parent.depth * ps + u.tokens.len())
                .max();
            child = self.node(child).parent;
        }
        self.tail_position(n, t) - below.unwrap_or(0)
    }

    /// The tokens a new snapshot after `tokens` would save: the
    /// [`Self::saved_tokens`] it would have once inserted (over the deepest
    /// existing snapshot on its path that prefixes it).
    pub(super) fn saved_by_new(&self, tokens: &[u32]) -> usize {
        let ps = self.page_size;
        let mut below = 0;
        let (mut at, mut depth) = (Some(ROOT), 0);
        while let Some(n) = at {
            let node = self.node(n);
            let rest = &tokens[depth * ps..];
            for u in &node.tails {
                if u.tokens.len() < rest.len() && rest.starts_with(&u.tokens) {
                    below = below.max(depth * ps + u.tokens.len());
                }
            }
            at = rest
                .get(..ps)
                .and_then(|key| node.children.get(key).copied());
            depth += 1;
        }
        tokens.len() - below
    }

    /// A free snapshot id for a new snapshot that saves `worth` tokens,
    /// evicting the snapshot that saves the fewest (least recently used
    /// among equals) when none is free. `NoId` when there are no snapshots
    /// at all (every id reserved); `WorthLess` when every snapshot held
    /// saves more than the new one would (a lower value class): a full pool
    /// is not churned by the
    /// requests' own small points (last-but-one, end of generation), which
    /// would otherwise displace a shared prefix's branch snapshot.
    pub(super) fn free_snapshot(
        &mut self,
        worth: usize,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) -> Result<SnapshotId, NoSnapshot> {
        if let Some(id) = self.free_snapshots.pop() {
            return Ok(id);
        }
        let mut victim: Option<((u32, u64), usize, usize)> = None;
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            for (t, tail) in node.tails.iter().enumerate() {
                let rank = (value_class(self.saved_tokens(i, t)), tail.last_used);
                if victim.is_none_or(|(best, _, _)| rank < best) {
                    victim = Some((rank, i, t));
                }
            }
        }
        let ((class, _), n, t) = victim.ok_or(NoSnapshot::NoId)?;
        if value_class(worth) < class {
            return Err(NoSnapshot::WorthLess);
        }
        self.remove_tail(n, t, alloc, ops);
        self.free_snapshots.pop().ok_or(NoSnapshot::NoId)
    }

    /// Pages that evicting node `n` (a leaf) and its tails would free.
    fn frees(&self, n: usize, alloc: &Allocator) -> usize {
        let node = self.node(n);
        node.page
            .iter()
            .chain(node.tails.iter().filter_map(|t| t.page.as_ref()))
            .filter(|&&p| alloc.page_refs(p) == 1)
            .count()
    }

    /// Evicts until `want` pages are free, in the order of the module doc
    /// (units that free no page last: their pages are also held by running
    /// requests, but removing one may make a freeable parent a leaf).
    /// Returns whether `want` pages are free; false only once nothing is
    /// left to evict. `keep`: a hit being admitted, whose snapshot (and
    /// path) must survive.
    pub fn evict_pages(
        &mut self,
        want: usize,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
        keep: Option<SnapshotId>,
    ) -> bool {
        if alloc.pages_free() >= want {
            return true;
        }
        // One pass ranks the candidates; a leaf's parent joins them when it
        // becomes a leaf. Ranks are not updated as units go (a removed
        // snapshot raises the value of deeper ones on its path): one call
        // frees what running requests need now.
        let mut heap = BinaryHeap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            for (t, tail) in node.tails.iter().enumerate() {
                if Some(tail.snapshot) == keep {
                    continue;
                }
                let frees = tail.page.is_some_and(|p| alloc.page_refs(p) == 1);
                heap.push(Reverse((
                    !frees,
                    value_class(self.saved_tokens(i, t)),
                    tail.last_used,
                    Unit::Tail(i, tail.snapshot),
                )));
            }
            heap.extend(self.leaf_unit(i, alloc, keep));
        }
        while alloc.pages_free() < want {
            let Some(Reverse((_, _, _, unit))) = heap.pop() else {
                return false;
            };
            match unit {
                Unit::Tail(n, id) => {
                    // Gone already with its leaf?
                    let at = self.nodes[n]
                        .as_ref()
                        .and_then(|node| node.tails.iter().position(|t| t.snapshot == id));
                    if let Some(t) = at {
                        self.remove_tail(n, t, alloc, ops);
                    }
                }
                Unit::Leaf(n) => {
                    let parent = self.node(n).parent;
                    self.remove_leaf(n, alloc, ops);
                    heap.extend(self.leaf_unit(parent, alloc, keep));
                }
            }
        }
        true
    }

    /// Node `i` as an eviction candidate: a leaf (not the root) without the
    /// kept snapshot, ranked by the saved tokens of its tails per page it
    /// frees.
    fn leaf_unit(&self, i: usize, alloc: &Allocator, keep: Option<SnapshotId>) -> Option<Rank> {
        let node = self.node(i);
        if i == ROOT
            || !node.children.is_empty()
            || node.tails.iter().any(|t| Some(t.snapshot) == keep)
        {
            return None;
        }
        let used = node
            .tails
            .iter()
            .map(|t| t.last_used)
            .fold(node.last_used, u64::max);
        let saved: usize = (0..node.tails.len()).map(|t| self.saved_tokens(i, t)).sum();
        let frees = self.frees(i, alloc);
        let class = value_class(saved / frees.max(1));
        Some(Reverse((frees == 0, class, used, Unit::Leaf(i))))
    }
}
