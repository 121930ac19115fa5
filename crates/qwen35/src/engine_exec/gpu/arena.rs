//! The GPU executor over an arena ([`super::PagePool::Arena`]): KV pages and the
//! slots' recurrent state mapped on demand from one pool of chunks, so a
//! slot holds memory only while a request runs in it. Here: sizing the
//! pool (from the device's memory, or a chunk count), the geometry the
//! engine gets, and the engine's [`MemoryOp`]s. The arena itself is
//! `crate::gpu::arena`; what is mapped is the engine's to decide, and a
//! row on an unmapped slot or page is refused before any device work
//! (`GpuModel::step_device`).

use engine::{CacheGeometry, ExecError, MemoryOp};

use super::{CacheRoom, GpuExecutor, GpuSizing};
use crate::engine_exec::gpu_memory::CacheMemory;
use crate::error::{LoadError, RunError};
use crate::gpu::{ArenaKind, ArenaLayout, GpuModel};

/// How large the arena's pool is.
#[derive(Clone, Copy, Debug)]
pub enum ArenaPool {
    /// What `gpu_memory_utilization` of the device leaves after what is in
    /// use (the weights), `activation_reserve` bytes for a step's
    /// activations and the arena's fixed parts: the conv state of every
    /// slot id, the spare slot and page the decode graphs pad with, and
    /// the prefix cache's snapshots.
    FromMemory {
        gpu_memory_utilization: f64,
        activation_reserve: usize,
    },
    /// Exactly this many chunks (tests: a small pool makes the pages and
    /// the slots compete for it).
    Chunks(usize),
}

impl GpuExecutor {
    /// What the snapshots share with the pool (see [`Self::cache_room`]):
    /// from memory, the room less the fixed parts other than the
    /// snapshots; a chunk count is fixed and the snapshots come on top.
    pub(super) fn arena_room(
        model: &GpuModel,
        sizing: &GpuSizing,
        pool: ArenaPool,
    ) -> Result<CacheRoom, LoadError> {
        let shape = model.arena_shape(sizing.page_size).map_err(load_error)?;
        Ok(match pool {
            ArenaPool::Chunks(n) => CacheRoom::FixedKv(n * shape.chunk_bytes),
            ArenaPool::FromMemory {
                gpu_memory_utilization: u,
                activation_reserve,
            } => {
                let memory = Self::cache_memory(model, sizing, u, activation_reserve)?;
                let room = arena_room(&memory);
                let slots = shape.slots().map_or(1, |s| s.ids);
                let num_slots = sizing.num_slots.div_ceil(slots) * slots;
                let fixed = shape.fixed_bytes(num_slots, 0).unwrap_or(0);
                CacheRoom::Shared(room.saturating_sub(fixed))
            }
        })
    }

    /// [`GpuExecutor::with_snapshot_pool`] over an arena: the engine's
    /// slots are `sizing.num_slots` rounded up to whole slot groups, its
    /// pages as many as the pool holds with no slot mapped, and a sequence
    /// at most what the pool holds next to one slot group.
    pub(super) fn with_arena(
        model: GpuModel,
        sizing: GpuSizing,
        pool: ArenaPool,
        num_snapshots: usize,
        start: std::time::Instant,
    ) -> Result<GpuExecutor, LoadError> {
        let page_size = sizing.page_size;
        let shape = model.arena_shape(page_size).map_err(load_error)?;
        let layout = match pool {
            ArenaPool::Chunks(n) => ArenaLayout::new(shape, sizing.num_slots, num_snapshots, n)
                .map_err(|e| LoadError::Sizing(e.to_string()))?,
            ArenaPool::FromMemory {
                gpu_memory_utilization: u,
                activation_reserve,
            } => {
                let memory = Self::cache_memory(&model, &sizing, u, activation_reserve)?;
                let room = arena_room(&memory);
                log::info!(
                    "GPU executor: {} of {} MiB in use, {} MiB allowed, {} MiB reserved for activations: {} MiB for the state arena",
                    memory.used >> 20,
                    memory.total >> 20,
                    memory.allowed >> 20,
                    activation_reserve >> 20,
                    room >> 20,
                );
                ArenaLayout::in_room(shape, room, sizing.num_slots, num_snapshots).map_err(
                    |e| {
                        LoadError::Sizing(format!(
                            "no room for the state arena: {} MiB allowed ({} of {} MiB); the weights use {} MiB, the activation reserve {} MiB, {} snapshots and the conv state of every slot more: {e}",
                            memory.allowed >> 20,
                            u,
                            memory.total >> 20,
                            memory.used >> 20,
                            activation_reserve >> 20,
                            num_snapshots,
                        ))
                    },
                )?
            }
        };
        let max_model_len = sizing.max_model_len.min(layout.max_model_len(page_size));
        log_arena(&layout, page_size, max_model_len);
        let cache = model.new_arena_cache(layout, page_size)?;
        let geometry = CacheGeometry {
            num_slots: layout.num_slots,
            num_pages: layout.num_pages(),
            page_size,
            vocab_size: model.config.vocab_size,
            max_model_len,
        };
        Self::assemble(model, cache, geometry, num_snapshots, start)
    }

