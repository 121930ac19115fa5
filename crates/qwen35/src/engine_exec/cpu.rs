//! The engine executor over the f32 CPU reference forward. Each slot holds a
//! [`CpuState`] (conv, recurrent state and its own growing KV cache): pages
//! are checked for bounds only, the CPU forward keeps keys and values per
//! sequence. Rows of one step run on separate threads (their states are
//! disjoint). The prefix cache's snapshots are whole [`CpuState`] clones
//! (keys and values included, since they live in the state here), so a
//! page copy has nothing to do. A row's in-step snapshots
//! (`StepRow::snapshots`) are taken on its own thread: the row runs up to
//! each point, the state is cloned, the row runs on.

use std::path::Path;
use std::time::Duration;

use engine::executor::Changed;
use engine::{
    check_row_snapshots, ArenaGeometry, ArenaMap, CacheGeometry, ExecError, Executor, MemoryOp,
    PageId, SampledToken, SlotId, SnapshotGeometry, SnapshotId, StepPhases, StepRow,
};

use super::checks::{check_rows, check_starts};
use crate::config::Config;
use crate::cpu::{CpuModel, CpuState};
use crate::error::{LoadError, RunError};
use crate::row_logits::RowLogits;
use crate::state_dtype::StateDtypeRequest;
use crate::weights::Weights;

/// What the CPU executor offers the engine's allocator.
#[derive(Clone, Copy, Debug)]
pub struct CpuSizing {
    pub num_slots: usize,
    /// KV pages the engine may hand out (they bound memory use the way a
    /// GPU's page pool does; the CPU forward stores keys per sequence).
    pub num_pages: usize,
    pub page_size: usize,
    pub max_model_len: usize,
}

pub struct CpuExecutor {
    model: CpuModel,
    geometry: CacheGeometry,
    /// By slot: `None` until a sequence starts there.
    states: Vec<Option<CpuState>>,
    /// The snapshot pool (prefix cache): `None` where nothing is held.
    snapshots: Vec<Option<CpuState>>,
    /// Step timing on (the request timeline), and the last step's phases.
    timing: bool,
    last_phases: Option<StepPhases>,
    /// With [`CpuExecutor::with_arena`]: the groups the engine has mapped.
    arena: Option<ArenaMap>,
}

impl CpuExecutor {
    pub fn new(model: CpuModel, sizing: CpuSizing) -> Result<CpuExecutor, LoadError> {
        let CpuSizing {
            num_slots,
            num_pages,
            page_size,
            max_model_len,
        } = sizing;
        if num_slots == 0 || num_pages == 0 || page_size == 0 || max_model_len == 0 {
            return Err(LoadError::Sizing(format!(
                "the CPU executor needs slots, pages, a page size and max_model_len above 0 (got {sizing:?})"
            )));
        }
        let geometry = CacheGeometry {
            num_slots,
            num_pages,
            page_size,
            vocab_size: model.config.vocab_size,
            // No sequence can hold more positions than the pages cover.
            max_model_len: max_model_len.min(num_pages * page_size),
        };
        Ok(CpuExecutor {
            model,
            geometry,
            states: (0..num_slots).map(|_| None).collect(),
            snapshots: Vec::new(),
            timing: false,
            last_phases: None,
            arena: None,
        })
    }

    /// The same executor with its pages and slots in an arena of the same
    /// memory (the sizing's pages and slots, in the bytes the GPU lays them
    /// out in): a chunk is one page, a slot takes the pages its state
    /// weighs, and the engine maps them as requests take them, so
    /// `num_slots` only caps the running requests. A slot's state is
    /// dropped when its group is unmapped.
    pub fn with_arena(mut self) -> Self {
        let bytes = self.state_geometry();
        let slot_chunks = bytes.slot_bytes.div_ceil(bytes.page_bytes.max(1)).max(1);
        let g = &mut self.geometry;
        let arena = ArenaGeometry {
            num_chunks: g.num_pages + g.num_slots * slot_chunks,
            chunk_bytes: bytes.page_bytes,
            pages_per_group: 1,
            chunks_per_page_group: 1,
            slots_per_group: 1,
            chunks_per_slot_group: slot_chunks,
        };
        g.num_pages = arena.max_pages();
        g.max_model_len = g
            .max_model_len
            .min((arena.num_chunks - slot_chunks) * g.page_size);
        self.arena = Some(ArenaMap::new(arena));
        self
    }

