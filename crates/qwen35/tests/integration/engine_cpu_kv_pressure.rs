//! The admission policies under KV pressure on the CPU executor with a
//! committed fixture: a scaled-down CPU demo shape (twelve requests of a
//! four-page prompt and two pages of output, eight running at most, a pool
//! of eighteen pages of 16 that holds about three of them; a lone request
//! always fits). Under the default policy and under the watermark every
//! request completes with its greedy tokens, those of the same requests on
//! a roomy pool and of the CPU reference forward alone; the preemptions and
//! recomputed tokens of `EngineStats` are asserted and agree with the rows
//! the executor ran.
//!
//! The executor is wrapped to count the rows it runs and to hold the first
//! step until every request is queued, so that the scheduling, and with it
//! the preemption count, is the same on every run.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use engine::{
    AdmissionPolicy, ArenaGeometry, CacheGeometry, Engine, EngineConfig, EngineHandle, EngineStats,
    Event, ExecError, Executor, FinishReason, GenerateRequest, MemoryOp, SampledToken,
    SamplingParams, StateGeometry, StepRow, StopParams,
};
use engine_testkit::collect;
use qwen35::engine_exec::{CpuExecutor, CpuSizing};
use qwen35::{CpuModel, Weights};
use qwen35_testkit::drive::cpu_greedy;
use qwen35_testkit::{Fixture, MODELS};

const PAGE: usize = 16;
const REQUESTS: usize = 12;
const PROMPT: usize = 60;
const OUTPUT: usize = 32;
const MAX_NUM_SEQS: usize = 8;
const BUDGET: usize = 512;
const MAX_MODEL_LEN: usize = 128;
const PRESSED_PAGES: usize = 18;
/// Every request's whole length at once, and then some.
const ROOMY_PAGES: usize = REQUESTS * (PROMPT + OUTPUT).div_ceil(PAGE) + 8;
/// Serving the requests one after another: a prefill step and OUTPUT - 1
/// decodes each. A run that takes more steps is thrashing.
const SERIAL_STEPS: u64 = (REQUESTS * OUTPUT) as u64;
/// The executor fails (fatally, ending every request) any step past this
/// many: a livelock ends the test instead of hanging it.
const MAX_STEPS: u64 = 4 * SERIAL_STEPS;

/// What the wrapped executor saw, and its gate.
#[derive(Default)]
struct Seen {
    /// A step reached the gate.
    entered: bool,
    /// Steps run freely.
    open: bool,
    /// Steps run.
    steps: u64,
    /// Tokens of every row run.
    computed: usize,
    /// Rows starting a sequence from position 0 (admissions).
    starts: usize,
}

#[derive(Default)]
struct Gate {
    seen: Mutex<Seen>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_entered(&self, timeout: Duration) -> bool {
        let seen = self.lock();
        let (seen, _) = self
            .changed
            .wait_timeout_while(seen, timeout, |s| !s.entered)
            .unwrap();
        seen.entered
    }

    fn open(&self) {
        self.lock().open = true;
        self.changed.notify_all();
    }
}

/// The CPU executor behind the gate: counts each step's rows, and the
/// first step waits until the gate opens. Past [`MAX_STEPS`] it fails.
struct Gated {
    inner: CpuExecutor,
    gate: Arc<Gate>,
}

impl Executor for Gated {
    fn geometry(&self) -> CacheGeometry {
        self.inner.geometry()
    }

    fn state_geometry(&self) -> StateGeometry {
        self.inner.state_geometry()
    }

    fn arena_geometry(&self) -> Option<ArenaGeometry> {
        self.inner.arena_geometry()
    }

    fn memory(&mut self, op: MemoryOp) -> Result<(), ExecError> {
        self.inner.memory(op)
    }

    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError> {
        let mut seen = self.gate.lock();
        seen.entered = true;
        self.gate.changed.notify_all();
        while !seen.open {
            seen = self.gate.changed.wait(seen).unwrap();
        }
        seen.steps += 1;
        if seen.steps > MAX_STEPS {
            return Err(ExecError::Fatal(format!("livelock: step {}", seen.steps)));
        }
        seen.computed += rows.iter().map(|r| r.tokens.len()).sum::<usize>();
        seen.starts += rows.iter().filter(|r| r.start == 0).count();
        drop(seen);
        self.inner.step(rows)
    }
}

