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
//! Eviction removes what saves the least recompute per byte first, least
//! recently used among equals: snapshots when the snapshot budget is full,
//! tails and leaves of the trie (a page and its tails) when running
//! requests need pages. Everything here only counts; the executor work it
//! implies (copies, snapshots, drops) is returned as [`CacheOp`]s for the
//! engine to run in order.
//!
//! - `config.rs`: [`PrefixCacheConfig`].
//! - `trie.rs`: the trie of pages and tails, [`PrefixCache::lookup`].
//! - `eviction.rs`: the cost model, and what goes when pages or snapshot
//!   ids run out.
//! - `publish.rs`: adding snapshots (after a step, or reserved for the
//!   executor to take inside one).
//! - `points.rs`: where snapshots are taken ([`snapshot_points`], branch
//!   points).

mod config;
mod eviction;
mod points;
mod publish;
mod trie;

pub use config::PrefixCacheConfig;
pub use points::{snapshot_points, MARKER_COVERS_END};
pub use publish::Reservation;
pub use trie::{common_prefix, CacheOp, Hit, PrefixCache, PrefixCacheStats};

pub(crate) use points::{branch_point, Branch, Sharer};

#[cfg(test)]
mod tests;
