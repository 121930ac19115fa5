//! The engine executor over the bf16 GPU runtime. The cache holds one slot
//! and one page more than the geometry tells the engine: the padding rows
//! of decode CUDA graphs run there, out of every real sequence's way.
//! Sampling runs on the device: the lm_head runs on the rows that sample
//! only, their logits stay where the lm_head wrote them, and the sampling
//! kernel (`gdn_kernels::DeviceSampler`, the engine's CPU sampler as its
//! oracle) brings back a few bytes per row (token, logprob, top list).
//! Constrained rows (`SampleSpec::allowed`) send their allowed-token masks
//! with the sampling launch, which runs after the forward (outside the
//! decode CUDA graphs): a step without constrained rows sends none.
//! In-step snapshots (`StepRow::snapshots`) split the step into passes
//! (`engine::split_rows`): a forward per piece, the state copied into the
//! snapshot's slot between them on the step stream.
//! With [`PagePool::Arena`] the slots' recurrent state and the pages are
//! mapped on demand from one pool ([`arena`]).

mod arena;

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};
use engine::{
    check_row_snapshots, in_row_order, split_rows, CacheGeometry, ExecError, Executor, PageId,
    SampleSpec, SampledToken, SlotId, StepPhases, StepRow,
};
use gdn_kernels::{DeviceSampler, MaskUpload, RowSampling, TokenAdjustment};

pub use arena::ArenaPool;

use super::checks::{check_rows, check_starts};
use super::gpu_memory::CacheMemory;
use crate::config::Config;
use crate::error::{LoadError, RunError};
use crate::gpu::{GpuCache, GpuModel, GpuOptions, Row, StepError};
use crate::row_logits::RowLogits;
use crate::timing::PhaseTimes;
use crate::weights::Weights;

/// Snapshot points one row may carry inside a step. A step whose rows
/// carry up to k of them runs k + 1 forwards (the later ones over the rows
/// with points left only), and every forward reads the weights once more
/// (a decode step's weight reads: its memory floor in docs/performance.md):
/// a chat prompt has two (preamble and marker), the last-token point and a
/// branch point make four; more end the chunk.
pub const MAX_ROW_SNAPSHOTS: usize = 4;

/// How many KV pages the executor allocates.
#[derive(Clone, Copy, Debug)]
pub enum PagePool {
    /// Exactly this many (tests: a tiny pool forces preemption).
    Fixed(usize),
    /// As many as fit in `gpu_memory_utilization` of the GPU's memory
    /// (vLLM's meaning: the fraction of the whole device this process may
    /// use) after the weights, the state slots and `activation_reserve`
    /// bytes for the activations of the largest step and the decode graphs.
    FromMemory {
        gpu_memory_utilization: f64,
        activation_reserve: usize,
    },
    /// KV pages and the slots' recurrent state drawn on demand from one
    /// pool of device memory ([`ArenaPool`]): the engine maps a slot's
    /// memory only while a request runs in it, so `num_slots` caps the
    /// slots instead of reserving them, and the pages get the rest.
    Arena(ArenaPool),
}

/// The memory the KV pages and the snapshot pool share, which a snapshot
/// budget given as a fraction divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheRoom {
    /// Pages sized from free memory: these bytes go to the snapshots and
    /// the pages together (what the snapshots take, the pages lose).
    Shared(usize),
    /// A fixed page count: the bytes of its KV pages (the snapshots come
    /// on top).
    FixedKv(usize),
}

#[derive(Clone, Copy, Debug)]
pub struct GpuSizing {
    pub num_slots: usize,
    pub pages: PagePool,
    pub page_size: usize,
    pub max_model_len: usize,
}

