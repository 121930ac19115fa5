//! The GPU executor's prefix-cache seam (skipped without a GPU;
//! `GDN_REQUIRE_GPU=1` makes a missing GPU a failure), on the tiny fixtures:
//! - a sequence resumed from a snapshot (state copied from the snapshot
//!   pool into a fresh slot, the full pages before the resume point shared
//!   read-only, the page holding it copied) computes bit for bit what the
//!   same sequence computes in its own slot with the same steps;
//! - two such resumes read the same shared page in one step, and each
//!   equals the other bit for bit;
//! - restoring another sequence's snapshot changes the logits (the check
//!   above can fail), and the snapshot is unchanged by the resumed rows
//!   writing on (a second resume from it is exact again).
//!
//! Then the engine on the GPU executor with the prefix cache on serves
//! repeated and shared-prefix prompts (greedy, a tiny page pool so that
//! requests are preempted and resumed through the cache) with the same
//! tokens as with the cache off, except where the uncached run's top two
//! tokens are a near-tie (|gap| <= 0.05, gpu_engine.rs's rule; bf16 sums
//! depend on how a prompt was chunked), and with hits reported. The same
//! harness runs on the CPU executor (in CI).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Fixture, MODELS};
use cudarc::driver::CudaStream;
use engine::prefix_cache::PrefixCacheConfig;
use engine::{
    Engine, EngineConfig, EngineHandle, Event, Executor, GenerateRequest, PageId, SampleSeed,
    SampleSpec, SampledToken, SamplingParams, SlotId, SnapshotId, StepRow, StopParams,
};
use qwen35::engine_exec::{CpuExecutor, CpuSizing, GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::{GpuModel, GpuOptions};

const PAGE: usize = 16;
const OUT: usize = 24;
const NEAR_TIE: f32 = 0.05;
/// KV pages of the first engine test: 4 requests of up to 5 pages each at
/// once do not fit, even with 2 pages of the system prompt shared (since
/// branch points, wave 2's sharers resume at its end: 14 pages fitted).
const POOL: usize = 12;

fn stream() -> Option<Arc<CudaStream>> {
    gdn_kernels::testing::gpu_stream().map(|s| s.context().new_stream().unwrap())
}

fn executor(
    f: &Fixture,
    s: &Arc<CudaStream>,
    slots: usize,
    pages: usize,
    snaps: usize,
) -> GpuExecutor {
    let model = GpuModel::load(
        f.config.clone(),
        &f.weights,
        s.clone(),
        GpuOptions::default(),
    )
    .unwrap();
    let sizing = GpuSizing {
        num_slots: slots,
        pages: PagePool::Fixed(pages),
        page_size: PAGE,
        max_model_len: 16 * PAGE,
    };
    GpuExecutor::with_snapshot_pool(model, sizing, snaps).unwrap()
}

/// A row: (slot, start, tokens, pages, sampling history).
type RowSpec<'a> = (u32, usize, &'a [u32], &'a [PageId], &'a [u32]);