fn greedy(prompt: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: StopParams {
            max_tokens: OUTPUT,
            min_tokens: 0,
            stop_token_ids: vec![],
            ignore_eos: true,
        },
        snapshot_points: Vec::new(),
        constraint: None,
    }
}

/// Twelve prompts of PROMPT tokens: windows of the fixture's 128-token
/// prompt at different offsets.
fn requests(f: &Fixture) -> Vec<GenerateRequest> {
    let long = f
        .prompts
        .iter()
        .find(|p| p.len() == 128)
        .expect("a 128-token fixture prompt");
    (0..REQUESTS)
        .map(|i| greedy(long[5 * i..5 * i + PROMPT].to_vec()))
        .collect()
}

struct Run {
    outputs: Vec<Vec<u32>>,
    stats: EngineStats,
    computed: usize,
    starts: usize,
}

/// An engine on the gated CPU executor, its pages and slots in an arena
/// or not.
fn start_with(
    f: &Fixture,
    policy: AdmissionPolicy,
    num_pages: usize,
    gate: Arc<Gate>,
    arena: bool,
) -> EngineHandle {
    let mut config = EngineConfig::new(vec![]);
    config.max_num_batched_tokens = BUDGET;
    config.max_num_seqs = MAX_NUM_SEQS;
    config.admission = policy;
    let sizing = CpuSizing {
        num_slots: MAX_NUM_SEQS,
        num_pages,
        page_size: PAGE,
        max_model_len: MAX_MODEL_LEN,
    };
    let (c, w) = (f.config.clone(), Weights::open(&f.dir).unwrap());
    let handle = Engine::start(
        config,
        move || {
            let model = CpuModel::load(c, &w).map_err(|e| e.to_string())?;
            let mut inner = CpuExecutor::new(model, sizing).map_err(|e| e.to_string())?;
            if arena {
                inner = inner.with_arena();
            }
            Ok(Box::new(Gated { inner, gate }) as Box<dyn Executor>)
        },
        &prometheus::Registry::new(),
    )
    .expect("engine starts");
    let until = Instant::now() + Duration::from_secs(60);
    while handle.max_model_len().is_none() {
        assert!(Instant::now() < until, "the engine did not finish loading");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle
}

fn released(handle: &EngineHandle) -> EngineStats {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = handle.stats();
        if (s.running, s.waiting, s.slots_used, s.pages_used) == (0, 0, 0, 0) {
            return s;
        }
        assert!(Instant::now() < until, "not released: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `reqs` on a pool of `num_pages`; the first request's step waits
/// until the others are queued.
async fn run(
    f: &Fixture,
    policy: AdmissionPolicy,
    num_pages: usize,
    reqs: &[GenerateRequest],
) -> Run {
    run_with(f, policy, num_pages, reqs, false).await
}

async fn run_with(
    f: &Fixture,
    policy: AdmissionPolicy,
    num_pages: usize,
    reqs: &[GenerateRequest],
    arena: bool,
) -> Run {
    let gate = Arc::new(Gate::default());
    let handle = start_with(f, policy, num_pages, gate.clone(), arena);
    let mut streams = vec![handle.submit(reqs[0].clone()).expect("accepted")];
    assert!(gate.wait_entered(Duration::from_secs(30)), "no first step");
    streams.extend(
        reqs[1..]
            .iter()
            .map(|r| handle.submit(r.clone()).expect("accepted")),
    );
    gate.open();
    let mut outputs = Vec::new();
    for stream in streams {
        let (tokens, end) = collect(stream).await;
        match end {
            Event::Finished {
                reason: FinishReason::Length,
                usage,
            } => {
                assert_eq!(usage.prompt_tokens, PROMPT);
                assert_eq!(usage.completion_tokens, OUTPUT);
            }
            other => panic!(
                "{}: expected Finished(Length), got {other:?}",
                policy.name()
            ),
        }
        outputs.push(tokens);
    }
    let stats = released(&handle);
    handle.shutdown(Duration::from_secs(5)).await;
    let seen = gate.lock();
    Run {
        outputs,
        stats,
        computed: seen.computed,
        starts: seen.starts,
    }
}

/// Runs `policy` on the pressed and on a roomy pool and checks what every
/// pressed run must show: the roomy pool's tokens and the reference's, a
/// step count below running the requests one after another, and counts
/// of preemptions and recomputed tokens that agree with the rows run.
async fn pressed_run(f: &Fixture, policy: AdmissionPolicy) -> EngineStats {
    let name = policy.name();
    let reqs = requests(f);
    let pressed = run(f, policy, PRESSED_PAGES, &reqs).await;
    let roomy = run(f, policy, ROOMY_PAGES, &reqs).await;
    let stats = pressed.stats;
    println!("{name}: {stats:?}");
    assert_eq!(stats.pages_total, PRESSED_PAGES);
    assert_eq!(
        (roomy.stats.preemptions, roomy.stats.recomputed_tokens),
        (0, 0),
        "{name}: roomy pool"
    );
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(
            pressed.outputs[i], roomy.outputs[i],
            "{name}: request {i} differs from the roomy pool"
        );
        assert_eq!(
            pressed.outputs[i],
            cpu_greedy(&model, &r.prompt, OUTPUT),
            "{name}: request {i} differs from the reference alone"
        );
    }
    // No livelock: fewer steps than serving the requests one at a time.
    assert!(stats.steps < SERIAL_STEPS, "{name}: {stats:?}");
    // Each admission starts at position 0 (no prefix cache): the starts
    // beyond one per request are readmissions after preemptions.
    assert_eq!(
        (pressed.starts - REQUESTS) as u64,
        stats.preemptions,
        "{name}"
    );
    // Every position computed once (prompt and all but the last output
    // token), plus what readmissions computed again.
    let once = REQUESTS * (PROMPT + OUTPUT - 1);
    assert_eq!(
        pressed.computed as u64,
        once as u64 + stats.recomputed_tokens,
        "{name}: {stats:?}"
    );
    assert_eq!(roomy.computed, once, "{name}: roomy pool");
    assert!(stats.recomputed_tokens >= stats.preemptions, "{name}");
    assert!(
        stats.recomputed_tokens <= stats.preemptions * (PROMPT + OUTPUT - 1) as u64,
        "{name}: {stats:?}"
    );
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_kv_pressure_watermark_preempts_and_keeps_greedy_tokens() {
    let f = Fixture::load(MODELS[0]);
    let stats = pressed_run(&f, AdmissionPolicy::Watermark).await;
    // Admitted on their prompt alone, the requests outgrow the pool while
    // they decode: the latest admitted are preempted and recomputed.
    assert!(stats.preemptions > 0, "{stats:?}");
    assert!(stats.recomputed_tokens > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_kv_pressure_default_policy_keeps_greedy_tokens() {
    let f = Fixture::load(MODELS[0]);
    let policy = AdmissionPolicy::default();
    assert_eq!(policy, AdmissionPolicy::NewTokenRatio);
    let stats = pressed_run(&f, policy).await;
    // Admission counts the outputs to come: a preemption or two at most.
    assert!(stats.preemptions <= 2, "{stats:?}");
    assert!(
        stats.recomputed_tokens <= 2 * (PROMPT + OUTPUT - 1) as u64,
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_kv_pressure_arena_keeps_greedy_tokens() {
    // The pressed pool's pages and the slots' states in one arena: the
    // requests end with the reference's tokens, on slots mapped as they run.
    let f = Fixture::load(MODELS[0]);
    let reqs = requests(&f);
    let pressed = run_with(&f, AdmissionPolicy::default(), PRESSED_PAGES, &reqs, true).await;
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(
            pressed.outputs[i],
            cpu_greedy(&model, &r.prompt, OUTPUT),
            "arena: request {i} differs from the reference alone"
        );
    }
    let stats = pressed.stats;
    assert!(stats.steps < SERIAL_STEPS, "{stats:?}");
    // The arena's page ids cover the pool as if it held no slot.
    assert!(stats.pages_total > PRESSED_PAGES, "{stats:?}");
    assert_eq!(stats.slots_total, MAX_NUM_SEQS);
}
