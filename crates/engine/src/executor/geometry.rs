//! The ids and sizes of what an executor holds: state slots, KV pages and
//! state snapshots. The engine's allocator and prefix cache hand the ids
//! out; the executor only addresses its buffers by them.

/// A recurrent/conv state slot of the executor (one per live sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// A KV-cache page of the executor (`page_size` positions of every attention layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

/// A state snapshot of the executor's snapshot pool: a copy of a slot's
/// recurrent and conv state after some number of tokens, kept for the
/// prefix cache. Separate from the slots, so no running sequence ever
/// writes into one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId(pub u32);

/// The executor's snapshot pool (empty: it cannot snapshot, and the engine
/// runs without a prefix cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotGeometry {
    pub num_snapshots: usize,
    /// Device (or host) bytes of one snapshot, for the metrics and budget.
    pub snapshot_bytes: usize,
}

/// How the executor stores its slots' recurrent state and its KV pages (for
/// the start-up log and the metrics; the engine sizes nothing from it).
/// Plain numbers: the engine knows no device types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateGeometry {
    /// The recurrent state's storage dtype, in config.json's / vLLM's
    /// spelling (`float32`, `bfloat16`); empty where the executor does not say.
    pub recurrent_dtype: &'static str,
    /// Bytes of one slot's recurrent state (every DeltaNet layer).
    pub recurrent_bytes_per_slot: usize,
    /// Bytes of one slot's whole state (recurrent and conv state).
    pub slot_bytes: usize,
    /// Bytes of one KV page (every attention layer's keys and values);
    /// 0 where the executor does not say.
    pub page_bytes: usize,
}

/// What an executor holds; the engine's allocator hands these out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheGeometry {
    pub num_slots: usize,
    pub num_pages: usize,
    /// Positions per KV page.
    pub page_size: usize,
    pub vocab_size: usize,
    /// The longest sequence (prompt + output) the executor can run.
    pub max_model_len: usize,
}

/// Memory the executor maps on demand from one pool of physical chunks, so
/// that KV pages and state slots trade room: a slot holds chunks only
/// while a request runs in it, and `max_num_seqs` caps the slots instead
/// of reserving them. Pages and slots are mapped by group (the executor's
/// mapping granularity): page group `g` is pages `g * pages_per_group ..
/// (g + 1) * pages_per_group`, slot group `g` likewise. The engine's
/// allocator decides what is mapped ([`MemoryOp`]) and uses a page or a
/// slot only while its group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaGeometry {
    /// Physical chunks in the pool.
    pub num_chunks: usize,
    /// Bytes of one chunk.
    pub chunk_bytes: usize,
    pub pages_per_group: usize,
    /// Chunks a mapped page group holds.
    pub chunks_per_page_group: usize,
    pub slots_per_group: usize,
    /// Chunks a mapped slot group holds.
    pub chunks_per_slot_group: usize,
}

impl ArenaGeometry {
    /// Pages the whole pool holds when it holds no slot.
    pub fn max_pages(&self) -> usize {
        self.num_chunks / self.chunks_per_page_group.max(1) * self.pages_per_group
    }
}

/// A change to what the executor has mapped, run before the step's cache
/// work. A newly mapped group's contents are undefined (a sequence's slot
/// is zeroed when it starts, as without the arena). The engine unmaps only
/// a group none of whose pages or slots is held; the executor waits for
/// the work already queued before it unmaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryOp {
    MapPages(u32),
    UnmapPages(u32),
    MapSlots(u32),
    UnmapSlots(u32),
}