    /// Refuses a slot or pages outside the mapped groups.
    fn check_mapped(&self, slot: Option<SlotId>, pages: &[PageId]) -> Result<(), ExecError> {
        match &self.arena {
            Some(a) if !a.covers(slot, pages) => Err(ExecError::Refused(format!(
                "slot {slot:?} or a page of {pages:?} is not mapped"
            ))),
            _ => Ok(()),
        }
    }

    /// The same executor with a pool of `num_snapshots` state snapshots
    /// (the prefix cache's).
    pub fn with_snapshot_pool(mut self, num_snapshots: usize) -> Self {
        self.snapshots = (0..num_snapshots).map(|_| None).collect();
        self
    }

    /// Loads a Hugging Face model directory (`config.json` and safetensors).
    pub fn load(dir: &Path, sizing: CpuSizing) -> Result<CpuExecutor, LoadError> {
        Self::load_with_state_dtype(dir, sizing, StateDtypeRequest::Auto)
    }

    /// [`CpuExecutor::load`] with the recurrent state stored as `state_dtype`
    /// asks (`Auto`: the config's `mamba_ssm_dtype`).
    pub fn load_with_state_dtype(
        dir: &Path,
        sizing: CpuSizing,
        state_dtype: StateDtypeRequest,
    ) -> Result<CpuExecutor, LoadError> {
        let config = Config::from_file(&dir.join("config.json"))?;
        let dtype = state_dtype.resolve(config.mamba_ssm_dtype);
        let weights = Weights::open(dir)?;
        Self::new(
            CpuModel::load(config, &weights)?.with_state_dtype(dtype),
            sizing,
        )
    }

    pub fn model(&self) -> &CpuModel {
        &self.model
    }
}

impl Executor for CpuExecutor {
    fn geometry(&self) -> CacheGeometry {
        self.geometry
    }

    fn arena_geometry(&self) -> Option<ArenaGeometry> {
        self.arena.as_ref().map(|a| a.geometry)
    }

    fn memory(&mut self, op: MemoryOp) -> Result<(), ExecError> {
        let Some(arena) = self.arena.as_mut() else {
            return Err(ExecError::Refused("this executor has no arena".into()));
        };
        // The pages' keys live in the states: only the slots hold memory.
        let changed = arena
            .apply(op)
            .map_err(|e| ExecError::Refused(e.to_string()))?;
        if let Changed::Slots(ids) = changed {
            for state in self.states.iter_mut().take(ids.end).skip(ids.start) {
                *state = None;
            }
        }
        Ok(())
    }

    fn max_row_snapshots(&self) -> usize {
        // Any number: each point is one more forward call over the row's
        // next piece, on the row's own thread.
        if self.snapshots.is_empty() {
            0
        } else {
            usize::MAX
        }
    }

    fn state_geometry(&self) -> engine::StateGeometry {
        // The CPU state holds f32 values (rounded to the dtype after every
        // token); the bytes are what the dtype stores, as a GPU slot would.
        let c = &self.model.config;
        let linear = c
            .layer_types
            .iter()
            .filter(|t| **t == crate::config::LayerType::Linear)
            .count();
        let dtype = self.model.state_dtype();
        let per_layer = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
        let conv = (c.linear_conv_kernel_dim - 1) * c.linear_conv_dim() * 2;
        // Pages likewise as the GPU lays them out: bf16 keys and values.
        let attention = c.layer_types.len() - linear;
        let page_len = self.geometry.page_size * c.num_key_value_heads * c.head_dim;
        engine::StateGeometry {
            recurrent_dtype: dtype.name(),
            recurrent_bytes_per_slot: linear * per_layer * dtype.bytes(),
            slot_bytes: linear * (per_layer * dtype.bytes() + conv),
            page_bytes: attention * 2 * page_len * 2,
        }
    }

    fn snapshot_geometry(&self) -> SnapshotGeometry {
        SnapshotGeometry {
            num_snapshots: self.snapshots.len(),
            snapshot_bytes: self.model.new_state().recurrent_bytes(),
        }
    }

    fn snapshot(&mut self, slot: SlotId, snapshot: SnapshotId) -> Result<(), ExecError> {
        self.check_mapped(Some(slot), &[])?;
        let state = self.states.get(slot.0 as usize).and_then(Option::as_ref);
        let Some(state) = state else {
            return Err(ExecError::Refused(format!(
                "snapshot of slot {}: no sequence's state there",
                slot.0
            )));
        };
        let Some(place) = self.snapshots.get_mut(snapshot.0 as usize) else {
            return Err(ExecError::Refused(format!(
                "snapshot {} beyond the pool of {}",
                snapshot.0,
                self.snapshots.len()
            )));
        };
        *place = Some(state.clone());
        Ok(())
    }

