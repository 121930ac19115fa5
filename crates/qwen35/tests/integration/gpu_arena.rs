//! The GPU executor over a state arena (`PagePool::Arena`: slots' recurrent
//! state and KV pages mapped on demand from one pool of chunks), skipped
//! without a GPU (`GDN_REQUIRE_GPU=1` makes a missing GPU a failure), on
//! the tiny fixtures:
//! - the engine's ids are mapped by group through `Executor::memory`: a row
//!   on a slot or a page whose group is not mapped is refused and changes
//!   nothing, a group maps once, unmapping a slot group forgets its state,
//!   and the padding slot and page the decode graphs use are there from
//!   the start;
//! - the same rows give the same tokens and logprobs with and without the
//!   arena (decode graphs on), on groups mapped, unmapped and mapped again;
//! - the engine over an arena of one slot group and one page group (fewer
//!   slots than it runs at once without the arena) serves greedy requests
//!   with the tokens the executor gives each request alone, up to
//!   near-ties, as it does without the arena (see gpu_engine). The tiny
//!   fixtures' pages are small next to a chunk (a page group holds a
//!   thousand of them), so the pool presses on the slots, not the pages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use engine::{
    ArenaGeometry, Engine, EngineConfig, EngineHandle, ExecError, Executor, GenerateRequest,
    MemoryOp, PageId, SamplingParams, SlotId, StepRow, StopParams,
};
use engine_testkit::finished_tokens;
use qwen35::engine_exec::{ArenaPool, GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::{GpuModel, GpuOptions};
use qwen35_testkit::drive::{run, Request};
use qwen35_testkit::{Fixture, MODELS};

const PAGE: usize = 16;
const PAGES_PER_SLOT: usize = 8;
const OUT: usize = 24;
/// A pool large enough for any fixture's groups (chunks of 2 MiB).
const ROOMY_CHUNKS: usize = 128;
const NEAR_TIE: f32 = 0.05;

fn stream() -> Option<Arc<CudaStream>> {
    // Graph capture needs a created stream (not the legacy default one).
    gdn_kernels_testkit::gpu_stream().map(|s| s.context().new_stream().unwrap())
}

fn executor(f: &Fixture, s: &Arc<CudaStream>, slots: usize, pages: PagePool) -> GpuExecutor {
    let model = GpuModel::load(
        f.config.clone(),
        &f.weights,
        s.clone(),
        GpuOptions::default(),
    )
    .unwrap();
    GpuExecutor::new(
        model,
        GpuSizing {
            num_slots: slots,
            pages,
            page_size: PAGE,
            max_model_len: PAGES_PER_SLOT * PAGE,
        },
    )
    .unwrap()
}

fn arena(exec: &GpuExecutor) -> ArenaGeometry {
    exec.arena_geometry().expect("an arena executor")
}

fn refused(exec: &mut GpuExecutor, rows: &[StepRow], what: &str) {
    match exec.step(rows) {
        Err(ExecError::Refused(m)) => assert!(m.contains(what), "{m}"),
        other => panic!("expected a refusal naming {what:?}, got {other:?}"),
    }
}

#[test]
fn rows_run_only_on_mapped_groups() {
    let Some(s) = stream() else { return };
    let f = Fixture::load(MODELS[0]);
    let p = f.prompts.iter().find(|p| p.len() == 37).expect("a prompt");
    let mut exec = executor(&f, &s, 2, PagePool::Arena(ArenaPool::Chunks(ROOMY_CHUNKS)));
    let g = arena(&exec);
    let geometry = exec.geometry();
    println!("{g:?}, {geometry:?}");
    assert_eq!(g.num_chunks, ROOMY_CHUNKS);
    assert_eq!(geometry.num_pages, g.max_pages());
    assert_eq!(geometry.num_slots % g.slots_per_group, 0);
    assert!(geometry.num_slots >= 2);
    // The padding slot and page are mapped: graphs capture on them.
    exec.capture_decode_graphs(2).unwrap();

    let pages: Vec<PageId> = (0..PAGES_PER_SLOT as u32).map(PageId).collect();
    let row = |start: usize, tokens| StepRow {
        snapshots: &[],
        slot: SlotId(0),
        start,
        tokens,
        pages: &pages,
        sample: None,
    };
    refused(&mut exec, &[row(0, &p[..16])], "slot 0 is not mapped");
    exec.memory(MemoryOp::MapSlots(0)).unwrap();
    refused(&mut exec, &[row(0, &p[..16])], "page 0 is not mapped");
    exec.memory(MemoryOp::MapPages(0)).unwrap();
    exec.step(&[row(0, &p[..16])]).unwrap();
    // A group maps once; a group beyond the arena does not map.
    let again = exec.memory(MemoryOp::MapSlots(0));
    assert!(matches!(again, Err(ExecError::Refused(_))), "{again:?}");
    let beyond = (geometry.num_pages / g.pages_per_group) as u32;
    let beyond = exec.memory(MemoryOp::MapPages(beyond));
    assert!(matches!(beyond, Err(ExecError::Refused(_))), "{beyond:?}");
    let unmapped = exec.memory(MemoryOp::UnmapPages(1));
    assert!(
        matches!(unmapped, Err(ExecError::Refused(_))),
        "{unmapped:?}"
    );
    // Unmapping the slot's group forgets its state: the row that would
    // continue it is refused, mapped or not, and one that starts over is
    // refused until the group is mapped again.
    exec.memory(MemoryOp::UnmapSlots(0)).unwrap();
    refused(&mut exec, &[row(16, &p[16..32])], "holds no sequence's");
    refused(&mut exec, &[row(0, &p[..16])], "slot 0 is not mapped");
    exec.memory(MemoryOp::MapSlots(0)).unwrap();
    refused(&mut exec, &[row(16, &p[16..32])], "holds no sequence's");
    exec.step(&[row(0, &p[..16])]).unwrap();
    exec.step(&[row(16, &p[16..32])]).unwrap();
    exec.memory(MemoryOp::UnmapSlots(0)).unwrap();
    exec.memory(MemoryOp::UnmapPages(0)).unwrap();
}

/// Greedy runs of the short prompts at once (one slot and its pages each),
/// decode graphs on.
fn greedy_runs(exec: &mut GpuExecutor, prompts: &[&Vec<u32>]) -> Vec<Vec<engine::SampledToken>> {
    exec.capture_decode_graphs(prompts.len()).unwrap();
    let mut reqs: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request::new(i as u32, PAGES_PER_SLOT, p, 16, OUT))
        .collect();
    run(exec, &mut reqs);
    reqs.into_iter().map(|r| r.out).collect()
}

