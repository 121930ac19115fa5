//! Starting the engine thread: load the executor, size the scheduler from
//! its geometry, publish that the engine is ready, then serve until the
//! inbox closes or the engine dies.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use thiserror::Error;

use super::request_memory::RequestMemory;
use super::{panic_text, Worker};
use crate::config::EngineConfig;
use crate::constraint::StepConstraints;
use crate::executor::{
    ArenaGeometry, BoxError, CacheGeometry, Executor, SnapshotGeometry, StateGeometry,
};
use crate::metrics::Metrics;
use crate::prefix_cache::{PrefixCacheConfig, PrefixCacheStats};
use crate::protocol::{Command, Shared};
use crate::request::EngineState;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// Why the executor could not be loaded (the engine is then `Dead`).
#[derive(Debug, Error)]
pub(crate) enum LoadError {
    /// The factory's own error (the runtime's).
    #[error("{0}")]
    Factory(BoxError),
    #[error("executor factory panicked: {0}")]
    FactoryPanicked(String),
    #[error("executor geometry has an empty pool: {0:?}")]
    EmptyPool(CacheGeometry),
    #[error("executor max_model_len {0} < 2")]
    ModelLenTooShort(usize),
}

fn check_geometry(g: &CacheGeometry) -> Result<(), LoadError> {
    if g.num_slots == 0 || g.num_pages == 0 || g.page_size == 0 || g.vocab_size == 0 {
        return Err(LoadError::EmptyPool(*g));
    }
    if g.max_model_len < 2 {
        return Err(LoadError::ModelLenTooShort(g.max_model_len));
    }
    Ok(())
}

pub(crate) fn run<F>(
    shared: Arc<Shared>,
    make_executor: F,
    inbox: mpsc::Receiver<Command>,
    metrics: Metrics,
) where
    F: FnOnce() -> Result<Box<dyn Executor>, LoadError>,
{
    let Some(executor) = load_executor(&shared, make_executor) else {
        return;
    };
    let geometry = executor.geometry();
    let snapshots = executor.snapshot_geometry();
    let state = executor.state_geometry();
    let config = &shared.config;
    let (scheduler, max_model_len) = scheduler_for(config, executor.as_ref(), geometry, snapshots);
    let arena = executor.arena_geometry();
    publish_ready(&shared, &metrics, geometry, state, arena, max_model_len);
    let constraints = step_constraints(config, geometry);
    let mut worker = Worker {
        constraints,
        shared: shared.clone(),
        executor: Some(executor),
        scheduler,
        clients: HashMap::new(),
        metrics,
        seeds: RandomState::new(),
        steps: 0,
        aborted: 0,
        deadline: None,
        snapshot_bytes: snapshots.snapshot_bytes,
        published_cache: PrefixCacheStats::default(),
    };
    worker.publish();
    serve_until_stopped(worker, inbox, &shared);
}

/// The executor the factory makes, with a usable geometry; `None` (the
/// engine marked dead and stopped) if there is none.
fn load_executor<F>(shared: &Shared, make_executor: F) -> Option<Box<dyn Executor>>
where
    F: FnOnce() -> Result<Box<dyn Executor>, LoadError>,
{
    let made = catch_unwind(AssertUnwindSafe(make_executor))
        .unwrap_or_else(|p| Err(LoadError::FactoryPanicked(panic_text(&*p))));
    let executor = made.and_then(|e| check_geometry(&e.geometry()).map(|()| e));
    match executor {
        Ok(mut executor) => {
            if shared.config.request_timeline {
                executor.set_step_timing(true);
            }
            Some(executor)
        }
        Err(why) => {
            log::error!("engine failed to load: {why}");
            shared.set_state(EngineState::Dead(format!("loading failed: {why}")));
            shared.stopped.send_replace(true);
            None
        }
    }
}

