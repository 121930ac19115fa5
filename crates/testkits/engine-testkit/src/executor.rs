//! The fake executor: it keeps, per slot, the tokens the slot's state has
//! absorbed and, per page position, a fingerprint of the prefix whose KV
//! it holds, and refuses a step that breaks the executor contract (the
//! crate doc lists the checks).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use engine::sampler;
use engine::{
    check_row_snapshots, executor::Changed, ArenaGeometry, ArenaMap, BoxError, CacheGeometry,
    ExecError, Executor, MemoryOp, PageId, SampledToken, SlotId, SnapshotGeometry, SnapshotId,
    StepPhases, StepRow,
};

use crate::control::{FakeControl, FakeFailure, RowRecord};
use crate::model::fake_logits;

/// An executor that checks every row against the contract and runs a
/// hash for a model (see the crate doc).
pub struct FakeExecutor {
    geometry: CacheGeometry,
    control: FakeControl,
    /// Tokens absorbed by each slot's state; `None`: undefined (fresh, or
    /// lost in a failed step).
    slot_history: Vec<Option<Vec<u32>>>,
    /// Per page and offset: a fingerprint of the prefix whose KV the
    /// position holds (`None`: never written). A sequence's KV at position
    /// i is a function of its tokens up to i; the fake checks, before a row
    /// continues, that every earlier position holds exactly its own
    /// prefix's, whoever wrote it (shared prefix-cache pages included).
    page_kv: Vec<Vec<Option<u64>>>,
    /// The snapshot pool: the tokens each snapshot's state has absorbed.
    snapshots: Vec<Option<Vec<u32>>>,
    /// Step timing asked for (the request timeline); the last step's
    /// phases: the checks as host prep, the delay as the forward, the rows'
    /// sampling as sampling.
    timing: bool,
    last_phases: Option<StepPhases>,
    /// Snapshots a row may carry ([`Executor::max_row_snapshots`]).
    row_snapshots: usize,
    /// The arena the engine maps pages and slots from (`None`: all there).
    arena: Option<ArenaMap>,
}

/// Fingerprints of every prefix of `tokens` (`[i]`: of `tokens[..=i]`).
fn prefix_fingerprints(tokens: &[u32]) -> Vec<u64> {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ t as u64)
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(17);
            h
        })
        .collect()
}

/// Bytes the fake reports per snapshot (any positive number does).
pub const FAKE_SNAPSHOT_BYTES: usize = 4096;

impl FakeExecutor {
    pub fn new(geometry: CacheGeometry, control: FakeControl) -> Self {
        Self::with_snapshots(geometry, 0, control)
    }

    /// A fake with a pool of `num_snapshots` state snapshots.
    pub fn with_snapshots(
        geometry: CacheGeometry,
        num_snapshots: usize,
        control: FakeControl,
    ) -> Self {
        FakeExecutor {
            geometry,
            control,
            slot_history: vec![None; geometry.num_slots],
            page_kv: vec![vec![None; geometry.page_size]; geometry.num_pages],
            snapshots: vec![None; num_snapshots],
            timing: false,
            last_phases: None,
            row_snapshots: usize::MAX,
            arena: None,
        }
    }

    /// The same fake with its pages and slots in an arena: the engine must
    /// map a group before a row or a cache op touches it, and what a group
    /// held is forgotten when it is mapped or unmapped.
    pub fn with_arena(mut self, arena: ArenaGeometry) -> Self {
        self.arena = Some(ArenaMap::new(arena));
        self
    }

    /// A factory for a fake over an arena, with a snapshot pool.
    pub fn factory_with_arena(
        geometry: CacheGeometry,
        arena: ArenaGeometry,
        num_snapshots: usize,
        control: FakeControl,
    ) -> impl FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static {
        move || {
            Ok(Box::new(
                FakeExecutor::with_snapshots(geometry, num_snapshots, control).with_arena(arena),
            ) as Box<dyn Executor>)
        }
    }

