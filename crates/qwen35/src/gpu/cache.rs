//! Per-sequence GPU state addressed by id: `num_slots` state slots (DeltaNet
//! conv state in bf16 and recurrent state in the model's state dtype, f32
//! or bf16 (`gdn_kernels::StateDtype`), one slot per live
//! sequence) and `num_pages` KV-cache pages of `page_size` positions for the
//! attention layers. Which sequence owns which slot and pages is not known
//! here: the caller (the engine's allocator) decides and passes the ids with
//! every step. The recurrent state and the pages may live in an arena
//! mapped on demand ([`crate::gpu::arena`]); the buffers look the same.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use engine::{PageId, SlotId};
use gdn_kernels::{AttentionShape, DeltaNetShape, HostState, RecurrentState, StateDtype};
use half::bf16;

use crate::error::{LoadError, RunError};
use crate::gpu::arena::CacheArena;
use crate::gpu::graphs::DecodeGraphs;

/// The device state of one model: slots and pages (see the module docs).
pub struct GpuCache {
    /// The model that made the cache (and captured its graphs).
    pub(crate) model_id: u64,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) dn: DeltaNetShape,
    pub(crate) page_size: usize,
    /// Per DeltaNet layer: `[slots, kw-1, conv_dim]` bf16.
    pub(crate) conv: Vec<CudaSlice<bf16>>,
    /// Per DeltaNet layer: `[slots, Hv, 128, 128]` in the state dtype.
    pub(crate) recurrent: Vec<RecurrentState>,
    /// Per attention layer: `[pages, page_size, Hkv, D]` bf16.
    pub(crate) keys: Vec<CudaSlice<bf16>>,
    pub(crate) values: Vec<CudaSlice<bf16>>,
    pub(crate) num_slots: usize,
    pub(crate) num_pages: usize,
    /// Captured decode steps (see `GpuModel::capture_decode_graphs`).
    pub(crate) graphs: Option<DecodeGraphs>,
    /// Where the recurrent state and the pages live when they are mapped
    /// on demand (`None`: ordinary allocations).
    pub(crate) arena: Option<CacheArena>,
}

impl Drop for GpuCache {
    fn drop(&mut self) {
        self.leak_arena_buffers();
    }
}

/// One slot's state copied to the host (conv and recurrent state of every
/// DeltaNet layer): a sequence parked off the device, to be imported into a
/// slot of a cache of the same model later.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotState {
    model_id: u64,
    conv: Vec<Vec<bf16>>,
    recurrent: Vec<HostState>,
}

impl SlotState {
    /// Bytes held on the host.
    pub fn bytes(&self) -> usize {
        let c: usize = self.conv.iter().map(|c| c.len() * 2).sum();
        let r: usize = self.recurrent.iter().map(HostState::bytes).sum();
        c + r
    }

    /// The recurrent state of DeltaNet layer `layer` (by index among the
    /// DeltaNet layers), widened to f32 (tests compare states with it).
    pub fn recurrent_f32(&self, layer: usize) -> Option<Vec<f32>> {
        self.recurrent.get(layer).map(HostState::to_f32)
    }

    /// The dtype the recurrent state was stored in.
    pub fn state_dtype(&self) -> Option<StateDtype> {
        self.recurrent.first().map(HostState::dtype)
    }
}

/// Device bytes of one slot's recurrent state (every DeltaNet layer) in `dtype`.
pub(crate) fn recurrent_bytes(dn: DeltaNetShape, linear: usize, dtype: StateDtype) -> usize {
    linear * dn.recurrent_state_len() * dtype.bytes()
}

/// Device bytes of one slot and of one page (for sizing a cache from free
/// memory); the recurrent state in `dtype`.
pub(crate) fn slot_and_page_bytes(
    dn: DeltaNetShape,
    attn: AttentionShape,
    layers: (usize, usize),
    page_size: usize,
    dtype: StateDtype,
) -> (usize, usize) {
    let (linear, full) = layers;
    let slot = linear * dn.conv_state_len() * 2 + recurrent_bytes(dn, linear, dtype);
    let page = full * 2 * attn.page_len(page_size) * 2;
    (slot, page)
}