/// The scheduler for the executor's geometry, and the longest sequence it
/// admits.
fn scheduler_for(
    config: &EngineConfig,
    executor: &dyn Executor,
    geometry: CacheGeometry,
    snapshots: SnapshotGeometry,
) -> (Scheduler, usize) {
    let prefix_cache = PrefixCacheConfig {
        max_snapshots: config
            .prefix_cache
            .max_snapshots
            .min(snapshots.num_snapshots),
        ..config.prefix_cache.clone()
    };
    if config.prefix_cache.enabled {
        log::info!(
            "prefix cache: {} snapshots of {} bytes ({} in the executor's pool)",
            prefix_cache.max_snapshots,
            snapshots.snapshot_bytes,
            snapshots.num_snapshots
        );
    }
    // Snapshot points inside a row, when the executor can take them there
    // (else chunks end at the points).
    let row_snapshots = if prefix_cache.in_step_snapshots {
        executor.max_row_snapshots()
    } else {
        0
    };
    // A lone sequence must always fit in the page pool, so the oldest
    // request can always progress (preemption frees everything else); with
    // an arena, next to its slot's chunks.
    let arena = executor.arena_geometry();
    let lone_pages = match arena {
        Some(a) => {
            let chunks = a.num_chunks.saturating_sub(a.chunks_per_slot_group);
            (chunks / a.chunks_per_page_group * a.pages_per_group).min(geometry.num_pages)
        }
        None => geometry.num_pages,
    };
    let max_model_len = config
        .max_model_len
        .min(geometry.max_model_len)
        .min(lone_pages * geometry.page_size);
    let scheduler = Scheduler::with_arena(
        SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs.min(geometry.num_slots),
            max_model_len,
            long_prefill_token_threshold: config.long_prefill_token_threshold,
            eos_token_ids: config.eos_token_ids.clone(),
            row_snapshots,
            prefix_cache,
            admission: config.admission,
        },
        &geometry,
        arena,
    );
    (scheduler, max_model_len)
}

/// Tells the rest of the engine what the executor holds (vocabulary,
/// context, slots, state) and marks it ready, unless it is shutting down.
fn publish_ready(
    shared: &Shared,
    metrics: &Metrics,
    geometry: CacheGeometry,
    state: StateGeometry,
    arena: Option<ArenaGeometry>,
    max_model_len: usize,
) {
    *shared.vocab_size.lock().unwrap() = Some(geometry.vocab_size);
    *shared.max_model_len.lock().unwrap() = Some(max_model_len);
    {
        let mut state = shared.state.lock().unwrap();
        if *state == EngineState::Loading {
            *state = EngineState::Ready;
        }
    }
    metrics.state_slots_total.set(geometry.num_slots as i64);
    if !state.recurrent_dtype.is_empty() {
        log::info!(
            "recurrent state: {} bytes a slot in {} ({} bytes a slot with the conv state), {} bytes over {} slots",
            state.recurrent_bytes_per_slot,
            state.recurrent_dtype,
            state.slot_bytes,
            state.recurrent_bytes_per_slot * geometry.num_slots,
            geometry.num_slots
        );
    }
    metrics.set_state_geometry(&state, geometry.num_slots);
    let pool = RequestMemory::new(geometry, state, arena, max_model_len);
    log::info!("{pool}");
    metrics.cache_pool_bytes.set(pool.bytes() as i64);
    metrics.max_concurrency.set(pool.max_concurrency());
    shared.running_capacity.store(
        shared.config.max_num_seqs.min(geometry.num_slots),
        Ordering::Release,
    );
}

/// The structured-output mask pool, where structured outputs are on.
fn step_constraints(config: &EngineConfig, geometry: CacheGeometry) -> Option<StepConstraints> {
    config.structured_outputs.as_ref().map(|_| {
        let threads = match config.mask_threads {
            0 => crate::constraint::default_mask_threads(),
            n => n,
        };
        StepConstraints::new(threads, geometry.vocab_size)
    })
}

/// Serves `inbox` until it closes or the engine dies, then drops the
/// executor and says the engine stopped.
fn serve_until_stopped(mut worker: Worker, inbox: mpsc::Receiver<Command>, shared: &Shared) {
    // The step is guarded inside serve; this catches a panic anywhere else
    // on the thread (command handling, aborts) so that clients and /health
    // learn of it instead of waiting on a silent thread.
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| worker.serve(inbox))) {
        let why = format!("engine panicked: {}", panic_text(&*payload));
        if catch_unwind(AssertUnwindSafe(|| worker.die(why.clone()))).is_err() {
            shared.set_state(EngineState::Dead(why));
        }
    }
    // Drop the executor here, not during unwinding elsewhere; a panic in
    // its destructor must not take the stopped flag with it.
    let executor = worker.executor.take();
    if catch_unwind(AssertUnwindSafe(move || drop(executor))).is_err() {
        log::error!("the executor panicked while being dropped");
    }
    shared.stopped.send_replace(true);
}
