//! The prefix cache for a hybrid model: a trie over full KV pages, with
//! recurrent-state snapshots attached at exact positions.
//!
//! A sequence's KV at position i depends only on its tokens up to i, so a
//! full page of KV can be shared by every sequence that starts with the same
//! tokens; the trie's nodes are such pages (key: the page's tokens), held
//! through the allocator's reference counts. The DeltaNet layers, however,
//! carry a state that exists only where a step stopped: KV alone cannot
//! resume a sequence. So a node also holds *tails*: a snapshot of the state
//! after `depth * page_size + tail.len()` tokens (taken into the executor's
//! snapshot pool, never a running slot) and, when the tail is not empty, the
//! page holding the tail's KV. A hit is the longest prefix p with KV up to p
//! **and** a snapshot exactly at p; the request gets the full pages before
//! p shared (read-only: it writes from p on), a private copy of the tail
//! page (the positions from p on are its to write), and the snapshot copied
//! into its own slot.
//!
//! Eviction (`prefix_cache_evict.rs`) removes what saves the least recompute per byte
//! first, least recently used among equals: snapshots when the snapshot
//! budget is full, tails and leaves of the trie (a page and its tails) when
//! running requests need pages. Everything here only counts; the executor work it implies
//! (copies, snapshots, drops) is returned as [`CacheOp`]s for the engine to
//! run in order.

use std::collections::HashMap;

use crate::allocator::Allocator;
use crate::executor::{PageId, SlotId, SnapshotId};

/// How the engine uses the prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    pub enabled: bool,
    /// Snapshots kept at most (also capped by the executor's pool).
    pub max_snapshots: usize,
    /// Token sequences after whose last occurrence in a prompt the state is
    /// snapshotted (chat: `<|im_start|>assistant\n`, where the next turn's
    /// prompt leaves this one).
    pub snapshot_after: Vec<Vec<u32>>,
    /// Also snapshot at every multiple of this many prompt tokens (0: off).
    pub snapshot_interval: usize,
    /// Also snapshot before each prompt's last token, so that an exact
    /// repeat hits on its first repeat (the last token must be recomputed
    /// for its logits). Off in the server by default: the prefill then
    /// ends one token early and the last token waits for the next step,
    /// which under load is a full step (H200, 96 distinct prompts at c = 32:
    /// TTFT p50 313 -> 463 ms); without it repeats still hit from the
    /// second repeat on, through a branch point.
    pub snapshot_before_last_token: bool,
    /// Take snapshots inside a step when the executor can
    /// ([`crate::Executor::max_row_snapshots`]): a prefill chunk runs
    /// through its snapshot points instead of ending at each, so a point
    /// costs a second, small forward in the same step rather than a step
    /// of latency. Off: chunks end at points (as with an executor that
    /// cannot).
    pub in_step_snapshots: bool,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            enabled: false,
            max_snapshots: usize::MAX,
            snapshot_after: Vec::new(),
            snapshot_interval: 0,
            snapshot_before_last_token: true,
            in_step_snapshots: true,
        }
    }
}

/// Executor work the cache needs, in the order it must run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOp {
    /// Before the step: a hit's partial page, copied into the request's page.
    CopyPage { from: PageId, to: PageId },
    /// Before the step: a hit's snapshot, copied into the request's slot.
    Restore { snapshot: SnapshotId, slot: SlotId },
    /// After the step: the slot's state, copied into the snapshot.
    Take { slot: SlotId, snapshot: SnapshotId },
    /// The snapshot was evicted.
    Drop(SnapshotId),
}

/// Cumulative counts (and two levels) for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up (vLLM's `prefix_cache_queries`).
    pub queried_tokens: u64,
    /// Prompt tokens served from the cache (vLLM's `prefix_cache_hits`).
    pub hit_tokens: u64,
    /// Lookups that found a snapshot / found none.
    pub snapshot_hits: u64,
    pub snapshot_misses: u64,
    pub snapshots_taken: u64,
    pub snapshot_evictions: u64,
    /// Lookups whose KV match ran at least a page past the last usable
    /// snapshot, and the tokens of KV matched beyond it (recomputed, for
    /// want of a state).
    pub kv_only_unusable: u64,
    pub kv_only_unusable_tokens: u64,
    /// Branch points set (a shared prefix without a snapshot, see
    /// `scheduler`), whichever sequence takes them.
    pub branch_points: u64,
    /// Snapshots held now.
    pub snapshots: usize,
    /// Holds the trie has on pages now (a page may also be held by
    /// requests, and a page held as a full page and as a tail page counts
    /// twice).
    pub pages: usize,
}

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