    /// Whether `slot` and `pages` are mapped (always, without an arena).
    fn mapped(&self, slot: Option<SlotId>, pages: &[PageId]) -> bool {
        self.arena.as_ref().is_none_or(|a| a.covers(slot, pages))
    }

    /// The same fake taking at most `n` snapshots inside a row (0: none,
    /// an executor without the in-step snapshot; the default is any
    /// number).
    pub fn with_row_snapshots(mut self, n: usize) -> Self {
        self.row_snapshots = n;
        self
    }

    /// A factory for [`engine::Engine::start`].
    pub fn factory(
        geometry: CacheGeometry,
        control: FakeControl,
    ) -> impl FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static {
        Self::factory_with_snapshots(geometry, 0, control)
    }

    /// A factory for a fake with a snapshot pool.
    pub fn factory_with_snapshots(
        geometry: CacheGeometry,
        num_snapshots: usize,
        control: FakeControl,
    ) -> impl FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static {
        Self::factory_with_row_snapshots(geometry, num_snapshots, usize::MAX, control)
    }

    /// A factory for a fake with a snapshot pool taking at most
    /// `row_snapshots` snapshots inside a row.
    pub fn factory_with_row_snapshots(
        geometry: CacheGeometry,
        num_snapshots: usize,
        row_snapshots: usize,
        control: FakeControl,
    ) -> impl FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static {
        move || {
            Ok(Box::new(
                FakeExecutor::with_snapshots(geometry, num_snapshots, control)
                    .with_row_snapshots(row_snapshots),
            ) as Box<dyn Executor>)
        }
    }

    fn violation(&self, what: String) -> ExecError {
        self.control.lock().violations.push(what.clone());
        ExecError::Refused(what)
    }