    fn restore(&mut self, snapshot: SnapshotId, slot: SlotId) -> Result<(), ExecError> {
        self.check_mapped(Some(slot), &[])?;
        let Some(Some(state)) = self.snapshots.get(snapshot.0 as usize) else {
            return Err(ExecError::Refused(format!(
                "restore of snapshot {}: nothing held there",
                snapshot.0
            )));
        };
        let Some(place) = self.states.get_mut(slot.0 as usize) else {
            return Err(ExecError::Refused(format!(
                "restore into slot {}: no such slot",
                slot.0
            )));
        };
        *place = Some(state.clone());
        Ok(())
    }

    fn drop_snapshot(&mut self, snapshot: SnapshotId) {
        if let Some(place) = self.snapshots.get_mut(snapshot.0 as usize) {
            *place = None;
        }
    }

    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), ExecError> {
        // Keys and values live in the states (restored whole): only bounds.
        let n = self.geometry.num_pages;
        if from.0 as usize >= n || to.0 as usize >= n {
            return Err(ExecError::Refused(format!(
                "page copy {} -> {}: beyond the {n} pages",
                from.0, to.0
            )));
        }
        self.check_mapped(None, &[from, to])
    }

    fn set_step_timing(&mut self, on: bool) {
        self.timing = on;
    }

    fn last_step_phases(&self) -> Option<StepPhases> {
        self.last_phases
    }

    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError> {
        self.last_phases = None;
        let entered = std::time::Instant::now();
        check_rows(rows, &self.geometry)?;
        for r in rows {
            self.check_mapped(Some(r.slot), r.pages)?;
        }
        check_starts(rows, |slot| self.states[slot].as_ref().map(|s| s.position))?;
        check_row_snapshots(rows, usize::MAX, self.snapshots.len()).map_err(ExecError::Refused)?;
        // Every check is done: from here each row runs to completion.
        let mut work: Vec<(&StepRow, CpuState)> = rows
            .iter()
            .map(|r| {
                let slot = &mut self.states[r.slot.0 as usize];
                let state = match (r.start, slot.take()) {
                    (0, _) | (_, None) => self.model.new_state(),
                    (_, Some(s)) => s,
                };
                (r, state)
            })
            .collect();
        let model = &self.model;
        // A row's sampled token (if it samples) and the states of its
        // in-step snapshots, in order.
        type RowResult = Result<(Option<SampledToken>, Vec<CpuState>), RunError>;
        let run = |(r, state): &mut (&StepRow, CpuState)| -> RowResult {
            let mut taken = Vec::with_capacity(r.snapshots.len());
            let mut from = r.start;
            for point in r.snapshots {
                let piece = &r.tokens[from - r.start..point.at - r.start];
                model.forward_logits(piece, state, RowLogits::None)?;
                taken.push(state.clone());
                from = point.at;
            }
            let which = if r.sample.is_some() {
                RowLogits::Last
            } else {
                RowLogits::None
            };
            let logits = model.forward_logits(&r.tokens[from - r.start..], state, which)?;
            let sampled = r
                .sample
                .as_ref()
                .map(|spec| engine::sampler::sample(&logits[0], spec));
            Ok((sampled, taken))
        };
        let forward_start = std::time::Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_thread = work.len().div_ceil(threads.min(work.len()));
        let results: Vec<RowResult> = std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .chunks_mut(per_thread)
                .map(|chunk| scope.spawn(move || chunk.iter_mut().map(run).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a CPU forward thread panicked"))
                .collect()
        });
        for (r, state) in work {
            self.states[r.slot.0 as usize] = Some(state);
        }
        let mut sampled = vec![];
        for (r, res) in rows.iter().zip(results) {
            match res {
                Ok((token, taken)) => {
                    for (point, state) in r.snapshots.iter().zip(taken) {
                        self.snapshots[point.snapshot.0 as usize] = Some(state);
                    }
                    sampled.extend(token);
                }
                // The checks above make the forward infallible; a failure
                // here leaves this row's state advanced by an unknown count.
                Err(e) => {
                    self.states[r.slot.0 as usize] = None;
                    return Err(ExecError::StepFailed(e.to_string()));
                }
            }
        }
        if self.timing {
            // Each row samples right after its own forward, on its thread:
            // sampling is counted in the forward here.
            let forward = forward_start.elapsed();
            self.last_phases = Some(StepPhases {
                host_prep: forward_start - entered,
                launch: Duration::ZERO,
                forward,
                sample: Duration::ZERO,
            });
        }
        Ok(sampled)
    }
}
