//! The prefix cache on the CPU executor with the committed fixtures: with
//! the cache on, greedy outputs equal those of the same engine with the
//! cache off, token for token, and the CPU reference forward's own greedy
//! loop on each request alone; `cached_tokens` is asserted in each case.
//! Every case runs the cache both ways: snapshots at chunk boundaries and
//! inside the step (`PrefixCacheConfig::in_step_snapshots`).
//! A last test shows that a wrong restore changes what the model computes
//! (so the equality checks can fail).

use std::time::{Duration, Instant};

use engine::prefix_cache::PrefixCacheConfig;
use engine::{
    AdmissionPolicy, Engine, EngineConfig, EngineHandle, Event, Executor, GenerateRequest, PageId,
    SampleSeed, SampleSpec, SamplingParams, SlotId, SnapshotId, StepRow, StopParams, Usage,
};
use qwen35::engine_exec::{CpuExecutor, CpuSizing};
use qwen35::{CpuModel, Weights};
use qwen35_testkit::drive::cpu_greedy;
use qwen35_testkit::{Fixture, MODELS};

const PAGE: usize = 16;

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: StopParams {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![],
            ignore_eos: true,
        },
        snapshot_points: Vec::new(),
        constraint: None,
    }
}

/// An engine on the fixture's CPU executor; `cache`: the prefix cache with
/// this snapshot budget and marker, snapshots inside the step or not.
fn start(
    f: &Fixture,
    sizing: CpuSizing,
    cache: Option<(usize, Vec<u32>, bool)>,
) -> (EngineHandle, prometheus::Registry) {
    let mut config = EngineConfig::new(vec![]);
    // The tests here preempt on purpose: the watermark admits the most.
    config.admission = AdmissionPolicy::Watermark;
    config.max_num_batched_tokens = 64;
    config.max_num_seqs = sizing.num_slots;
    let pool = cache.as_ref().map_or(0, |(n, _, _)| *n);
    if let Some((max_snapshots, marker, in_step)) = cache {
        config.prefix_cache = PrefixCacheConfig {
            enabled: true,
            max_snapshots,
            snapshot_after: vec![marker],
            snapshot_interval: 0,
            snapshot_before_last_token: true,
            in_step_snapshots: in_step,
        };
    }
    let (c, w) = (f.config.clone(), Weights::open(&f.dir).unwrap());
    let registry = prometheus::Registry::new();
    let handle = Engine::start(
        config,
        move || {
            let model = CpuModel::load(c, &w).map_err(|e| e.to_string())?;
            let exec = CpuExecutor::new(model, sizing).map_err(|e| e.to_string())?;
            Ok(Box::new(exec.with_snapshot_pool(pool)) as Box<dyn Executor>)
        },
        &registry,
    )
    .expect("engine starts");
    let until = Instant::now() + Duration::from_secs(60);
    while handle.max_model_len().is_none() {
        assert!(Instant::now() < until, "the engine did not finish loading");
        std::thread::sleep(Duration::from_millis(5));
    }
    (handle, registry)
}

/// Runs `waves` one after the other (each wave's requests concurrently).
async fn run(handle: &EngineHandle, waves: &[Vec<GenerateRequest>]) -> Vec<(Vec<u32>, Usage)> {
    let mut all = vec![];
    for wave in waves {
        let streams: Vec<_> = wave
            .iter()
            .map(|r| handle.submit(r.clone()).expect("accepted"))
            .collect();
        for mut s in streams {
            let mut toks = vec![];
            loop {
                match s.next().await.expect("a terminal event") {
                    Event::Token(t) => toks.push(t.token),
                    Event::Finished { usage, .. } => {
                        all.push((toks, usage));
                        break;
                    }
                    Event::Failed(m) => panic!("request failed: {m}"),
                }
            }
        }
    }
    all
}

/// Cache on and off give the same tokens, equal to the reference; the
/// cache-on runs' `cached_tokens` are `expected`. The cache runs twice:
/// snapshots at chunk boundaries, then inside the step (the default).
/// Returns the in-step run's stats.
async fn on_equals_off(
    f: &Fixture,
    sizing: CpuSizing,
    snapshots: usize,
    marker: Vec<u32>,
    waves: Vec<Vec<GenerateRequest>>,
    expected: &[usize],
) -> engine::EngineStats {
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    let (off, _) = start(f, sizing, None);
    let without = run(&off, &waves).await;
    off.shutdown(Duration::from_secs(5)).await;
    let mut stats = None;
    for in_step in [false, true] {
        let (on, _) = start(f, sizing, Some((snapshots, marker.clone(), in_step)));
        let with = run(&on, &waves).await;
        let reqs: Vec<&GenerateRequest> = waves.iter().flatten().collect();
        for (i, ((r, a), b)) in reqs.iter().zip(&with).zip(&without).enumerate() {
            let way = if in_step { "in-step" } else { "chunked" };
            assert_eq!(a.0, b.0, "request {i}: cache on ({way}) and off differ");
            assert_eq!(
                a.0,
                cpu_greedy(&model, &r.prompt, r.stop.max_tokens),
                "request {i}"
            );
            assert_eq!(b.1.cached_tokens, 0);
            assert_eq!(
                a.1.cached_tokens, expected[i],
                "request {i}: cached_tokens ({way})"
            );
        }
        stats = Some(on.stats());
        on.shutdown(Duration::from_secs(5)).await;
    }
    stats.expect("two runs")
}

