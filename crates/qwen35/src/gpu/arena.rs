//! A cache whose recurrent-state and KV buffers draw on one pool of
//! physical memory ([`crate::gpu::vmm`]): each buffer is a virtual range
//! of fixed address and layout (kernels and captured decode graphs see the
//! same buffers as without the arena), and a group of slots or pages
//! ([`crate::gpu::arena_layout`]) is backed by pooled chunks only while the
//! engine has it mapped. The conv state stays ordinary memory for every
//! slot id. The ids after the engine's (the spare slot and page the decode
//! graphs pad with, the snapshot slots) are backed for good, by chunks of
//! their own, and zeroed at creation as an ordinary cache is.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream};
use engine::{ArenaGeometry, PageId, SlotId};
use gdn_kernels::{AttentionShape, DeltaNetShape, RecurrentState, StateDtype};
use half::bf16;

use crate::error::{LoadError, RunError};
use crate::gpu::arena_layout::{ArenaLayout, ArenaShape, GroupShape};
use crate::gpu::plan::Row;
use crate::gpu::vmm::{self, Vmm};
use crate::gpu::{GpuCache, GpuModel};

/// What a group holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Slots,
    Pages,
}

/// The arena of one [`GpuCache`].
pub(crate) struct CacheArena {
    vmm: Vmm,
    pub(crate) layout: ArenaLayout,
    /// The range (index, address) of each recurrent-state buffer.
    slot_ranges: Vec<(usize, CUdeviceptr)>,
    /// The ranges of the keys, then the values, of every attention layer.
    page_ranges: Vec<(usize, CUdeviceptr)>,
    /// Mapped engine groups.
    slot_mapped: Vec<bool>,
    page_mapped: Vec<bool>,
}

impl CacheArena {
    fn parts(&self, kind: Kind) -> (GroupShape, &[(usize, CUdeviceptr)], &[bool]) {
        match kind {
            Kind::Slots => (self.layout.slots, &self.slot_ranges, &self.slot_mapped),
            Kind::Pages => (self.layout.pages, &self.page_ranges, &self.page_mapped),
        }
    }

    /// Whether `slot` may be used: a mapped engine slot, or one of the
    /// slots backed for good.
    pub(crate) fn slot_usable(&self, slot: usize) -> bool {
        let g = slot / self.layout.slots.ids;
        self.slot_mapped.get(g).copied().unwrap_or(true)
    }

    pub(crate) fn page_usable(&self, page: usize) -> bool {
        let g = page / self.layout.pages.ids;
        self.page_mapped.get(g).copied().unwrap_or(true)
    }
}

impl GpuModel {
    /// The arena's sizes for pages of `page_size` positions on this device.
    pub(crate) fn arena_shape(&self, page_size: usize) -> Result<ArenaShape, RunError> {
        let (linear, full) = self.layer_counts();
        Ok(ArenaShape {
            chunk_bytes: vmm::granularity(&self.stream)?,
            slot_bytes_per_layer: self.dn.recurrent_state_len() * self.state_dtype.bytes(),
            deltanet_layers: linear,
            page_bytes_per_buffer: self.attn.page_len(page_size) * 2,
            attention_layers: full,
            conv_bytes_per_slot: linear * self.dn.conv_state_len() * 2,
        })
    }

    /// A cache over an arena of `layout` (made by [`Self::arena_shape`]
    /// for `page_size`): nothing of the engine's ids mapped yet.
    pub(crate) fn new_arena_cache(
        &self,
        layout: ArenaLayout,
        page_size: usize,
    ) -> Result<GpuCache, LoadError> {
        if layout.cache_slots() > 65_535 || layout.cache_pages() > i32::MAX as usize {
            return Err(LoadError::Sizing(format!(
                "{} slots / {} pages exceed the kernels' limits (65535 slots, i32 page ids)",
                layout.cache_slots(),
                layout.cache_pages()
            )));
        }
        GpuCache::new_arena(
            self.id,
            self.stream.clone(),
            (self.dn, self.attn),
            layout,
            page_size,
            self.state_dtype,
        )
    }
}