impl GpuCache {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model_id: u64,
        stream: Arc<CudaStream>,
        dn: DeltaNetShape,
        attn: AttentionShape,
        layers: (usize, usize),
        num_slots: usize,
        num_pages: usize,
        page_size: usize,
        dtype: StateDtype,
    ) -> Result<GpuCache, LoadError> {
        if num_slots == 0 || page_size == 0 || num_pages == 0 {
            return Err(LoadError::Sizing(
                "a cache needs at least one state slot and one page of at least one position"
                    .into(),
            ));
        }
        let (linear, full) = layers;
        let page_len = attn.page_len(page_size);
        let alloc_bf16 = |n: usize| stream.alloc_zeros::<bf16>(n);
        let conv = (0..linear)
            .map(|_| alloc_bf16(num_slots * dn.conv_state_len()))
            .collect::<Result<_, _>>()?;
        let keys = (0..full)
            .map(|_| alloc_bf16(num_pages * page_len))
            .collect::<Result<_, _>>()?;
        let values = (0..full)
            .map(|_| alloc_bf16(num_pages * page_len))
            .collect::<Result<_, _>>()?;
        let recurrent = (0..linear)
            .map(|_| RecurrentState::zeros(&stream, dtype, num_slots * dn.recurrent_state_len()))
            .collect::<Result<_, _>>()?;
        Ok(GpuCache {
            model_id,
            stream,
            dn,
            page_size,
            conv,
            recurrent,
            keys,
            values,
            num_slots,
            num_pages,
            graphs: None,
            arena: None,
        })
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// How the recurrent state is stored.
    pub fn state_dtype(&self) -> StateDtype {
        self.recurrent
            .first()
            .map_or(StateDtype::default(), RecurrentState::dtype)
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Positions per KV page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    fn check_slot(&self, slot: SlotId) -> Result<usize, RunError> {
        let s = slot.0 as usize;
        if s >= self.num_slots {
            return Err(RunError::InvalidInput(format!(
                "slot {s} is beyond the cache's {} slots",
                self.num_slots
            )));
        }
        if !self.slot_usable(slot) {
            return Err(RunError::InvalidInput(format!(
                "slot {s} is in a group the arena has not mapped"
            )));
        }
        Ok(s)
    }

    /// Zero conv and recurrent state in `slot` (a sequence starting from its
    /// first token). Queued on the stream, before any later step.
    pub fn zero_slot(&mut self, slot: SlotId) -> Result<(), RunError> {
        let s = self.check_slot(slot)?;
        let (c, r) = (self.dn.conv_state_len(), self.dn.recurrent_state_len());
        for conv in &mut self.conv {
            self.stream
                .memset_zeros(&mut conv.slice_mut(s * c..(s + 1) * c))?;
        }
        for rec in &mut self.recurrent {
            rec.zero(&self.stream, s * r..(s + 1) * r)?;
        }
        Ok(())
    }

    /// Copies the state of slot `from` into slot `to` (a fork: both then
    /// continue from the same tokens; their KV pages are the caller's).
    pub fn copy_slot(&mut self, from: SlotId, to: SlotId) -> Result<(), RunError> {
        let (f, t) = (self.check_slot(from)?, self.check_slot(to)?);
        if f == t {
            return Ok(());
        }
        let (c, r) = (self.dn.conv_state_len(), self.dn.recurrent_state_len());
        for conv in &mut self.conv {
            copy_within(&self.stream, conv, c, f, t)?;
        }
        for rec in &mut self.recurrent {
            rec.copy_block(&self.stream, r, f, t)?;
        }
        Ok(())
    }

    /// Copies every position of KV page `from` onto page `to`, in every
    /// attention layer (a prefix-cache hit ending inside a page: the request
    /// continues in its own copy). Queued on the stream, before any later step.
    pub fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), RunError> {
        let (f, t) = (from.0 as usize, to.0 as usize);
        if f >= self.num_pages || t >= self.num_pages {
            return Err(RunError::InvalidInput(format!(
                "page copy {f} -> {t}: beyond the cache's {} pages",
                self.num_pages
            )));
        }
        if !self.page_usable(from) || !self.page_usable(to) {
            return Err(RunError::InvalidInput(format!(
                "page copy {f} -> {t}: a page in a group the arena has not mapped"
            )));
        }
        if f == t {
            return Ok(());
        }
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let per = buf.len() / self.num_pages;
            copy_within(&self.stream, buf, per, f, t)?;
        }
        Ok(())
    }

    /// The state of `slot`, copied to the host (waits for the stream).
    pub fn export_slot(&self, slot: SlotId) -> Result<SlotState, RunError> {
        let s = self.check_slot(slot)?;
        let (c, r) = (self.dn.conv_state_len(), self.dn.recurrent_state_len());
        let conv = self
            .conv
            .iter()
            .map(|b| self.stream.clone_dtoh(&b.slice(s * c..(s + 1) * c)))
            .collect::<Result<_, _>>()?;
        let recurrent = self
            .recurrent
            .iter()
            .map(|b| b.to_host(&self.stream, s * r..(s + 1) * r))
            .collect::<Result<_, _>>()?;
        Ok(SlotState {
            model_id: self.model_id,
            conv,
            recurrent,
        })
    }

    /// Writes an exported state into `slot` (waits for the copies, so the
    /// host buffers may go).
    pub fn import_slot(&mut self, slot: SlotId, state: &SlotState) -> Result<(), RunError> {
        let s = self.check_slot(slot)?;
        if state.model_id != self.model_id {
            return Err(RunError::InvalidInput(
                "the slot state was exported from another model's cache".into(),
            ));
        }
        let (c, r) = (self.dn.conv_state_len(), self.dn.recurrent_state_len());
        if state.state_dtype() != self.recurrent.first().map(RecurrentState::dtype) {
            return Err(RunError::InvalidInput(
                "the slot state was exported from a cache of another state dtype".into(),
            ));
        }
        for (dst, src) in self.conv.iter_mut().zip(&state.conv) {
            self.stream
                .memcpy_htod(src, &mut dst.slice_mut(s * c..(s + 1) * c))?;
        }
        for (dst, src) in self.recurrent.iter_mut().zip(&state.recurrent) {
            // Same model and dtype (checked above): the layouts agree.
            dst.write_host(&self.stream, s * r, src)?;
        }
        // The copies read pageable host memory that the caller may drop.
        self.stream.synchronize()?;
        Ok(())
    }

    /// Batch sizes with a captured decode graph (empty: graphs off).
    pub fn decode_graph_batch_sizes(&self) -> Vec<usize> {
        self.graphs
            .as_ref()
            .map(DecodeGraphs::batch_sizes)
            .unwrap_or_default()
    }
}