pub struct GpuExecutor {
    model: GpuModel,
    cache: GpuCache,
    geometry: CacheGeometry,
    /// Tokens each snapshot's state has seen (`None`: empty); the pool's size.
    snapshot_held: Vec<Option<usize>>,
    /// Device bytes of one slot (= one snapshot).
    slot_bytes: usize,
    /// Tokens each slot's state has seen (`None`: no sequence's state), so
    /// that a row continuing at the wrong position is refused, not run on
    /// the wrong state.
    held: Vec<Option<usize>>,
    sampler: DeviceSampler,
    /// The constrained rows' allowed-token masks on their way to the sampler.
    masks: MaskUpload,
    /// Recorded behind the forward before the masks are asked for: a mask
    /// that arrives once it has completed was late (the device waited).
    forward_queued: Option<CudaEvent>,
    /// Where start-up time went: loading (when [`GpuExecutor::load`] made
    /// it), the model's own phases, the cache, the graph captures.
    startup_phases: PhaseTimes,
    /// Step timing on (the request timeline), and the last step's phases.
    timing: bool,
    last_phases: Option<StepPhases>,
}

impl GpuExecutor {
    /// Loads a Hugging Face model directory onto the GPU of `stream` and
    /// sizes the cache.
    pub fn load(
        dir: &Path,
        stream: Arc<CudaStream>,
        options: GpuOptions,
        sizing: GpuSizing,
    ) -> Result<GpuExecutor, LoadError> {
        Self::load_with_snapshot_pool(dir, stream, options, sizing, |_, _| 0)
    }

    /// An executor over a loaded model: allocates `num_slots + 1` slots and
    /// the pages of `sizing.pages` plus one (the padding slot and page), or
    /// an arena that maps them on demand ([`PagePool::Arena`]).
    pub fn new(model: GpuModel, sizing: GpuSizing) -> Result<GpuExecutor, LoadError> {
        Self::with_snapshot_pool(model, sizing, 0)
    }

    /// [`GpuExecutor::new`] with a pool of `num_snapshots` state snapshots
    /// for the prefix cache, counted before the pages when sizing from
    /// memory. The pool is more slots of the same cache, after the padding
    /// slot: snapshot `k` is cache slot `num_slots + 1 + k`, so a snapshot
    /// and a restore are device-to-device slot copies
    /// ([`GpuCache::copy_slot`]) on the step stream, and no row ever names a
    /// snapshot's slot (the engine's slots stop at `num_slots`).
    pub fn with_snapshot_pool(
        model: GpuModel,
        sizing: GpuSizing,
        num_snapshots: usize,
    ) -> Result<GpuExecutor, LoadError> {
        let start = std::time::Instant::now();
        let GpuSizing {
            num_slots,
            pages,
            page_size,
            max_model_len,
        } = sizing;
        if num_slots == 0 || page_size == 0 || max_model_len == 0 {
            return Err(LoadError::Sizing(format!(
                "the GPU executor needs slots, a page size and max_model_len above 0 (got {sizing:?})"
            )));
        }
        let (slot_bytes, page_bytes) = model.slot_and_page_bytes(page_size);
        let num_pages = match pages {
            PagePool::Arena(pool) => {
                return Self::with_arena(model, sizing, pool, num_snapshots, start)
            }
            PagePool::Fixed(n) => n,
            PagePool::FromMemory {
                gpu_memory_utilization: u,
                activation_reserve,
            } => {
                let memory = Self::cache_memory(&model, &sizing, u, activation_reserve)?;
                let room = memory.room();
                log::info!(
                    "GPU executor: {} of {} MiB in use, {} MiB allowed; {num_slots} slots of {} MiB, {} MiB reserved for activations",
                    memory.used >> 20,
                    memory.total >> 20,
                    memory.allowed >> 20,
                    slot_bytes >> 20,
                    activation_reserve >> 20,
                );
                let snapshot_bytes = num_snapshots * slot_bytes;
                let n = room.saturating_sub(snapshot_bytes) / page_bytes.max(1);
                log::info!(
                    "GPU executor: {} MiB for KV pages and snapshots; {num_snapshots} snapshots of {} MiB take {} MiB: {n} KV pages of {page_size} positions ({} MiB each)",
                    room >> 20,
                    slot_bytes >> 20,
                    snapshot_bytes >> 20,
                    page_bytes >> 20
                );
                if n <= 1 {
                    return Err(LoadError::Sizing(memory.no_room(
                        num_snapshots,
                        page_bytes,
                        page_size,
                        max_model_len,
                    )));
                }
                n - 1
            }
        };
        if num_pages == 0 {
            return Err(LoadError::Sizing(format!(
                "no KV pages ({sizing:?}): a fixed pool needs at least one"
            )));
        }
        let cache = model.new_cache(num_slots + 1 + num_snapshots, num_pages + 1, page_size)?;
        let geometry = CacheGeometry {
            num_slots,
            num_pages,
            page_size,
            vocab_size: model.config.vocab_size,
            max_model_len: max_model_len.min(num_pages * page_size),
        };
        Self::assemble(model, cache, geometry, num_snapshots, start)
    }