    /// The contract checks that need no state change.
    fn check_rows(&self, rows: &[StepRow<'_>]) -> Result<(), String> {
        check_row_snapshots::<String>(rows, self.row_snapshots, self.snapshots.len())?;
        let ps = self.geometry.page_size;
        let mut slots = HashSet::new();
        // Pages a row writes (from the one holding its `start`): its own.
        let mut written = HashSet::new();
        for (i, row) in rows.iter().enumerate() {
            let slot = row.slot.0 as usize;
            if slot >= self.geometry.num_slots {
                return Err(format!("row {i}: slot {slot} out of range"));
            }
            if !slots.insert(row.slot) {
                return Err(format!("row {i}: slot {slot} twice in one step"));
            }
            if row.tokens.is_empty() {
                return Err(format!("row {i}: no tokens"));
            }
            if !self.mapped(Some(row.slot), row.pages) {
                return Err(format!("row {i}: its slot or a page is not mapped"));
            }
            let end = row.start + row.tokens.len();
            if row.pages.len() * ps < end {
                return Err(format!(
                    "row {i}: {} pages do not cover {end} positions",
                    row.pages.len()
                ));
            }
            if let Some(page) = row
                .pages
                .iter()
                .find(|p| p.0 as usize >= self.geometry.num_pages)
            {
                return Err(format!("row {i}: page {page:?} out of range"));
            }
            for page in &row.pages[row.start / ps..end.div_ceil(ps)] {
                if !written.insert(*page) {
                    return Err(format!(
                        "row {i}: page {page:?} written by two rows or twice"
                    ));
                }
            }
        }
        for (i, row) in rows.iter().enumerate() {
            if let Some(page) = row.pages[..row.start / ps]
                .iter()
                .find(|p| written.contains(p))
            {
                return Err(format!(
                    "row {i}: page {page:?} is read here and written by a row of the same step"
                ));
            }
        }
        for (i, row) in rows.iter().enumerate() {
            let slot = row.slot.0 as usize;
            if row.start > 0 {
                let Some(history) = &self.slot_history[slot] else {
                    return Err(format!(
                        "row {i}: continues slot {slot} at {} but its state is undefined",
                        row.start
                    ));
                };
                if history.len() != row.start {
                    return Err(format!(
                        "row {i}: start {} but slot {slot} holds {} tokens",
                        row.start,
                        history.len()
                    ));
                }
                // The KV of every earlier position must be this sequence's.
                for (pos, fingerprint) in prefix_fingerprints(history).into_iter().enumerate() {
                    let page = row.pages[pos / ps].0 as usize;
                    if self.page_kv[page][pos % ps] != Some(fingerprint) {
                        return Err(format!(
                            "row {i}: KV of position {pos} of slot {slot} is not its own"
                        ));
                    }
                }
            }
            if let Some(spec) = &row.sample {
                let mut history: Vec<u32> = if row.start > 0 {
                    self.slot_history[slot].clone().unwrap_or_default()
                } else {
                    Vec::new()
                };
                history.extend_from_slice(row.tokens);
                if spec.history != history.as_slice() {
                    return Err(format!("row {i}: sampling history is not the slot's"));
                }
                if spec.prompt_len == 0 || spec.prompt_len > history.len() {
                    return Err(format!(
                        "row {i}: prompt_len {} out of range",
                        spec.prompt_len
                    ));
                }
            }
        }
        Ok(())
    }

    fn run_row(&mut self, row: &StepRow<'_>) -> Option<SampledToken> {
        let slot = row.slot.0 as usize;
        let ps = self.geometry.page_size;
        let mut history = match row.start {
            0 => Vec::new(),
            _ => self.slot_history[slot]
                .take()
                .expect("checked before the step"),
        };
        history.extend_from_slice(row.tokens);
        // In-step snapshots: the state after `at` tokens is the history's
        // prefix (a snapshot taken at the wrong point fails at its restore).
        for s in row.snapshots {
            self.snapshots[s.snapshot.0 as usize] = Some(history[..s.at].to_vec());
        }
        let fingerprints = prefix_fingerprints(&history);
        for (pos, &fingerprint) in fingerprints.iter().enumerate().skip(row.start) {
            self.page_kv[row.pages[pos / ps].0 as usize][pos % ps] = Some(fingerprint);
        }
        let logits = fake_logits(&history, self.geometry.vocab_size);
        self.slot_history[slot] = Some(history);
        let spec = row.sample.as_ref()?;
        Some(sampler::sample(&logits, spec))
    }
}

impl Executor for FakeExecutor {
    fn geometry(&self) -> CacheGeometry {
        self.geometry
    }

    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError> {
        let (failure, delay) = {
            let (lock, ready) = &*self.control.0;
            let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
            while state.permits == Some(0) {
                state.blocked = true;
                state = ready.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.blocked = false;
            if let Some(permits) = state.permits.as_mut() {
                *permits -= 1;
            }
            state.steps.push(
                rows.iter()
                    .map(|r| RowRecord {
                        slot: r.slot,
                        start: r.start,
                        tokens: r.tokens.to_vec(),
                        pages: r.pages.to_vec(),
                        sample: r.sample.is_some(),
                        snapshots: r.snapshots.iter().map(|s| s.at).collect(),
                    })
                    .collect(),
            );
            (state.failures.pop_front(), state.delay)
        };
        self.last_phases = None;
        let slept = Instant::now();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let checked = Instant::now();
        if let Err(violation) = self.check_rows(rows) {
            self.control.lock().violations.push(violation.clone());
            return Err(ExecError::Refused(violation));
        }
        match failure {
            None => {}
            Some(FakeFailure::Refused) => return Err(ExecError::Refused("injected".into())),
            Some(FakeFailure::Fatal) => return Err(ExecError::Fatal("injected".into())),
            Some(FakeFailure::Panic) => panic!("injected executor panic"),
            Some(FakeFailure::StepFailed) => {
                // The step's slots are undefined afterwards, and so are the
                // snapshots it was to take (as if it failed half-way).
                for row in rows {
                    self.slot_history[row.slot.0 as usize] = None;
                    for s in row.snapshots {
                        self.snapshots[s.snapshot.0 as usize] = Some(vec![u32::MAX]);
                    }
                }
                return Err(ExecError::StepFailed("injected".into()));
            }
        }
        let ran = Instant::now();
        let sampled = rows.iter().filter_map(|row| self.run_row(row)).collect();
        if self.timing {
            self.last_phases = Some(StepPhases {
                host_prep: ran - checked,
                launch: Duration::ZERO,
                forward: checked - slept,
                sample: ran.elapsed(),
            });
        }
        Ok(sampled)
    }

    fn set_step_timing(&mut self, on: bool) {
        self.timing = on;
    }

    fn last_step_phases(&self) -> Option<StepPhases> {
        self.last_phases
    }

    fn max_row_snapshots(&self) -> usize {
        if self.snapshots.is_empty() {
            0
        } else {
            self.row_snapshots
        }
    }

    fn snapshot_geometry(&self) -> SnapshotGeometry {
        SnapshotGeometry {
            num_snapshots: self.snapshots.len(),
            snapshot_bytes: FAKE_SNAPSHOT_BYTES,
        }
    }

    fn arena_geometry(&self) -> Option<ArenaGeometry> {
        self.arena.as_ref().map(|a| a.geometry)
    }

    fn memory(&mut self, op: MemoryOp) -> Result<(), ExecError> {
        let Some(arena) = self.arena.as_mut() else {
            return Err(self.violation(format!("{op:?} without an arena")));
        };
        match arena.apply(op) {
            Err(why) => Err(self.violation(why.to_string())),
            // Mapped or unmapped memory holds nothing usable.
            Ok(Changed::Pages(ids)) => {
                let ps = self.geometry.page_size;
                for kv in self.page_kv.iter_mut().take(ids.end).skip(ids.start) {
                    *kv = vec![None; ps];
                }
                Ok(())
            }
            Ok(Changed::Slots(ids)) => {
                for history in self.slot_history.iter_mut().take(ids.end).skip(ids.start) {
                    *history = None;
                }
                Ok(())
            }
        }
    }

    fn snapshot(&mut self, slot: SlotId, snapshot: SnapshotId) -> Result<(), ExecError> {
        if !self.mapped(Some(slot), &[]) {
            return Err(self.violation(format!("snapshot of unmapped {slot:?}")));
        }
        let s = snapshot.0 as usize;
        let history = self.slot_history.get(slot.0 as usize).cloned().flatten();
        match history {
            Some(history) if s < self.snapshots.len() => {
                self.snapshots[s] = Some(history);
                Ok(())
            }
            _ => Err(self.violation(format!(
                "snapshot of slot {slot:?} (undefined or out of range) into {snapshot:?}"
            ))),
        }
    }

    fn restore(&mut self, snapshot: SnapshotId, slot: SlotId) -> Result<(), ExecError> {
        if !self.mapped(Some(slot), &[]) {
            return Err(self.violation(format!("restore into unmapped {slot:?}")));
        }
        let held = self.snapshots.get(snapshot.0 as usize).cloned().flatten();
        match held {
            Some(history) if (slot.0 as usize) < self.slot_history.len() => {
                self.slot_history[slot.0 as usize] = Some(history);
                Ok(())
            }
            _ => Err(self.violation(format!(
                "restore of {snapshot:?} (empty or out of range) into {slot:?}"
            ))),
        }
    }

    fn drop_snapshot(&mut self, snapshot: SnapshotId) {
        if let Some(s) = self.snapshots.get_mut(snapshot.0 as usize) {
            *s = None;
        }
    }

    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), ExecError> {
        let n = self.geometry.num_pages;
        if from.0 as usize >= n || to.0 as usize >= n {
            return Err(self.violation(format!("copy of page {from:?} onto {to:?}: out of range")));
        }
        if !self.mapped(None, &[from, to]) {
            return Err(self.violation(format!("copy of page {from:?} onto {to:?}: not mapped")));
        }
        self.page_kv[to.0 as usize] = self.page_kv[from.0 as usize].clone();
        Ok(())
    }
}
