//! The engine on the CPU executor with the committed fixtures (tiny random
//! Qwen3.5 models, dense and MoE): concurrent greedy requests, chunked under a small token
//! budget (mixed decode + prefill steps) and preempted by a tiny page pool,
//! each get exactly the tokens of the CPU reference forward's own greedy
//! loop on that request alone; slots and pages are all free afterwards.

use std::time::{Duration, Instant};

use engine::{
    AdmissionPolicy, Engine, EngineConfig, EngineHandle, EngineStats, Executor, GenerateRequest,
    SamplingParams, StopParams,
};
use engine_testkit::finished_tokens;
use qwen35::engine_exec::{CpuExecutor, CpuSizing};
use qwen35::{CpuModel, Weights};
use qwen35_testkit::drive::cpu_greedy;
use qwen35_testkit::{Fixture, MODELS, MOE_MODELS};

const PAGE: usize = 16;

fn start(f: &Fixture, budget: usize, sizing: CpuSizing) -> EngineHandle {
    start_with(f, budget, sizing, AdmissionPolicy::default())
}

fn start_with(
    f: &Fixture,
    budget: usize,
    sizing: CpuSizing,
    admission: AdmissionPolicy,
) -> EngineHandle {
    let mut config = EngineConfig::new(vec![]);
    config.admission = admission;
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = sizing.num_slots;
    let (c, w) = (f.config.clone(), Weights::open(&f.dir).unwrap());
    let handle = Engine::start(
        config,
        move || {
            let model = CpuModel::load(c, &w).map_err(|e| e.to_string())?;
            let exec = CpuExecutor::new(model, sizing).map_err(|e| e.to_string())?;
            Ok(Box::new(exec) as Box<dyn Executor>)
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

fn greedy(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
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

async fn tokens_of(handle: &EngineHandle, reqs: &[GenerateRequest]) -> Vec<Vec<u32>> {
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| handle.submit(r.clone()).expect("accepted"))
        .collect();
    finished_tokens(streams).await
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

/// Every fixture prompt up to 128 tokens, twice (8 requests), 12 tokens each.
fn workload(f: &Fixture) -> Vec<GenerateRequest> {
    let short: Vec<&Vec<u32>> = f.prompts.iter().filter(|p| p.len() <= 128).collect();
    short
        .iter()
        .chain(short.iter())
        .map(|p| greedy(p, 12))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_chunked_requests_get_the_reference_tokens() {
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        let f = Fixture::load(name);
        let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        let reqs = workload(&f);
        // A budget of 24 tokens: the 37- and 128-token prompts prefill in
        // chunks while other requests decode in the same steps.
        let handle = start(
            &f,
            24,
            CpuSizing {
                num_slots: 8,
                num_pages: 8 * 16,
                page_size: PAGE,
                max_model_len: 256,
            },
        );
        let got = tokens_of(&handle, &reqs).await;
        for (r, g) in reqs.iter().zip(&got) {
            assert_eq!(
                g,
                &cpu_greedy(&model, &r.prompt, 12),
                "{name}: {} prompt tokens",
                r.prompt.len()
            );
        }
        let stats = released(&handle);
        assert!(stats.steps > 0);
        handle.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_requests_continue_as_if_never_preempted() {
    for name in [MODELS[0], MOE_MODELS[0]] {
        preempted_requests_continue(name).await;
    }
}

async fn preempted_requests_continue(name: &str) {
    let f = Fixture::load(name);
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    // Short prompts, long outputs: sequences outgrow the pool while they
    // decode. 24 pages of 4 positions; each request needs 11 to 20.
    let reqs: Vec<GenerateRequest> = f
        .prompts
        .iter()
        .filter(|p| p.len() <= 37)
        .map(|p| greedy(p, 40))
        .collect();
    assert!(reqs.len() >= 3);
    // The watermark admits them and preempts.
    let handle = start_with(
        &f,
        64,
        CpuSizing {
            num_slots: 8,
            num_pages: 24,
            page_size: 4,
            max_model_len: 96,
        },
        AdmissionPolicy::Watermark,
    );
    let got = tokens_of(&handle, &reqs).await;
    for (r, g) in reqs.iter().zip(&got) {
        assert_eq!(
            g,
            &cpu_greedy(&model, &r.prompt, 40),
            "{name}: {} prompt tokens",
            r.prompt.len()
        );
    }
    let stats = released(&handle);
    println!("{stats:?}");
    assert!(
        stats.preemptions > 0,
        "{name}: the page pool was meant to force preemption: {stats:?}"
    );
    handle.shutdown(Duration::from_secs(5)).await;
}
