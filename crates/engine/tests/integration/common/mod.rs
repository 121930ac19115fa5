//! Helpers shared by the engine tests (fake executor, request builders).
#![allow(dead_code)] // each test file uses a different subset

use std::time::{Duration, Instant};

use engine::{
    BoxError, CacheGeometry, Engine, EngineConfig, EngineHandle, EngineStats, Event, Executor,
    FinishReason, GenerateRequest, SamplingParams, StopParams,
};
use engine_testkit::{FakeControl, FakeExecutor};

pub const VOCAB: usize = 64;
pub const EOS: u32 = 0;

pub fn geometry(num_slots: usize, num_pages: usize, page_size: usize) -> CacheGeometry {
    CacheGeometry {
        num_slots,
        num_pages,
        page_size,
        vocab_size: VOCAB,
        max_model_len: num_pages * page_size,
    }
}

pub fn config(budget: usize, max_num_seqs: usize) -> EngineConfig {
    let mut config = EngineConfig::new(vec![EOS]);
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = max_num_seqs;
    config
}

pub struct Started {
    pub handle: EngineHandle,
    pub control: FakeControl,
    pub registry: prometheus::Registry,
}

pub fn start(config: EngineConfig, geometry: CacheGeometry) -> Started {
    start_fake(config, |control| FakeExecutor::factory(geometry, control))
}

/// The engine over the fake `factory` makes with the run's control, once
/// the executor has loaded.
pub fn start_fake<F>(config: EngineConfig, factory: impl FnOnce(FakeControl) -> F) -> Started
where
    F: FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static,
{
    let control = FakeControl::new();
    let registry = prometheus::Registry::new();
    let handle = Engine::start(config, factory(control.clone()), &registry).expect("engine starts");
    let until = Instant::now() + Duration::from_secs(10);
    while handle.max_model_len().is_none() {
        assert!(Instant::now() < until, "engine did not finish loading");
        std::thread::sleep(Duration::from_millis(1));
    }
    Started {
        handle,
        control,
        registry,
    }
}

/// A prompt of `len` tokens starting with `tag + 1` (so a test can tell
/// requests apart in the executor's log; tags below 60) and avoiding EOS.
pub fn prompt(tag: u32, len: usize) -> Vec<u32> {
    assert!(tag < 60);
    (0..len as u32)
        .map(|i| {
            if i == 0 {
                tag + 1
            } else {
                1 + (tag * 7 + i * 13) % (VOCAB as u32 - 1)
            }
        })
        .collect()
}

/// The slot of the request whose prompt starts with `tag + 1`, from the
/// first row that starts it.
pub fn slot_of(steps: &[Vec<engine_testkit::RowRecord>], tag: u32) -> Option<engine::SlotId> {
    steps
        .iter()
        .flatten()
        .find(|r| r.start == 0 && r.tokens[0] == tag + 1)
        .map(|r| r.slot)
}

/// The value of a sample line `name` or `name{labels}` in Prometheus text.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in metrics:\n{text}"))
        .trim()
        .parse()
        .expect("a number")
}

pub fn metrics_text(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}

/// No contract breach seen by the fake, and every slot and page released.
pub fn assert_clean(s: &Started) {
    assert!(
        s.control.violations().is_empty(),
        "{:?}",
        s.control.violations()
    );
    wait_released(&s.handle);
}

/// Sampled (temperature 1, fixed seed), EOS ignored, exactly `max_tokens` tokens.
pub fn request(prompt: Vec<u32>, max_tokens: usize, seed: u64) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        },
        stop: StopParams {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: true,
        },
        snapshot_points: Vec::new(),
        constraint: None,
    }
}

pub fn finished_length(event: &Event, prompt_tokens: usize, completion_tokens: usize) {
    match event {
        Event::Finished { reason, usage } => {
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!(usage.prompt_tokens, prompt_tokens);
            assert_eq!(usage.completion_tokens, completion_tokens);
        }
        other => panic!("expected Finished(Length), got {other:?}"),
    }
}

/// Polls until nothing is running, waiting or held; returns the last stats.
pub fn wait_released(handle: &EngineHandle) -> EngineStats {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = handle.stats();
        if (
            stats.running,
            stats.waiting,
            stats.slots_used,
            stats.pages_used,
        ) == (0, 0, 0, 0)
        {
            return stats;
        }
        assert!(Instant::now() < until, "resources not released: {stats:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The fake model run alone, outside the engine.
pub fn reference_tokens(request: &GenerateRequest, eos: &[u32]) -> Vec<u32> {
    engine_testkit::lone_run(request, eos, VOCAB)
}

/// [`start`] with a fake that has a pool of `num_snapshots` snapshots
/// (and takes any number inside a row).
pub fn start_with_snapshots(
    config: EngineConfig,
    geometry: CacheGeometry,
    num_snapshots: usize,
) -> Started {
    start_with_row_snapshots(config, geometry, num_snapshots, usize::MAX)
}

/// [`start_with_snapshots`] with a fake taking at most `row_snapshots`
/// snapshots inside a row (0: an executor without the in-step snapshot).
pub fn start_with_row_snapshots(
    config: EngineConfig,
    geometry: CacheGeometry,
    num_snapshots: usize,
    row_snapshots: usize,
) -> Started {
    start_fake(config, |control| {
        FakeExecutor::factory_with_row_snapshots(geometry, num_snapshots, row_snapshots, control)
    })
}