impl GpuCache {
    fn new_arena(
        model_id: u64,
        stream: Arc<CudaStream>,
        (dn, attn): (DeltaNetShape, AttentionShape),
        layout: ArenaLayout,
        page_size: usize,
        dtype: StateDtype,
    ) -> Result<GpuCache, LoadError> {
        let shape = layout.shape;
        let total = layout.num_chunks + layout.fixed_chunks();
        let mut vmm = Vmm::new(stream.clone(), shape.chunk_bytes, total)?;
        let (slots, pages) = (layout.slots, layout.pages);
        let slot_groups = layout.slot_groups() + layout.fixed_slot_groups();
        let page_groups = layout.page_groups() + 1;
        let mut reserve = |groups: usize, g: GroupShape| {
            (0..g.buffers)
                .map(|_| vmm.reserve(groups * g.chunks_per_buffer))
                .collect::<Result<Vec<_>, _>>()
        };
        let slot_ranges = reserve(slot_groups, slots)?;
        let page_ranges = reserve(page_groups, pages)?;
        let mut arena = CacheArena {
            vmm,
            layout,
            slot_ranges,
            page_ranges,
            slot_mapped: vec![false; layout.slot_groups()],
            page_mapped: vec![false; layout.page_groups()],
        };
        // The ids after the engine's: backed for good, and zero as an
        // ordinary cache's (padding rows start from them).
        let fixed = (layout.slot_groups()..slot_groups)
            .map(|g| (Kind::Slots, g))
            .chain([(Kind::Pages, layout.page_groups())]);
        for (kind, g) in fixed {
            arena.back(kind, g).map_err(setup_error)?;
            arena.zero(&stream, kind, g).map_err(setup_error)?;
        }
        let conv = (0..shape.deltanet_layers)
            .map(|_| stream.alloc_zeros::<bf16>(layout.cache_slots() * dn.conv_state_len()))
            .collect::<Result<_, _>>()?;
        // Nothing fallible after this: the slices over the ranges are
        // leaked by `GpuCache`'s drop before the arena frees them.
        let state_len = layout.cache_slots() * dn.recurrent_state_len();
        let recurrent = arena
            .slot_ranges
            .iter()
            .map(|&(_, base)| {
                // SAFETY: the range holds `slot_groups` groups of whole
                // slots, at least `cache_slots` of them; it lives as long
                // as the arena, which the cache drops after leaking this.
                unsafe {
                    match dtype {
                        StateDtype::F32 => {
                            RecurrentState::F32(stream.upgrade_device_ptr(base, state_len))
                        }
                        StateDtype::Bf16 => {
                            RecurrentState::Bf16(stream.upgrade_device_ptr(base, state_len))
                        }
                    }
                }
            })
            .collect();
        let kv_len = layout.cache_pages() * attn.page_len(page_size);
        let over = |ranges: &[(usize, CUdeviceptr)]| -> Vec<CudaSlice<bf16>> {
            ranges
                .iter()
                // SAFETY: as above, for whole pages.
                .map(|&(_, base)| unsafe { stream.upgrade_device_ptr(base, kv_len) })
                .collect()
        };
        let half = arena.page_ranges.len() / 2;
        let keys = over(&arena.page_ranges[..half]);
        let values = over(&arena.page_ranges[half..]);
        Ok(GpuCache {
            model_id,
            stream,
            dn,
            page_size,
            conv,
            recurrent,
            keys,
            values,
            num_slots: layout.cache_slots(),
            num_pages: layout.cache_pages(),
            graphs: None,
            arena: Some(arena),
        })
    }

    /// The arena's geometry for the engine (`None`: no arena).
    pub fn arena_geometry(&self) -> Option<ArenaGeometry> {
        self.arena.as_ref().map(|a| a.layout.geometry())
    }

    /// Backs engine group `group` of `kind` with pooled chunks. A page
    /// group is zeroed (queued on the stream): the attention kernels may
    /// read a page's unwritten positions, masked, and a chunk that held
    /// state before may hold bit patterns that are not finite bf16. A slot
    /// group is not: a sequence's first step zeroes its slot.
    pub(crate) fn map_group(&mut self, kind: Kind, group: usize) -> Result<(), RunError> {
        let stream = self.stream.clone();
        let arena = self.arena_mut()?;
        let (_, _, mapped) = arena.parts(kind);
        match mapped.get(group) {
            None => {
                return Err(RunError::InvalidInput(format!(
                    "{kind:?} group {group} beyond the arena's {}",
                    mapped.len()
                )))
            }
            Some(true) => {
                return Err(RunError::InvalidInput(format!(
                    "{kind:?} group {group} is mapped already"
                )))
            }
            Some(false) => {}
        }
        arena.back(kind, group)?;
        if kind == Kind::Pages {
            arena.zero(&stream, kind, group)?;
        }
        match kind {
            Kind::Slots => arena.slot_mapped[group] = true,
            Kind::Pages => arena.page_mapped[group] = true,
        }
        Ok(())
    }