/// One step whose rows sample greedily with the top 5 logprobs.
fn step(exec: &mut GpuExecutor, rows: &[RowSpec<'_>]) -> Vec<SampledToken> {
    let params = SamplingParams {
        temperature: 0.0,
        logprobs: Some(5),
        ..Default::default()
    };
    let rows: Vec<StepRow> = rows
        .iter()
        .map(|&(slot, start, tokens, pages, history)| StepRow {
            slot: SlotId(slot),
            start,
            tokens,
            pages,
            sample: Some(SampleSpec {
                params: &params,
                history,
                prompt_len: history.len(),
                seed: SampleSeed { seed: 0, draw: 0 },
                banned: &[],
            }),
        })
        .collect();
    exec.step(&rows).unwrap()
}

#[test]
fn a_resumed_sequence_computes_what_it_computes_in_its_own_slot() {
    let Some(s) = stream() else { return };
    for name in MODELS {
        let f = Fixture::load(name);
        let mut exec = executor(&f, &s, 6, 64, 2);
        let long = f.prompts.iter().max_by_key(|p| p.len()).unwrap();
        // 37 tokens: two full pages and 5 positions of a third.
        let (a, b): (Vec<u32>, Vec<u32>) = (long[..38].to_vec(), long[50..88].to_vec());
        let n = 37;
        let pa: Vec<PageId> = (0..3).map(PageId).collect();
        let pb: Vec<PageId> = (3..6).map(PageId).collect();
        // A and B prefill n tokens in their own slots; snapshots taken.
        step(&mut exec, &[(0, 0, &a[..n], &pa, &a[..n])]);
        exec.snapshot(SlotId(0), SnapshotId(0)).unwrap();
        step(&mut exec, &[(1, 0, &b[..n], &pb, &b[..n])]);
        exec.snapshot(SlotId(1), SnapshotId(1)).unwrap();
        // A's next token in its own slot: the uncached reference.
        let own = step(&mut exec, &[(0, n, &a[n..], &pa, &a)]).pop().unwrap();
        // Two resumes of A in one step: slots 2 and 3 from snapshot 0,
        // pages 0 and 1 shared, page 2 (holding position n) copied.
        exec.restore(SnapshotId(0), SlotId(2)).unwrap();
        exec.restore(SnapshotId(0), SlotId(3)).unwrap();
        exec.copy_page(PageId(2), PageId(10)).unwrap();
        exec.copy_page(PageId(2), PageId(11)).unwrap();
        let r2 = [PageId(0), PageId(1), PageId(10)];
        let r3 = [PageId(0), PageId(1), PageId(11)];
        let both = step(
            &mut exec,
            &[(2, n, &a[n..], &r2, &a), (3, n, &a[n..], &r3, &a)],
        );
        assert_eq!(both[0], both[1], "{name}: two resumes in one step differ");
        // Alone, a resume equals the sequence's own slot bit for bit.
        exec.restore(SnapshotId(0), SlotId(4)).unwrap();
        exec.copy_page(PageId(2), PageId(12)).unwrap();
        let r4 = [PageId(0), PageId(1), PageId(12)];
        let resumed = step(&mut exec, &[(4, n, &a[n..], &r4, &a)]).pop().unwrap();
        assert_eq!(
            resumed, own,
            "{name}: the resumed sequence differs from its own slot"
        );
        // B's state over A's pages: different logits.
        exec.restore(SnapshotId(1), SlotId(5)).unwrap();
        exec.copy_page(PageId(2), PageId(13)).unwrap();
        let r5 = [PageId(0), PageId(1), PageId(13)];
        let wrong = step(&mut exec, &[(5, n, &a[n..], &r5, &a)]).pop().unwrap();
        assert_ne!(
            wrong.top_logprobs, own.top_logprobs,
            "{name}: a wrong restore went unseen"
        );
        // The snapshot did not move while the resumes wrote on.
        exec.restore(SnapshotId(0), SlotId(5)).unwrap();
        exec.copy_page(PageId(2), PageId(14)).unwrap();
        let r6 = [PageId(0), PageId(1), PageId(14)];
        let again = step(&mut exec, &[(5, n, &a[n..], &r6, &a)]).pop().unwrap();
        assert_eq!(again, own, "{name}: the snapshot changed");
        println!("{name}: resumed = own slot, bit for bit");
    }
}

#[derive(Clone, Copy, Debug)]
enum Device {
    Gpu,
    Cpu,
}

/// The engine on `device` with `pages` KV pages and `snapshots` snapshots.
fn start(
    name: &'static str,
    cache: bool,
    device: Device,
    pages: usize,
    snapshots: usize,
) -> EngineHandle {
    let mut config = EngineConfig::new(vec![]);
    config.max_num_batched_tokens = 32;
    config.max_num_seqs = 4;
    config.prefix_cache = PrefixCacheConfig {
        enabled: cache,
        ..PrefixCacheConfig::default()
    };
    let handle = Engine::start(
        config,
        move || {
            let f = Fixture::load(name);
            if let Device::Cpu = device {
                let sizing = CpuSizing {
                    num_slots: 4,
                    num_pages: pages,
                    page_size: PAGE,
                    max_model_len: 16 * PAGE,
                };
                let exec = CpuExecutor::load(&f.dir, sizing).map_err(|e| e.to_string())?;
                return Ok(Box::new(exec.with_snapshot_pool(snapshots)) as Box<dyn Executor>);
            }
            let s = GpuModel::default_stream().map_err(|e| e.to_string())?;
            let mut exec = executor(&f, &s, 4, pages, snapshots);
            exec.capture_decode_graphs(4).map_err(|e| e.to_string())?;
            Ok(Box::new(exec) as Box<dyn Executor>)
        },
        &prometheus::Registry::new(),
    )
    .expect("engine starts");
    let until = Instant::now() + Duration::from_secs(120);
    while handle.max_model_len().is_none() {
        assert!(Instant::now() < until, "not loaded: {:?}", handle.state());
        std::thread::sleep(Duration::from_millis(10));
    }
    handle
}

/// Greedy tokens (and top-2 gaps of the uncached run, for near-ties) and
/// cached tokens of `prompts`, in two waves.
async fn serve(handle: &EngineHandle, waves: &[Vec<Vec<u32>>]) -> Vec<(Vec<u32>, Vec<f32>, usize)> {
    let mut all = vec![];
    for wave in waves {
        let streams: Vec<_> = wave
            .iter()
            .map(|p| {
                let req = GenerateRequest {
                    prompt: p.clone(),
                    sampling: SamplingParams {
                        temperature: 0.0,
                        logprobs: Some(2),
                        ..Default::default()
                    },
                    stop: StopParams {
                        max_tokens: OUT,
                        min_tokens: 0,
                        stop_token_ids: vec![],
                        ignore_eos: true,
                    },
                    snapshot_points: Vec::new(),
                };
                handle.submit(req).expect("accepted")
            })
            .collect();
        for mut s in streams {
            let (mut toks, mut gaps) = (vec![], vec![]);
            loop {
                match s.next().await.expect("a terminal event") {
                    Event::Token(t) => {
                        toks.push(t.token);
                        let lp = &t.top_logprobs;
                        gaps.push(if lp.len() >= 2 {
                            lp[0].1 - lp[1].1
                        } else {
                            f32::INFINITY
                        });
                    }
                    Event::Finished { usage, .. } => {
                        all.push((toks, gaps, usage.cached_tokens));
                        break;
                    }
                    Event::Failed(m) => panic!("request failed: {m}"),
                }
            }
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_with_the_cache_serves_the_tokens_of_the_engine_without() {
    if stream().is_some() {
        cache_on_equals_off(Device::Gpu).await;
    }
}

/// The same harness on the CPU executor (f32: no near-ties expected), so
/// that its logic runs in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_on_the_cpu_executor() {
    cache_on_equals_off(Device::Cpu).await;
}

async fn cache_on_equals_off(device: Device) {
    for name in MODELS {
        let f = Fixture::load(name);
        let long = f.prompts.iter().max_by_key(|p| p.len()).unwrap().clone();
        let system = &long[..40];
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| [system, &long[60 + 9 * i..66 + 9 * i]].concat())
            .collect();
        // Wave 1 fills the cache; wave 2 repeats wave 1 exactly first (hits
        // before the last prompt token, admitted before the pool runs
        // short), then brings four more prompts of the same system part.
        let mut second = prompts[..2].to_vec();
        second.extend(prompts[2..].iter().cloned());
        second.extend((0..2).map(|i| [system, &long[100 + 5 * i..104 + 5 * i]].concat()));
        let waves = vec![prompts[..2].to_vec(), second];
        let off = start(name, false, device, POOL, 8);
        let without = serve(&off, &waves).await;
        off.shutdown(Duration::from_secs(5)).await;
        let on = start(name, true, device, POOL, 8);
        let with = serve(&on, &waves).await;
        let stats = on.stats();
        on.shutdown(Duration::from_secs(5)).await;
        let (mut compared, mut near_ties, mut hits) = (0, 0, 0);
        for (i, ((a, _, cached), (b, gaps, _))) in with.iter().zip(&without).enumerate() {
            hits += (*cached > 0) as usize;
            let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            compared += same;
            if same < b.len() {
                assert!(
                    gaps[same].abs() <= NEAR_TIE,
                    "{name} request {i}: token {same} differs with the cache on, gap {}",
                    gaps[same]
                );
                near_ties += 1;
            }
        }
        // The repeats of wave 2 must have been served from the cache, and
        // the pool must have been short (preemption).
        assert!(hits >= 2, "{name}: {hits} hits, {stats:?}");
        assert!(stats.preemptions > 0, "{name}: no preemption, {stats:?}");
        if let Device::Cpu = device {
            // The f32 CPU forward runs token by token: exactly equal.
            assert_eq!(near_ties, 0, "{name}: the CPU executor diverged");
        }
        println!("{name}: {compared} tokens compared, {near_ties} near-tie divergences, {hits} hits, {stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_served_from_a_branch_point() {
    if stream().is_some() {
        shared_system_prompt(Device::Gpu).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_on_the_cpu_executor() {
    shared_system_prompt(Device::Cpu).await;
}

/// Two system prompts of 45 tokens (two pages and 13 positions) and
/// questions with distinct first tokens. Waves, in order: a sharer of the
/// first alone (it caches nothing usable for others), a second alone (it
/// stops at 45 and snapshots: a branch point), then an unrelated long
/// prompt with three more sharers (they queue while it prefills, and hit at
/// 45); then, cold, the same with three sharers of the second system
/// prompt queued together: the first stops at 45, the others wait for its
/// snapshot and resume there.
async fn shared_system_prompt(device: Device) {
    for name in MODELS {
        let f = Fixture::load(name);
        let long = f.prompts.iter().max_by_key(|p| p.len()).unwrap().clone();
        // Prompts that start apart (so they share nothing): the two system
        // prompts, two unrelated prompts whose 4-step prefills take each
        // step's budget while the sharers behind them queue.
        let s1 = &long[..45];
        let k = (1..).find(|&k| long[k] != long[0]).unwrap();
        let s2 = &long[k..k + 45];
        let reversed: Vec<u32> = long
            .iter()
            .rev()
            .cycle()
            .take(2 * long.len())
            .copied()
            .collect();
        let mut starts = std::collections::HashSet::from([s1[0], s2[0]]);
        let blockers: Vec<Vec<u32>> = (0..long.len())
            .filter(|&skip| starts.insert(reversed[skip]))
            .map(|skip| reversed[skip..skip + 100].to_vec())
            .take(2)
            .collect();
        // Six-token questions from the prompt's second half, each starting
        // with a token no earlier one starts with.
        let mut firsts = std::collections::HashSet::new();
        let questions: Vec<&[u32]> = (50..long.len() - 6)
            .filter(|&at| firsts.insert(long[at]))
            .map(|at| &long[at..at + 6])
            .take(8)
            .collect();
        assert_eq!(questions.len(), 8, "{name}: not enough distinct questions");
        let with = |s: &[u32], q: &[u32]| [s, q].concat();
        let waves = vec![
            vec![with(s1, questions[0])],
            vec![with(s1, questions[1])],
            [
                vec![blockers[0].clone()],
                (2..5).map(|i| with(s1, questions[i])).collect(),
            ]
            .concat(),
            [
                vec![blockers[1].clone()],
                (5..8).map(|i| with(s2, questions[i])).collect(),
            ]
            .concat(),
        ];
        let expected = [0, 0, 0, 45, 45, 45, 0, 0, 45, 45];
        let off = start(name, false, device, 64, 16);
        let without = serve(&off, &waves).await;
        off.shutdown(Duration::from_secs(5)).await;
        let on = start(name, true, device, 64, 16);
        let with_cache = serve(&on, &waves).await;
        let stats = on.stats();
        on.shutdown(Duration::from_secs(5)).await;
        let cached: Vec<usize> = with_cache.iter().map(|r| r.2).collect();
        assert_eq!(cached, expected, "{name}: cached_tokens, {stats:?}");
        assert!(without.iter().all(|r| r.2 == 0));
        assert_eq!(
            stats.prefix_cache.unwrap().branch_points,
            2,
            "{name}: {stats:?}"
        );
        let (mut compared, mut near_ties) = (0, 0);
        for (i, ((a, _, _), (b, gaps, _))) in with_cache.iter().zip(&without).enumerate() {
            let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            compared += same;
            if same < b.len() {
                assert!(
                    gaps[same].abs() <= NEAR_TIE,
                    "{name} request {i}: token {same} differs with the cache on, gap {}",
                    gaps[same]
                );
                near_ties += 1;
            }
        }
        if let Device::Cpu = device {
            assert_eq!(near_ties, 0, "{name}: the CPU executor diverged");
        }
        println!("{name}: {compared} tokens compared, {near_ties} near-tie divergences, cached {cached:?}");
    }
}