    /// The executor over a made cache of `geometry` (with the spare slot and
    /// page and the snapshots' slots after the engine's), `start` being
    /// when the cache's set-up began.
    fn assemble(
        model: GpuModel,
        cache: GpuCache,
        geometry: CacheGeometry,
        num_snapshots: usize,
        start: std::time::Instant,
    ) -> Result<GpuExecutor, LoadError> {
        let (slot_bytes, _) = model.slot_and_page_bytes(geometry.page_size);
        let sampler = DeviceSampler::new(model.stream().clone())?;
        model.stream().synchronize()?;
        let mut startup_phases = model.load_phases().clone();
        startup_phases.push("cache_alloc", start.elapsed());
        Ok(GpuExecutor {
            model,
            cache,
            geometry,
            snapshot_held: vec![None; num_snapshots],
            slot_bytes,
            held: vec![None; geometry.num_slots],
            sampler,
            masks: MaskUpload::new(),
            forward_queued: None,
            startup_phases,
            timing: false,
            last_phases: None,
        })
    }

    /// The memory the KV pages and the snapshots share under `sizing`:
    /// with pages from memory, `gpu_memory_utilization` of the device less
    /// what is in use (the weights), the state slots (and the spare one the
    /// decode graphs are captured on) and the activation reserve.
    fn cache_room(model: &GpuModel, sizing: &GpuSizing) -> Result<CacheRoom, LoadError> {
        match sizing.pages {
            PagePool::Fixed(n) => {
                let (_, page_bytes) = model.slot_and_page_bytes(sizing.page_size);
                Ok(CacheRoom::FixedKv(n * page_bytes))
            }
            PagePool::FromMemory {
                gpu_memory_utilization: u,
                activation_reserve,
            } => Self::cache_memory(model, sizing, u, activation_reserve)
                .map(|memory| CacheRoom::Shared(memory.room())),
            PagePool::Arena(pool) => Self::arena_room(model, sizing, pool),
        }
    }