    /// Returns engine group `group` of `kind` to the pool, once the work
    /// queued on the stream (which may still read it) is done.
    pub(crate) fn unmap_group(&mut self, kind: Kind, group: usize) -> Result<(), RunError> {
        self.stream.synchronize()?;
        let arena = self.arena_mut()?;
        let (g, ranges, mapped) = arena.parts(kind);
        if mapped.get(group) != Some(&true) {
            return Err(RunError::InvalidInput(format!(
                "{kind:?} group {group} is not mapped"
            )));
        }
        let chunks = group * g.chunks_per_buffer..(group + 1) * g.chunks_per_buffer;
        let ranges: Vec<usize> = ranges.iter().map(|r| r.0).collect();
        match kind {
            Kind::Slots => arena.slot_mapped[group] = false,
            Kind::Pages => arena.page_mapped[group] = false,
        }
        for r in ranges {
            arena.vmm.unmap(r, chunks.clone())?;
        }
        Ok(())
    }

    fn arena_mut(&mut self) -> Result<&mut CacheArena, RunError> {
        self.arena
            .as_mut()
            .ok_or_else(|| RunError::InvalidInput("this cache has no arena".into()))
    }

    /// Why `rows` cannot run on the arena's mapped groups (a slot or a
    /// page a row uses whose group is not mapped), if so.
    pub(crate) fn unmapped(&self, rows: &[Row]) -> Option<String> {
        let arena = self.arena.as_ref()?;
        for (i, r) in rows.iter().enumerate() {
            if !arena.slot_usable(r.slot.0 as usize) {
                return Some(format!("row {i}: slot {} is not mapped", r.slot.0));
            }
            let used = (r.start + r.tokens.len()).div_ceil(self.page_size);
            let pages = &r.pages[..used.min(r.pages.len())];
            if let Some(p) = pages.iter().find(|p| !arena.page_usable(p.0 as usize)) {
                return Some(format!("row {i}: page {} is not mapped", p.0));
            }
        }
        None
    }

    /// Whether `slot` may be used (always, without an arena).
    pub(crate) fn slot_usable(&self, slot: SlotId) -> bool {
        self.arena
            .as_ref()
            .is_none_or(|a| a.slot_usable(slot.0 as usize))
    }

    pub(crate) fn page_usable(&self, page: PageId) -> bool {
        self.arena
            .as_ref()
            .is_none_or(|a| a.page_usable(page.0 as usize))
    }

    /// Leaks the slices over the arena's ranges (dropping them would free
    /// memory the driver never allocated as such) and drops the graphs
    /// that read them; the arena itself then unmaps and frees the ranges.
    pub(crate) fn leak_arena_buffers(&mut self) {
        if self.arena.is_none() {
            return;
        }
        self.graphs = None;
        for s in self.keys.drain(..).chain(self.values.drain(..)) {
            let _ = s.leak();
        }
        for r in self.recurrent.drain(..) {
            let _ = match r {
                RecurrentState::F32(s) => s.leak(),
                RecurrentState::Bf16(s) => s.leak(),
            };
        }
    }
}

/// A failure to set the arena up (a driver error, or pool arithmetic
/// that does not add up).
fn setup_error(e: RunError) -> LoadError {
    match e {
        RunError::Device(d) => LoadError::Device(d),
        other => LoadError::Sizing(other.to_string()),
    }
}

impl CacheArena {
    /// Backs group `group` of `kind` in every buffer of the kind (all or
    /// nothing).
    fn back(&mut self, kind: Kind, group: usize) -> Result<(), RunError> {
        let (g, ranges, _) = self.parts(kind);
        let chunks = group * g.chunks_per_buffer..(group + 1) * g.chunks_per_buffer;
        let ranges: Vec<usize> = ranges.iter().map(|r| r.0).collect();
        for (k, &r) in ranges.iter().enumerate() {
            if let Err(e) = self.vmm.map(r, chunks.clone()) {
                for &done in &ranges[..k] {
                    self.vmm.unmap(done, chunks.clone())?;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Zeroes group `group` of `kind` in every buffer (queued on `stream`).
    fn zero(&self, stream: &CudaStream, kind: Kind, group: usize) -> Result<(), RunError> {
        let (g, ranges, _) = self.parts(kind);
        let bytes = g.chunks_per_buffer * self.vmm.chunk_bytes();
        stream.context().bind_to_thread()?;
        for &(_, base) in ranges {
            let at = base + (group * bytes) as u64;
            // SAFETY: the group is backed; the memset is ordered on the
            // stream before any later use.
            unsafe {
                cudarc::driver::result::memset_d8_async(at, 0, bytes, stream.cu_stream())?;
            }
        }
        Ok(())
    }
}