fn sizing(num_slots: usize, num_pages: usize) -> CpuSizing {
    CpuSizing {
        num_slots,
        num_pages,
        page_size: PAGE,
        max_model_len: 512,
    }
}

/// A system prompt ending in a 2-token marker, and questions from
/// elsewhere in the long fixture prompt.
fn parts(f: &Fixture) -> (Vec<u32>, Vec<u32>, Vec<Vec<u32>>) {
    let long = f.prompts.iter().max_by_key(|p| p.len()).unwrap();
    let system = long[..70].to_vec();
    let marker = system[68..].to_vec();
    let questions = (0..8)
        .map(|i| {
            let at = 75 + (9 * i) % 40;
            long[at..at + 5 + i].to_vec()
        })
        .collect();
    (system, marker, questions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_repeat_and_shared_system_prompt() {
    for name in MODELS {
        let f = Fixture::load(name);
        let (system, marker, questions) = parts(&f);
        let with_q = |q: &Vec<u32>| [&system[..], q].concat();
        // Long enough after the marker for its own last-but-one point.
        let repeat = with_q(&[&questions[0][..], &questions[1], &questions[2]].concat());
        let waves = vec![
            vec![greedy(repeat.clone(), 8)],
            vec![greedy(repeat.clone(), 8)],
            vec![greedy(with_q(&questions[1]), 8)],
            vec![greedy(with_q(&questions[2]), 8)],
        ];
        let expected = [0, repeat.len() - 1, system.len(), system.len()];
        on_equals_off(&f, sizing(4, 128), 16, marker, waves, &expected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_turn_resumes_after_the_previous_generation() {
    let f = Fixture::load(MODELS[0]);
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    let (system, marker, questions) = parts(&f);
    // Turn 2 re-sends turn 1 and its (reference) answer, then a question.
    let turn1 = [&system[..], &questions[0], &marker].concat();
    let answer = cpu_greedy(&model, &turn1, 6);
    let turn2 = [&turn1[..], &answer, &questions[1], &marker].concat();
    let waves = vec![vec![greedy(turn1.clone(), 6)], vec![greedy(turn2, 6)]];
    let expected = [0, turn1.len() + answer.len() - 1];
    on_equals_off(&f, sizing(2, 128), 16, marker, waves, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_sharers() {
    let f = Fixture::load(MODELS[1]);
    let (system, marker, questions) = parts(&f);
    // The seed's own suffix is shared by no sharer.
    let seed = greedy([&system[..], &system[..3]].concat(), 2);
    let sharers: Vec<_> = questions
        .iter()
        .map(|q| greedy([&system[..], q].concat(), 6))
        .collect();
    let mut expected = vec![0];
    expected.extend([system.len(); 8]);
    let stats = on_equals_off(
        &f,
        sizing(8, 256),
        32,
        marker,
        vec![vec![seed], sharers],
        &expected,
    )
    .await;
    assert!(stats.prefix_cache.unwrap().snapshot_hits >= 8);
}

/// Raw completions prompts sharing the system prompt (no marker): the
/// questions start with distinct tokens, so the shared prefix is exactly
/// the system prompt and the branch point lies there (70 tokens: not a
/// page boundary, so every hit also copies the partial page).
fn raw_sharers(f: &Fixture, n: usize, max_tokens: usize) -> (usize, Vec<GenerateRequest>) {
    let (system, _, questions) = parts(f);
    let firsts: std::collections::HashSet<u32> = questions[..n].iter().map(|q| q[0]).collect();
    assert_eq!(firsts.len(), n, "questions must start with distinct tokens");
    let requests = questions[..n]
        .iter()
        .map(|q| greedy([&system[..], q].concat(), max_tokens))
        .collect();
    (system.len(), requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_system_prompt_without_marker_sequential() {
    // The first request publishes only its own points; the second stops at
    // the end of the shared system prompt (a branch point) and snapshots
    // there; the others resume there.
    let f = Fixture::load(MODELS[0]);
    let (shared, requests) = raw_sharers(&f, 5, 6);
    let waves: Vec<_> = requests.into_iter().map(|r| vec![r]).collect();
    let expected = [0, 0, shared, shared, shared];
    let stats = on_equals_off(&f, sizing(4, 128), 16, vec![], waves, &expected).await;
    assert_eq!(stats.prefix_cache.unwrap().branch_points, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_system_prompt_without_marker_eight_together() {
    // Eight sharers queued at once on a cold cache: the first admitted
    // stops at the shared prefix's end, the others wait for its snapshot
    // (no duplicate) and resume there. An unrelated request submitted just
    // before takes each step's whole budget (64) for its 5-step prefill, so
    // the sharers are all queued when the first of them is admitted.
    let f = Fixture::load(MODELS[1]);
    let (shared, requests) = raw_sharers(&f, 8, 5);
    let long = f.prompts.iter().max_by_key(|p| p.len()).unwrap();
    let blocker: Vec<u32> = long.iter().rev().cycle().take(320).copied().collect();
    assert_ne!(blocker[0], requests[0].prompt[0]);
    let wave = [vec![greedy(blocker, 2)], requests].concat();
    let mut expected = vec![shared; 9];
    expected[..2].fill(0);
    let stats = on_equals_off(&f, sizing(9, 256), 32, vec![], vec![wave], &expected).await;
    let cache = stats.prefix_cache.unwrap();
    assert_eq!(cache.branch_points, 1, "{cache:?}");
    assert_eq!(cache.snapshot_hits, 7, "{cache:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_budget_evicts_and_preempted_sharers_resume() {
    let f = Fixture::load(MODELS[2]);
    let (system, marker, questions) = parts(&f);
    // 3 snapshots (the seed alone takes three: at the marker, before its
    // last prompt token, at the end of its generation) and 14 pages of 16
    // (224 positions) for 4 sharers growing to ~120 positions each (the
    // 64 positions of the system prompt's full pages shared): the
    // cache gives up snapshots and pages, the latest sharers are preempted
    // and come back through the cache. The marker's snapshot saves the
    // most prefill (every other snapshot saves only the tokens past it),
    // so it is kept while others go.
    let seed = greedy([&system[..], &system[..3]].concat(), 2);
    let sharers: Vec<_> = questions[..4]
        .iter()
        .map(|q| greedy([&system[..], q].concat(), 40))
        .collect();
    let expected = [0, system.len(), system.len(), system.len(), system.len()];
    let stats = on_equals_off(
        &f,
        sizing(4, 14),
        3,
        marker,
        vec![vec![seed], sharers],
        &expected,
    )
    .await;
    let cache = stats.prefix_cache.unwrap();
    assert!(stats.preemptions > 0, "{stats:?}");
    assert!(
        cache.snapshot_evictions > 0 && cache.snapshots <= 3,
        "{cache:?}"
    );
}

/// Restoring another sequence's snapshot changes the logits (so a wrong
/// restore cannot pass the equality tests above unnoticed); restoring the
/// right one gives exactly the uncached logits.
#[test]
fn a_wrong_restore_changes_the_logits() {
    let f = Fixture::load(MODELS[0]);
    let (system, _, questions) = parts(&f);
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    let mut exec = CpuExecutor::new(model, sizing(3, 64))
        .unwrap()
        .with_snapshot_pool(2);
    let params = SamplingParams {
        temperature: 0.0,
        logprobs: Some(5),
        ..Default::default()
    };
    let pages: Vec<PageId> = (0..8).map(PageId).collect();
    let a = [&system[..], &questions[0]].concat();
    let b = [&questions[1][..], &system[..]].concat();
    let step =
        |exec: &mut CpuExecutor, slot: u32, start: usize, tokens: &[u32], history: &[u32]| {
            let spec = SampleSpec {
                params: &params,
                history,
                prompt_len: history.len(),
                seed: SampleSeed { seed: 0, draw: 0 },
                banned: &[],
                allowed: None,
            };
            exec.step(&[StepRow {
                snapshots: &[],
                slot: SlotId(slot),
                start,
                tokens,
                pages: &pages,
                sample: Some(spec),
            }])
            .unwrap()
            .pop()
            .unwrap()
        };
    let n = a.len().min(b.len()) - 1;
    step(&mut exec, 0, 0, &a[..n], &a[..n]);
    exec.snapshot(SlotId(0), SnapshotId(0)).unwrap();
    step(&mut exec, 1, 0, &b[..n], &b[..n]);
    exec.snapshot(SlotId(1), SnapshotId(1)).unwrap();
    let uncached = step(&mut exec, 2, 0, &a[..n + 1], &a[..n + 1]);
    exec.restore(SnapshotId(0), SlotId(2)).unwrap();
    let right = step(&mut exec, 2, n, &a[n..n + 1], &a[..n + 1]);
    assert_eq!(right, uncached);
    exec.restore(SnapshotId(1), SlotId(2)).unwrap();
    let wrong = step(&mut exec, 2, n, &a[n..n + 1], &a[..n + 1]);
    assert_ne!(wrong.top_logprobs, uncached.top_logprobs);
}