#[test]
fn the_arena_gives_the_tokens_of_reserved_slots_and_pages() {
    let Some(s) = stream() else { return };
    for name in MODELS {
        let f = Fixture::load(name);
        let prompts: Vec<&Vec<u32>> = f.prompts.iter().filter(|p| p.len() <= 64).collect();
        let n = prompts.len();
        let mut plain = executor(&f, &s, n, PagePool::Fixed(n * PAGES_PER_SLOT));
        let want = greedy_runs(&mut plain, &prompts);
        drop(plain);

        let mut exec = executor(&f, &s, n, PagePool::Arena(ArenaPool::Chunks(ROOMY_CHUNKS)));
        let g = arena(&exec);
        let slot_groups = n.div_ceil(g.slots_per_group) as u32;
        let page_groups = (n * PAGES_PER_SLOT).div_ceil(g.pages_per_group) as u32;
        let map = |exec: &mut GpuExecutor, map: bool| {
            for k in 0..slot_groups {
                let op = if map {
                    MemoryOp::MapSlots(k)
                } else {
                    MemoryOp::UnmapSlots(k)
                };
                exec.memory(op).unwrap();
            }
            for k in 0..page_groups {
                let op = if map {
                    MemoryOp::MapPages(k)
                } else {
                    MemoryOp::UnmapPages(k)
                };
                exec.memory(op).unwrap();
            }
        };
        map(&mut exec, true);
        assert_eq!(greedy_runs(&mut exec, &prompts), want, "{name}");
        // Mapped again (maybe onto other chunks): the same once more.
        map(&mut exec, false);
        map(&mut exec, true);
        assert_eq!(greedy_runs(&mut exec, &prompts), want, "{name}, remapped");
    }
}