/// Why [`PrefixCache::free_snapshot`] gave no id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoSnapshot {
    /// Every id is reserved, or the pool is empty.
    NoId,
    /// Every snapshot held saves more than the new one would.
    WorthLess,
}

/// Where a published snapshot's state comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Copied from the slot after the step ([`CacheOp::Take`]).
    Slot(SlotId),
    /// Taken by the executor inside the step (reserved).
    Taken(SnapshotId),
}

/// A lookup's result: resume at `position` from `snapshot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    pub position: usize,
    /// The full pages before `position` (shared, read-only).
    pub pages: Vec<PageId>,
    /// The page holding positions `pages.len() * page_size .. position`
    /// (`None` when `position` is a page boundary): to be copied.
    pub tail_page: Option<PageId>,
    pub snapshot: SnapshotId,
}

#[derive(Debug)]
struct Tail {
    tokens: Vec<u32>,
    page: Option<PageId>,
    snapshot: SnapshotId,
    last_used: u64,
}

#[derive(Debug)]
struct Node {
    parent: usize,
    /// The page's tokens (empty for the root).
    key: Vec<u32>,
    /// `None` for the root only.
    page: Option<PageId>,
    children: HashMap<Vec<u32>, usize>,
    tails: Vec<Tail>,
    last_used: u64,
    /// Full pages from the root to this node (0 for the root).
    depth: usize,
}

const ROOT: usize = 0;

#[derive(Debug)]
pub struct PrefixCache {
    page_size: usize,
    /// Slab of nodes (`None`: free); 0 is the root.
    nodes: Vec<Option<Node>>,
    free_nodes: Vec<usize>,
    free_snapshots: Vec<SnapshotId>,
    tick: u64,
    stats: PrefixCacheStats,
    /// Snapshot ids handed out by [`PrefixCache::reserve`], not yet
    /// published or released.
    reserved: usize,
}