    /// The terms [`CacheRoom::Shared`]'s bytes come from (see
    /// [`Self::cache_room`]).
    fn cache_memory(
        model: &GpuModel,
        sizing: &GpuSizing,
        gpu_memory_utilization: f64,
        activation_reserve: usize,
    ) -> Result<CacheMemory, LoadError> {
        let u = gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(LoadError::Sizing(format!(
                "gpu_memory_utilization must be in (0, 1], got {u}"
            )));
        }
        let (slot_bytes, _) = model.slot_and_page_bytes(sizing.page_size);
        let (free, total) = model.stream().context().mem_get_info()?;
        Ok(CacheMemory {
            total,
            used: total - free,
            utilization: u,
            allowed: (total as f64 * u) as usize,
            num_slots: sizing.num_slots,
            slot_bytes,
            activation_reserve,
        })
    }

    /// The cache slot of `snapshot`.
    fn snapshot_slot(&self, snapshot: engine::SnapshotId) -> Result<SlotId, ExecError> {
        let k = snapshot.0 as usize;
        if k >= self.snapshot_held.len() {
            return Err(ExecError::Refused(format!(
                "snapshot {k} beyond the pool of {}",
                self.snapshot_held.len()
            )));
        }
        Ok(self.snapshot_cache_slot(snapshot))
    }

    /// The cache slot of `snapshot`, unchecked (see [`Self::snapshot_slot`]).
    fn snapshot_cache_slot(&self, snapshot: engine::SnapshotId) -> SlotId {
        SlotId((self.geometry.num_slots + 1) as u32 + snapshot.0)
    }

    /// [`GpuExecutor::load`] with a snapshot pool of `snapshots(slot_bytes,
    /// room)` snapshots (the caller turns its budget into a count; `room` is
    /// what the pages and the snapshots share).
    pub fn load_with_snapshot_pool(
        dir: &Path,
        stream: Arc<CudaStream>,
        options: GpuOptions,
        sizing: GpuSizing,
        snapshots: impl FnOnce(usize, CacheRoom) -> usize,
    ) -> Result<GpuExecutor, LoadError> {
        let mut phases = PhaseTimes::default();
        let config = phases.time("model_config", || {
            Config::from_file(&dir.join("config.json"))
        })?;
        let weights = phases.time("safetensors_open", || Weights::open(dir))?;
        let model = GpuModel::load(config, &weights, stream, options)?;
        // Unmapping the checkpoint takes time in proportion to its size
        // and nothing waits for it: it happens on a thread of its own.
        if let Err(e) = std::thread::Builder::new()
            .name("gdn-unmap".into())
            .spawn(move || drop(weights))
        {
            log::debug!("unmapping the checkpoint on this thread: {e}");
        }
        let (slot_bytes, _) = model.slot_and_page_bytes(sizing.page_size);
        let n = snapshots(slot_bytes, Self::cache_room(&model, &sizing)?);
        let mut executor = Self::with_snapshot_pool(model, sizing, n)?;
        phases.extend(&executor.startup_phases);
        executor.startup_phases = phases;
        Ok(executor)
    }

    /// Captures decode CUDA graphs for batch sizes 1, 2, 4, ... up to
    /// `max_batch` (and `max_batch` itself), capped by the slot count, for
    /// sequences up to `max_model_len`. Call at start-up: a decode step then
    /// replays the smallest graph that holds it and never waits for a
    /// capture. Returns the batch sizes captured.
    ///
    /// Every bucket is kept although each costs start-up time (its
    /// `decode_graph_b<size>` phase in [`GpuExecutor::startup_phases`]):
    /// any batch size up to the slot count occurs under continuous
    /// batching, and a step with no graph that holds it runs eagerly, which
    /// is slower on every step. Dropping buckets trades that for a shorter
    /// cold start; decide on the measured phases.
    pub fn capture_decode_graphs(&mut self, max_batch: usize) -> Result<Vec<usize>, RunError> {
        let top = max_batch.min(self.geometry.num_slots);
        let mut buckets: Vec<usize> = std::iter::successors(Some(1usize), |b| Some(b * 2))
            .take_while(|&b| b < top)
            .collect();
        if top > 0 {
            buckets.push(top);
        }
        let took = self.model.capture_decode_graphs(
            &mut self.cache,
            &buckets,
            self.geometry.max_model_len,
            SlotId(self.geometry.num_slots as u32),
            PageId(self.geometry.num_pages as u32),
        )?;
        for (bucket, time) in took {
            self.startup_phases
                .push(format!("decode_graph_b{bucket}"), time);
        }
        Ok(self.cache.decode_graph_batch_sizes())
    }

    /// Where start-up time went, phase by phase (see the field).
    pub fn startup_phases(&self) -> &PhaseTimes {
        &self.startup_phases
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// The device state (slot copies, export and import; a slot changed
    /// there must then be started again from position 0 or continued by the
    /// caller's own count, see [`GpuExecutor::set_held`]).
    pub fn cache_mut(&mut self) -> &mut GpuCache {
        &mut self.cache
    }

    /// Declares that `slot` now holds the state after `tokens` tokens (after
    /// an import or copy through [`GpuExecutor::cache_mut`]).
    pub fn set_held(&mut self, slot: SlotId, tokens: Option<usize>) -> Result<(), RunError> {
        let h = self.held.get_mut(slot.0 as usize).ok_or_else(|| {
            RunError::InvalidInput(format!("slot {} beyond the executor's slots", slot.0))
        })?;
        *h = tokens;
        Ok(())
    }
}