    /// Maps or unmaps a group for the engine. Unmapping waits for the
    /// stream; a slot group's slots then hold no sequence's state.
    pub(super) fn memory_op(&mut self, op: MemoryOp) -> Result<(), ExecError> {
        let (kind, group, map) = match op {
            MemoryOp::MapPages(g) => (ArenaKind::Pages, g as usize, true),
            MemoryOp::UnmapPages(g) => (ArenaKind::Pages, g as usize, false),
            MemoryOp::MapSlots(g) => (ArenaKind::Slots, g as usize, true),
            MemoryOp::UnmapSlots(g) => (ArenaKind::Slots, g as usize, false),
        };
        if self.cache.arena_geometry().is_none() {
            return Err(ExecError::Refused(format!(
                "{op:?}: this executor has no arena"
            )));
        }
        let done = if map {
            self.cache.map_group(kind, group)
        } else {
            self.cache.unmap_group(kind, group)
        };
        if kind == ArenaKind::Slots && !map && done.is_ok() {
            let per = self.cache.arena_geometry().map_or(1, |g| g.slots_per_group);
            let slots = group * per..((group + 1) * per).min(self.held.len());
            for held in &mut self.held[slots] {
                *held = None;
            }
        }
        done.map_err(|e| match e {
            RunError::InvalidInput(m) => ExecError::Refused(format!("{op:?}: {m}")),
            // The driver failed to change a mapping: what is mapped is no
            // longer what the engine's book says.
            other => ExecError::Fatal(format!("{op:?}: {other}")),
        })
    }
}

/// The bytes the arena's pool and its fixed parts share: the allowed
/// memory less what is in use and the activation reserve, that is what
/// [`CacheMemory::room`] gives plus the slots it reserves.
fn arena_room(memory: &CacheMemory) -> usize {
    memory
        .allowed
        .saturating_sub(memory.used + memory.activation_reserve)
}

fn load_error(e: RunError) -> LoadError {
    match e {
        RunError::Device(d) => LoadError::Device(d),
        other => LoadError::Sizing(other.to_string()),
    }
}

/// The arena at start-up: the pool, the groups, what stays mapped, and
/// how many requests of `max_model_len` fit at once.
fn log_arena(layout: &ArenaLayout, page_size: usize, max_model_len: usize) {
    let g = layout.geometry();
    let mib = |chunks: usize| (chunks * g.chunk_bytes) >> 20;
    log::info!(
        "GPU executor: state arena of {} chunks of {} MiB ({} MiB): page groups of {} pages ({} chunks), slot groups of {} slots ({} chunks); {} pages of {page_size} positions with no slot mapped, {} slots; {} MiB mapped for good (the spare slot and page, {} snapshots) and {} MiB of conv state",
        g.num_chunks,
        g.chunk_bytes >> 20,
        mib(g.num_chunks),
        g.pages_per_group,
        g.chunks_per_page_group,
        g.slots_per_group,
        g.chunks_per_slot_group,
        layout.num_pages(),
        layout.num_slots,
        mib(layout.fixed_chunks()),
        layout.snapshots,
        (layout.shape.conv_bytes_per_slot * layout.cache_slots()) >> 20,
    );
    log::info!(
        "GPU executor: {} requests of max_model_len {max_model_len} fit in the arena at once ({} chunks each)",
        layout.requests_that_fit(max_model_len, page_size),
        layout.chunks_per_request(max_model_len, page_size),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_arena_room_is_the_reserved_room_plus_the_slots_it_no_longer_reserves() {
        // The 35B-A3B on an 80 GB card (gpu_memory's tests): 128 slots of
        // 61 MiB and the spare.
        let at = |utilization: f64| {
            let total = 81_079 * MIB;
            CacheMemory {
                total,
                used: 66_740 * MIB,
                utilization,
                allowed: (total as f64 * utilization) as usize,
                num_slots: 128,
                slot_bytes: 61 * MIB,
                activation_reserve: 1_517 * MIB,
            }
        };
        let m = at(0.97);
        assert_eq!(arena_room(&m), m.room() + 129 * m.slot_bytes);
        // At 0.9 the reserved slots leave nothing; the arena has the rest.
        let m = at(0.9);
        assert_eq!(m.room(), 0);
        assert_eq!(arena_room(&m), m.allowed - 66_740 * MIB - 1_517 * MIB);
        assert_eq!(arena_room(&m) / MIB, 4_714);
    }
}