impl PrefixCache {
    /// A cache over pages of `page_size` with `num_snapshots` snapshot ids.
    pub fn new(page_size: usize, num_snapshots: usize) -> Self {
        assert!(page_size > 0);
        let root = Node {
            parent: ROOT,
            key: Vec::new(),
            page: None,
            children: HashMap::new(),
            tails: Vec::new(),
            last_used: 0,
            depth: 0,
        };
        PrefixCache {
            page_size,
            nodes: vec![Some(root)],
            free_nodes: Vec::new(),
            free_snapshots: (0..num_snapshots as u32).rev().map(SnapshotId).collect(),
            tick: 0,
            stats: PrefixCacheStats::default(),
            reserved: 0,
        }
    }

    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node")
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The longest cached prefix of `tokens` no longer than `limit` (the
    /// caller keeps at least one token to compute), and how far the KV
    /// alone matched, to the token (full pages, then the longest common
    /// prefix with a cached page or tail where the prompt leaves the trie).
    /// Touches what it finds (LRU); counts nothing (see [`Self::record`]).
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> (Option<Hit>, usize) {
        let ps = self.page_size;
        let now = self.next_tick();
        let mut path = vec![ROOT];
        // (position, node, tail index) of the best snapshot so far.
        let mut best: Option<(usize, usize, usize)> = None;
        let mut kv_matched = 0;
        loop {
            let at = *path.last().expect("root");
            let depth = path.len() - 1;
            let base = depth * ps;
            for (t, tail) in self.node(at).tails.iter().enumerate() {
                let end = base + tail.tokens.len();
                if end <= tokens.len() && tokens[base..end] == tail.tokens[..] {
                    kv_matched = kv_matched.max(end);
                    if end <= limit && best.is_none_or(|(p, _, _)| end > p) {
                        best = Some((end, at, t));
                    }
                }
            }
            let child = tokens
                .get(base..base + ps)
                .and_then(|key| self.node(at).children.get(key));
            match child {
                Some(&child) => {
                    path.push(child);
                    kv_matched = kv_matched.max(base + ps);
                }
                None => {
                    // Where the prompt leaves the cached KV, to the token:
                    // a branch point (see `scheduler`) ends there.
                    let rest = &tokens[base..];
                    let node = self.node(at);
                    let partial = node
                        .children
                        .keys()
                        .map(Vec::as_slice)
                        .chain(node.tails.iter().map(|t| t.tokens.as_slice()))
                        .map(|cached| common_prefix(cached, rest))
                        .max()
                        .unwrap_or(0);
                    kv_matched = kv_matched.max(base + partial);
                    break;
                }
            }
        }
        let hit = best.map(|(position, at, t)| {
            let depth = position / ps;
            for &n in &path[..=depth] {
                self.node_mut(n).last_used = now;
            }
            let tail = &mut self.node_mut(at).tails[t];
            tail.last_used = now;
            let (tail_page, snapshot) = (tail.page, tail.snapshot);
            let pages = path[1..=depth]
                .iter()
                .map(|&n| self.node(n).page.expect("non-root node has a page"))
                .collect();
            Hit {
                position,
                pages,
                tail_page,
                snapshot,
            }
        });
        (hit, kv_matched)
    }

    pub fn note_branch_point(&mut self) {
        self.stats.branch_points += 1;
    }

    /// Counts a first admission's lookup: `queried` prompt tokens, `hit`
    /// of them served, KV matched up to `kv_matched` of the `limit` usable.
    pub fn record(&mut self, queried: usize, hit: usize, kv_matched: usize, limit: usize) {
        let s = &mut self.stats;
        s.queried_tokens += queried as u64;
        s.hit_tokens += hit as u64;
        if hit > 0 {
            s.snapshot_hits += 1;
        } else {
            s.snapshot_misses += 1;
        }
        // The match is to the token: a few shared tokens (a role header)
        // are no loss worth counting; a page or more is what a branch
        // point (see `scheduler`) would serve.
        let usable_kv = kv_matched.min(limit);
        if usable_kv >= hit + self.page_size {
            s.kv_only_unusable += 1;
            s.kv_only_unusable_tokens += (usable_kv - hit) as u64;
        }
    }

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

    fn add_node(&mut self, parent: usize, key: Vec<u32>, page: PageId) -> usize {
        let node = Node {
            parent,
            key: key.clone(),
            page: Some(page),
            children: HashMap::new(),
            tails: Vec::new(),
            last_used: self.tick,
            depth: self.node(parent).depth + 1,
        };
        let i = match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.node_mut(parent).children.insert(key, i);
        i
    }

    /// Evicts one tail: its snapshot is dropped, its page released.
    pub(crate) fn remove_tail(
        &mut self,
        n: usize,
        t: usize,
        alloc: &mut Allocator,
        ops: &mut Vec<CacheOp>,
    ) {
        let tail = self.node_mut(n).tails.swap_remove(t);
        self.stats.snapshots -= 1;
        self.stats.snapshot_evictions += 1;
        ops.push(CacheOp::Drop(tail.snapshot));
        self.free_snapshots.push(tail.snapshot);
        if let Some(page) = tail.page {
            alloc.cache_release(page);
            self.stats.pages -= 1;
        }
    }

    pub(crate) fn remove_leaf(&mut self, n: usize, alloc: &mut Allocator, ops: &mut Vec<CacheOp>) {
        while !self.node(n).tails.is_empty() {
            self.remove_tail(n, 0, alloc, ops);
        }
        let node = self.nodes[n].take().expect("live node");
        debug_assert!(node.children.is_empty());
        self.node_mut(node.parent).children.remove(&node.key);
        if let Some(page) = node.page {
            alloc.cache_release(page);
            self.stats.pages -= 1;
        }
        self.free_nodes.push(n);
    }

    /// Releases everything the cache holds (pages back to the allocator).
    pub fn clear(&mut self, alloc: &mut Allocator, ops: &mut Vec<CacheOp>) {
        loop {
            let leaf = (1..self.nodes.len()).find(|&i| {
                self.nodes[i]
                    .as_ref()
                    .is_some_and(|n| n.children.is_empty())
            });
            match leaf {
                Some(n) => self.remove_leaf(n, alloc, ops),
                None => break,
            }
        }
        while !self.node(ROOT).tails.is_empty() {
            self.remove_tail(ROOT, 0, alloc, ops);
        }
    }
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[path = "prefix_cache_evict.rs"]
mod evict;

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod tests;