impl Executor for GpuExecutor {
    fn geometry(&self) -> CacheGeometry {
        self.geometry
    }

    fn arena_geometry(&self) -> Option<engine::ArenaGeometry> {
        self.cache.arena_geometry()
    }

    fn memory(&mut self, op: engine::MemoryOp) -> Result<(), ExecError> {
        self.memory_op(op)
    }

    fn max_row_snapshots(&self) -> usize {
        if self.snapshot_held.is_empty() {
            0
        } else {
            MAX_ROW_SNAPSHOTS
        }
    }

    fn state_geometry(&self) -> engine::StateGeometry {
        engine::StateGeometry {
            recurrent_dtype: self.model.state_dtype().name(),
            recurrent_bytes_per_slot: self.model.recurrent_bytes_per_slot(),
            slot_bytes: self.slot_bytes,
            page_bytes: self.model.slot_and_page_bytes(self.geometry.page_size).1,
        }
    }

    fn snapshot_geometry(&self) -> engine::SnapshotGeometry {
        engine::SnapshotGeometry {
            num_snapshots: self.snapshot_held.len(),
            snapshot_bytes: self.slot_bytes,
        }
    }

    fn snapshot(&mut self, slot: SlotId, snapshot: engine::SnapshotId) -> Result<(), ExecError> {
        let to = self.snapshot_slot(snapshot)?;
        let held = self.held.get(slot.0 as usize).copied().flatten();
        // (An unmapped slot holds nothing: unmapping forgets its state.)
        let Some(tokens) = held else {
            return Err(ExecError::Refused(format!(
                "snapshot of slot {}: no sequence's state there",
                slot.0
            )));
        };
        self.snapshot_held[snapshot.0 as usize] = None;
        self.cache
            .copy_slot(slot, to)
            .map_err(|e| ExecError::StepFailed(e.to_string()))?;
        self.snapshot_held[snapshot.0 as usize] = Some(tokens);
        Ok(())
    }

    fn restore(&mut self, snapshot: engine::SnapshotId, slot: SlotId) -> Result<(), ExecError> {
        let from = self.snapshot_slot(snapshot)?;
        let Some(tokens) = self.snapshot_held[snapshot.0 as usize] else {
            return Err(ExecError::Refused(format!(
                "restore of snapshot {}: nothing held there",
                snapshot.0
            )));
        };
        if slot.0 as usize >= self.geometry.num_slots || !self.cache.slot_usable(slot) {
            return Err(ExecError::Refused(format!(
                "restore into slot {}: no such slot, or its group is not mapped",
                slot.0
            )));
        }
        self.held[slot.0 as usize] = None;
        self.cache
            .copy_slot(from, slot)
            .map_err(|e| ExecError::StepFailed(e.to_string()))?;
        self.held[slot.0 as usize] = Some(tokens);
        Ok(())
    }