/// Copies element block `from` of `buf` onto block `to` (blocks of `per`).
fn copy_within<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    per: usize,
    from: usize,
    to: usize,
) -> Result<(), RunError> {
    let (lo, hi) = (from.min(to), from.max(to));
    let (mut low, mut high) = buf.split_at_mut(hi * per);
    // `high` starts at the higher of the two blocks.
    let mut lo_block = low.slice_mut(lo * per..(lo + 1) * per);
    let mut hi_block = high.slice_mut(..per);
    if from < to {
        stream.memcpy_dtod(&lo_block, &mut hi_block)?;
    } else {
        stream.memcpy_dtod(&hi_block, &mut lo_block)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bf16_state_halves_the_recurrent_bytes_of_a_slot() {
        // Qwen3.5-4B: 24 DeltaNet layers (32 value heads), 8 attention layers.
        let dn = DeltaNetShape {
            qk_heads: 16,
            v_heads: 32,
            conv_kernel: 4,
        };
        let attn = AttentionShape {
            q_heads: 16,
            kv_heads: 4,
            head_dim: 256,
            rotary_dim: 64,
        };
        let per = |dtype| recurrent_bytes(dn, 24, dtype);
        assert_eq!(per(StateDtype::F32), 24 * 32 * 128 * 128 * 4);
        assert_eq!(per(StateDtype::Bf16) * 2, per(StateDtype::F32));
        let (f32_slot, f32_page) = slot_and_page_bytes(dn, attn, (24, 8), 16, StateDtype::F32);
        let (bf16_slot, bf16_page) = slot_and_page_bytes(dn, attn, (24, 8), 16, StateDtype::Bf16);
        assert_eq!(f32_slot - bf16_slot, per(StateDtype::Bf16));
        // The conv state (bf16 either way) and the pages do not change.
        assert_eq!(bf16_slot - per(StateDtype::Bf16), 24 * 3 * 8192 * 2);
        assert_eq!(f32_page, bf16_page);
    }
}
