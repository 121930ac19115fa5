//! The seam between the engine and a model runtime. The engine decides
//! which sequence sits in which state slot, which KV pages it owns and which
//! tokens run in a step; an executor only runs the rows it is given on the
//! device buffers those ids address, and samples where asked.
mod allowed;
mod arena_map;
mod error;
mod geometry;
mod row_snapshots;
mod rows;

pub use allowed::AllowedTokens;
pub(crate) use allowed::PendingMask;
pub use arena_map::{ArenaMap, ArenaMapError, Changed};
pub use error::ExecError;
pub use geometry::{
    ArenaGeometry, CacheGeometry, MemoryOp, PageId, SlotId, SnapshotGeometry, SnapshotId,
    StateGeometry,
};
pub use row_snapshots::{check_row_snapshots, in_row_order, split_rows, Pass, RowSnapshotError};
pub use rows::{RowSnapshot, SampleSeed, SampleSpec, SampledToken, StepRow};

use crate::timeline::StepPhases;

/// An error of any source: what an executor factory returns to
/// [`crate::Engine::start`] (the runtime's own error, or a message).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A model runtime driven by the engine. It lives on the engine thread (it
/// is created there by a factory, so it need not be `Send`).
pub trait Executor {
    fn geometry(&self) -> CacheGeometry;

    /// Runs one forward over `rows` (each slot at most once) and returns one
    /// [`SampledToken`] per row with `sample: Some(..)`, in row order.
    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError>;

    /// The pool the executor maps pages and slots from on demand (`None`,
    /// the default: every page and slot of [`Self::geometry`] is there
    /// from the start).
    fn arena_geometry(&self) -> Option<ArenaGeometry> {
        None
    }

    /// Maps or unmaps a group of the arena (see [`MemoryOp`]); only called
    /// when [`Self::arena_geometry`] is `Some`.
    fn memory(&mut self, op: MemoryOp) -> Result<(), ExecError> {
        let _ = op;
        Err(ExecError::Refused("this executor has no arena".into()))
    }

    /// How the slots' recurrent state is stored (the default: not said).
    fn state_geometry(&self) -> StateGeometry {
        StateGeometry::default()
    }

    /// The snapshot pool; an executor without one keeps the default (none)
    /// and the engine never calls the methods below.
    fn snapshot_geometry(&self) -> SnapshotGeometry {
        SnapshotGeometry::default()
    }

    /// How many [`StepRow::snapshots`] one row may carry (0, the default:
    /// none; the engine then ends prefill chunks at snapshot points and
    /// snapshots after the step, each point costing its request a step).
    /// An executor that offers it runs a row with points in pieces, one
    /// more forward per piece (see [`split_rows`]).
    fn max_row_snapshots(&self) -> usize {
        0
    }

    /// Copies the state `slot` holds now (after its last step) into
    /// `snapshot`, replacing what was there. The slot is unchanged.
    fn snapshot(&mut self, slot: SlotId, snapshot: SnapshotId) -> Result<(), ExecError> {
        let _ = (slot, snapshot);
        Err(ExecError::Refused(
            "this executor has no snapshot pool".into(),
        ))
    }

    /// Copies `snapshot` into `slot`: the slot then holds the state after
    /// the snapshot's tokens, and the next row of the slot continues at that
    /// position. The snapshot is unchanged (copy, never in place).
    fn restore(&mut self, snapshot: SnapshotId, slot: SlotId) -> Result<(), ExecError> {
        let _ = (snapshot, slot);
        Err(ExecError::Refused(
            "this executor has no snapshot pool".into(),
        ))
    }

    /// The engine will not restore `snapshot` again (until it takes a new
    /// one there): an executor may free what it holds for it.
    fn drop_snapshot(&mut self, snapshot: SnapshotId) {
        let _ = snapshot;
    }

    /// Copies every position of KV page `from` onto page `to` (a prefix hit
    /// that ends inside a page: the request writes its next positions into
    /// its own copy, never into the shared page).
    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), ExecError> {
        let _ = (from, to);
        Err(ExecError::Refused("this executor cannot copy pages".into()))
    }

    /// Turns per-step phase timing on or off (the request timeline,
    /// [`crate::timeline`]). Timing may cost a little (GPU: events around
    /// the forward), so it is off unless the engine asks.
    fn set_step_timing(&mut self, on: bool) {
        let _ = on;
    }

    /// The phases of the last step, when timing is on and the executor
    /// measures them (default: it does not).
    fn last_step_phases(&self) -> Option<StepPhases> {
        None
    }
}