    fn drop_snapshot(&mut self, snapshot: engine::SnapshotId) {
        if let Some(held) = self.snapshot_held.get_mut(snapshot.0 as usize) {
            *held = None;
        }
    }

    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), ExecError> {
        let n = self.geometry.num_pages;
        if from.0 as usize >= n || to.0 as usize >= n {
            return Err(ExecError::Refused(format!(
                "page copy {} -> {}: beyond the {n} pages",
                from.0, to.0
            )));
        }
        if !self.cache.page_usable(from) || !self.cache.page_usable(to) {
            return Err(ExecError::Refused(format!(
                "page copy {} -> {}: a page whose group is not mapped",
                from.0, to.0
            )));
        }
        self.cache
            .copy_page(from, to)
            .map_err(|e| ExecError::StepFailed(e.to_string()))
    }

    fn set_step_timing(&mut self, on: bool) {
        match self.model.set_step_timing(on) {
            Ok(()) => self.timing = on,
            Err(e) => log::warn!("step timing stays off: {e}"),
        }
    }

    fn last_step_phases(&self) -> Option<StepPhases> {
        self.last_phases
    }

    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError> {
        self.last_phases = None;
        let entered = self.timing.then(std::time::Instant::now);
        check_rows(rows, &self.geometry)?;
        check_starts(rows, |slot| self.held[slot])?;
        check_row_snapshots(rows, self.max_row_snapshots(), self.snapshot_held.len())
            .map_err(ExecError::Refused)?;
        // One pass without in-step snapshots; else a forward per piece
        // (the rows with points left), the snapshot copies between them.
        let passes = split_rows(rows);
        let mut per_pass = Vec::with_capacity(passes.len());
        let mut timings = Vec::with_capacity(passes.len());
        for (j, pass) in passes.iter().enumerate() {
            let ran = self.run_pass(&pass.rows).and_then(|sampled| {
                for (slot, point) in &pass.snapshots_after {
                    // In the pool: checked with the rows.
                    let to = self.snapshot_cache_slot(point.snapshot);
                    self.cache.copy_slot(*slot, to)?;
                }
                Ok(sampled)
            });
            match ran {
                Ok(sampled) => per_pass.push(sampled),
                // Nothing ran yet: the rows' states are unchanged.
                Err(StepError::Refused(m)) if j == 0 => return Err(ExecError::Refused(m)),
                Err(e) => return Err(self.lose_step(rows, e)),
            }
            timings.extend(self.model.last_forward_timing());
        }
        for r in rows {
            self.held[r.slot.0 as usize] = Some(r.start + r.tokens.len());
            for point in r.snapshots {
                self.snapshot_held[point.snapshot.0 as usize] = Some(point.at);
            }
        }
        if let (Some(entered), Some(first)) = (entered, timings.first()) {
            // Several passes: their launches, forwards and samplings add up.
            let sum = |f: &dyn Fn(&crate::gpu::ForwardTiming) -> std::time::Duration| {
                timings.iter().map(f).sum()
            };
            self.last_phases = Some(StepPhases {
                host_prep: first.launch_start.saturating_duration_since(entered),
                launch: sum(&|t| t.launch_end.saturating_duration_since(t.launch_start)),
                forward: sum(&|t| t.forward),
                sample: sum(&|t| t.after_forward),
            });
        }
        Ok(in_row_order(&passes, per_pass))
    }
}