fn start(name: &'static str, slots: usize, pages: PagePool) -> EngineHandle {
    let mut config = EngineConfig::new(vec![]);
    config.max_num_batched_tokens = 24;
    config.max_num_seqs = slots;
    let handle = Engine::start(
        config,
        move || {
            let f = Fixture::load(name);
            let s = GpuModel::default_stream().map_err(|e| e.to_string())?;
            let mut exec = executor(&f, &s, slots, pages);
            exec.capture_decode_graphs(slots)
                .map_err(|e| e.to_string())?;
            Ok(Box::new(exec) as Box<dyn Executor>)
        },
        &prometheus::Registry::new(),
    )
    .expect("engine starts");
    let until = Instant::now() + Duration::from_secs(120);
    while handle.max_model_len().is_none() {
        assert!(
            Instant::now() < until,
            "the engine did not finish loading: {:?}",
            handle.state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    handle
}

async fn served(handle: &EngineHandle, prompts: &[&Vec<u32>]) -> Vec<Vec<u32>> {
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let req = GenerateRequest {
                prompt: p.to_vec(),
                sampling: SamplingParams {
                    temperature: 0.0,
                    ..Default::default()
                },
                stop: StopParams {
                    max_tokens: OUT,
                    min_tokens: 0,
                    stop_token_ids: vec![],
                    ignore_eos: true,
                },
                snapshot_points: Vec::new(),
                constraint: None,
            };
            handle.submit(req).expect("accepted")
        })
        .collect();
    finished_tokens(streams).await
}

/// `got` follows `alone` (the executor's run of each request by itself)
/// except where `alone`'s top two tokens are a near-tie; returns the
/// tokens compared.
fn compare(what: &str, alone: &[Vec<engine::SampledToken>], got: &[Vec<u32>]) -> usize {
    let mut compared = 0;
    for (i, (a, g)) in alone.iter().zip(got).enumerate() {
        assert_eq!(g.len(), OUT, "{what} request {i}");
        match a.iter().zip(g).position(|(x, &y)| x.token != y) {
            None => compared += OUT,
            Some(j) => {
                let top = &a[j].top_logprobs;
                let gap = top[0].1 - top[1].1;
                println!("{what} request {i}: leaves the alone run at token {j} (gap {gap:.4})");
                assert!(
                    gap <= NEAR_TIE,
                    "{what} request {i}: token {j} differs ({} served, {} alone), top two {gap} apart",
                    g[j],
                    a[j].token
                );
                compared += j;
            }
        }
    }
    compared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_serves_over_an_arena_of_one_slot_group() {
    let Some(s) = stream() else { return };
    for name in MODELS {
        let f = Fixture::load(name);
        let short: Vec<&Vec<u32>> = f.prompts.iter().filter(|p| p.len() <= 64).collect();
        // Alone: one request at a time through the executor.
        let mut exec = executor(&f, &s, 1, PagePool::Fixed(PAGES_PER_SLOT));
        let alone: Vec<Vec<engine::SampledToken>> = short
            .iter()
            .map(|p| {
                let mut r = vec![Request::new(0, PAGES_PER_SLOT, p, 64, OUT)];
                run(&mut exec, &mut r);
                r.pop().unwrap().out
            })
            .collect();
        let probe = executor(&f, &s, 1, PagePool::Arena(ArenaPool::Chunks(ROOMY_CHUNKS)));
        let g = arena(&probe);
        drop((exec, probe));
        // Half a slot group more requests than one group holds, the short
        // prompts in turn; slots for all of them without the arena.
        let n = g.slots_per_group * 3 / 2;
        let slots = 2 * g.slots_per_group;
        let prompts: Vec<&Vec<u32>> = (0..n).map(|i| short[i % short.len()]).collect();
        let alone: Vec<_> = (0..n).map(|i| alone[i % short.len()].clone()).collect();

        let reserved = start(name, slots, PagePool::Fixed(slots * PAGES_PER_SLOT));
        let got = served(&reserved, &prompts).await;
        let compared = compare(&format!("{name} reserved"), &alone, &got);
        reserved.shutdown(Duration::from_secs(10)).await;
        assert!(compared * 2 >= n * OUT, "{name}: {compared}");

        // One slot group and one page group: the second slot group never
        // fits next to the pages, so at most a group's slots run at once.
        let chunks = g.chunks_per_slot_group + g.chunks_per_page_group;
        let pooled = start(name, slots, PagePool::Arena(ArenaPool::Chunks(chunks)));
        let got = served(&pooled, &prompts).await;
        println!("{name} over the arena: {g:?}, {:?}", pooled.stats());
        let compared = compare(&format!("{name} arena"), &alone, &got);
        pooled.shutdown(Duration::from_secs(10)).await;
        assert!(compared * 2 >= n * OUT, "{name}: {compared}");
    }
}
