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