impl GpuExecutor {
    /// One forward over `rows` (no in-step snapshots: a pass of
    /// [`split_rows`]) and the sampling of the rows that ask.
    fn run_pass(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, StepError> {
        let model_rows: Vec<Row> = rows
            .iter()
            .map(|r| Row {
                slot: r.slot,
                start: r.start,
                tokens: r.tokens,
                pages: r.pages,
                logits: if r.sample.is_some() {
                    RowLogits::Last
                } else {
                    RowLogits::None
                },
            })
            .collect();
        let specs: Vec<&SampleSpec> = rows.iter().filter_map(|r| r.sample.as_ref()).collect();
        let vocab = self.geometry.vocab_size;
        let adjustments: Vec<Vec<TokenAdjustment>> = specs
            .iter()
            .map(|spec| device_adjustments(spec, vocab))
            .collect();
        let sampler = &mut self.sampler;
        let mask_upload = &mut self.masks;
        let forward_queued = &mut self.forward_queued;
        let sampled = self
            .model
            .step_device(&mut self.cache, &model_rows, |logits, at| {
                if at.len() != specs.len() {
                    return Err(StepError::Failed(RunError::InvalidInput(format!(
                        "the model returned {} logits rows for {} sampling rows",
                        at.len(),
                        specs.len()
                    ))));
                }
                // The constrained rows' masks, in row order: mask row k is
                // the k-th constrained row's.
                let mut constrained = 0..;
                let wanted: Vec<RowSampling> = specs
                    .iter()
                    .zip(at)
                    .zip(&adjustments)
                    .map(|((spec, &row), adj)| {
                        let mask_row = spec.allowed.and_then(|_| constrained.next());
                        row_sampling(spec, row, adj, mask_row)
                    })
                    .collect();
                let forward_done = if specs.iter().any(|spec| spec.allowed.is_some()) {
                    Some(recorded(forward_queued, sampler.stream())?)
                } else {
                    None
                };
                let allowed: Vec<&[u32]> = specs
                    .iter()
                    .filter_map(|spec| spec.allowed)
                    // `words` may wait for the engine's mask pool: asked
                    // only now, with the forward already queued; a wait
                    // that outlasts the forward is counted as late.
                    .map(|a| a.words_while(|| forward_done.is_some_and(|e| !e.is_complete())))
                    .collect();
                let masks = if allowed.is_empty() {
                    None
                } else {
                    Some(mask_upload.upload(sampler.stream(), vocab, &allowed)?)
                };
                Ok(sampler.sample(logits, vocab, &wanted, masks.as_ref())?)
            })?;
        Ok(sampled
            .into_iter()
            .map(|s| SampledToken {
                token: s.token,
                logprob: s.logprob,
                top_logprobs: s.top_logprobs,
            })
            .collect())
    }

    /// A step that failed once device work was queued: its slots and the
    /// snapshots it was to take hold nothing usable; a context that cannot
    /// even synchronise is lost (a sticky CUDA error).
    fn lose_step(&mut self, rows: &[StepRow<'_>], e: StepError) -> ExecError {
        for r in rows {
            self.held[r.slot.0 as usize] = None;
            for point in r.snapshots {
                self.snapshot_held[point.snapshot.0 as usize] = None;
            }
        }
        match self.model.stream().synchronize() {
            Ok(()) => ExecError::StepFailed(e.to_string()),
            Err(lost) => ExecError::Fatal(format!("{e}; then {lost}")),
        }
    }
}

/// `event` (created on first use) recorded on `stream` now.
fn recorded<'e>(
    event: &'e mut Option<CudaEvent>,
    stream: &Arc<CudaStream>,
) -> Result<&'e CudaEvent, StepError> {
    if event.is_none() {
        *event = Some(stream.context().new_event(None)?);
    }
    let event = event.as_ref().expect("created above");
    event.record(stream)?;
    Ok(event)
}

/// The engine's sparse penalties and bans of one row, as the kernel takes
/// them.
pub(crate) fn device_adjustments(spec: &SampleSpec, vocab: usize) -> Vec<TokenAdjustment> {
    engine::sampler::adjustments(spec, vocab)
        .into_iter()
        .map(|a| TokenAdjustment {
            token: a.token,
            repetition: a.repetition,
            subtract: a.subtract,
            ban: a.ban,
        })
        .collect()
}

/// One row's sampling request to the kernel, reading logits row `row` (and
/// mask row `mask_row` of the call's masks, when constrained).
pub(crate) fn row_sampling<'a>(
    spec: &SampleSpec,
    row: usize,
    adjustments: &'a [TokenAdjustment],
    mask_row: Option<usize>,
) -> RowSampling<'a> {
    let p = spec.params;
    RowSampling {
        logits_row: row,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        logprobs: p.logprobs,
        seed: spec.seed.seed,
        draw: spec.seed.draw,
        adjustments,
        mask_row,
    }
}
