//! The trie: full KV pages keyed by their tokens, each node holding the
//! snapshots (tails) taken on it, and the lookup that finds the longest
//! prefix with a snapshot. Only what is stored and found lives here; what
//! to keep is decided in [`super::eviction`], what to add in
//! [`super::publish`].

use std::collections::HashMap;

use crate::allocator::Allocator;
use crate::executor::{PageId, SlotId, SnapshotId};

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
    /// `points.rs`), whichever sequence takes them.
    pub branch_points: u64,
    /// Snapshots held now.
    pub snapshots: usize,
    /// Holds the trie has on pages now (a page may also be held by
    /// requests, and a page held as a full page and as a tail page counts
    /// twice).
    pub pages: usize,
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
pub(super) struct Tail {
    pub(super) tokens: Vec<u32>,
    pub(super) page: Option<PageId>,
    pub(super) snapshot: SnapshotId,
    pub(super) last_used: u64,
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) parent: usize,
    /// The page's tokens (empty for the root).
    pub(super) key: Vec<u32>,
    /// `None` for the root only.
    pub(super) page: Option<PageId>,
    pub(super) children: HashMap<Vec<u32>, usize>,
    pub(super) tails: Vec<Tail>,
    pub(super) last_used: u64,
    /// Full pages from the root to this node (0 for the root).
    pub(super) depth: usize,
}

pub(super) const ROOT: usize = 0;

#[derive(Debug)]
pub struct PrefixCache {
    pub(super) page_size: usize,
    /// Slab of nodes (`None`: free); 0 is the root.
    pub(super) nodes: Vec<Option<Node>>,
    pub(super) free_nodes: Vec<usize>,
    pub(super) free_snapshots: Vec<SnapshotId>,
    pub(super) tick: u64,
    pub(super) stats: PrefixCacheStats,
    /// Snapshot ids handed out by [`PrefixCache::reserve`], not yet
    /// published or released.
    pub(super) reserved: usize,
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

    pub(super) fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node")
    }

    pub(super) fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node")
    }

    pub(super) fn next_tick(&mut self) -> u64 {
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
                    // a branch point (see `points.rs`) ends there.
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
        // point (see `points.rs`) would serve.
        let usable_kv = kv_matched.min(limit);
        if usable_kv >= hit + self.page_size {
            s.kv_only_unusable += 1;
            s.kv_only_unusable_tokens += (usable_kv - hit) as u64;
        }
    }

    pub(super) fn add_node(&mut self, parent: usize, key: Vec<u32>, page: PageId) -> usize {
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
    pub(super) fn remove_tail(
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

    pub(super) fn remove_leaf(&mut self, n: usize, alloc: &mut Allocator, ops: &mut Vec<CacheOp>) {
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
