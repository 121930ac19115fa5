//! The HF gates through the server (the GPU test skips without a GPU;
//! `GDN_REQUIRE_GPU=1` makes a missing GPU a failure). For each committed
//! fixture model, dense and MoE, the server app starts in-process the way `gdn-server`
//! starts it (tests/served), with
//! `--num-gpu-blocks-override 6`: 6 KV pages of 16 positions for requests of
//! up to 5 pages each, so the engine must preempt. Token-id prompts go to
//! `/v1/completions` (temperature 0, `ignore_eos`, `return_token_ids`), first
//! one at a time, then all at once, twice over (streamed and not), which
//! mixes prefills and decodes in steps of a 24-token budget.
//!
//! The served tokens must equal the runtime's own greedy tokens, computed
//! here by the executor alone with a big pool (on the GPU the run that
//! qwen35's gpu_executor.rs gates against HF's bf16 goldens). bf16 sums
//! depend on the batch shape, so a served sequence may leave the alone run
//! only where the alone run's top two tokens are a near-tie (gap <= 0.05,
//! the rule of qwen35's gpu_engine.rs); from there on the two continuations
//! are different texts and are not compared. On a MoE fixture the same
//! sums may also flip a routing near-tie, which moves that token's logits
//! and every later token's by O(1) (qwen35_testkit::moe): a served sequence
//! may also leave the alone run anywhere after the first position where the
//! exact forward of the alone run's tokens meets one.
//!
//! The same harness runs on the CPU executor (the f32 reference forward), so
//! the test's own logic runs without a GPU too. Dense and MoE fixtures alike.
//!
//! Fixtures: crates/qwen35/tests/fixtures (or `QWEN35_FIXTURES`).

use qwen35_testkit as common;

use crate::served;

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::Executor;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use common::drive::{run, Request};
use common::{Fixture, MODELS, MOE_MODELS};
use gdn_http::api::AppState;
use qwen35::engine_exec::{CpuExecutor, CpuSizing, GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::{GpuModel, GpuOptions};
use qwen35::CpuModel;
use serde_json::{json, Value as Json};
use served::Device;

const PAGE: usize = 16;
/// Output tokens per request.
const OUT: usize = 40;
/// The near-tie of qwen35's gpu_engine.rs: a quarter of the gate's regret limit.
const NEAR_TIE: f32 = 0.05;
/// KV pages of the served engine: 3 + 3 + 5 pages are needed at once.
const TINY_POOL: usize = 6;

/// The fixture prompts the test serves (those that fit 64-token chunks, as
/// in gpu_engine.rs).
fn prompts(f: &Fixture) -> Vec<Vec<u32>> {
    f.prompts
        .iter()
        .filter(|p| p.len() <= 64)
        .cloned()
        .collect()
}

/// The runtime alone: each prompt on its own through the executor (8 slots,
/// 64 pages, no graphs), greedy, with the top 5 logprobs of every token.
fn alone(device: Device, f: &Fixture, prompts: &[Vec<u32>]) -> Vec<Request> {
    let mut exec: Box<dyn Executor> = match device {
        Device::Gpu => {
            let stream = GpuModel::default_stream().unwrap();
            let model = GpuModel::load(f.config.clone(), &f.weights, stream, GpuOptions::default())
                .unwrap();
            let sizing = GpuSizing {
                num_slots: 8,
                pages: PagePool::Fixed(8 * 8),
                page_size: PAGE,
                max_model_len: 8 * PAGE,
            };
            Box::new(GpuExecutor::new(model, sizing).unwrap())
        }
        Device::Cpu => {
            let sizing = CpuSizing {
                num_slots: 8,
                num_pages: 8 * 8,
                page_size: PAGE,
                max_model_len: 8 * PAGE,
            };
            Box::new(CpuExecutor::load(&f.dir, sizing).unwrap())
        }
    };
    prompts
        .iter()
        .map(|p| {
            let mut r = vec![Request::new(0, 8, p, 64, OUT)];
            run(exec.as_mut(), &mut r);
            r.pop().unwrap()
        })
        .collect()
}

/// Per alone run, the first output token that may leave it through a
/// routing near-tie (MoE fixtures; `OUT`, none, for dense ones): the one
/// whose logits first see a position where the exact forward of the prompt
/// and the alone run's tokens has a router within `moe::NEAR_TIE`.
fn routing_near_tie(f: &Fixture, prompts: &[Vec<u32>], alone: &[Request]) -> Vec<usize> {
    if f.config.moe.is_none() {
        return vec![OUT; prompts.len()];
    }
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    prompts
        .iter()
        .zip(alone)
        .map(|(p, a)| {
            let mut seq = p.clone();
            seq.extend(&a.tokens()[..OUT - 1]);
            let near = common::moe::routing_near_ties(&model, &seq);
            // Output token j comes from the logits at position len + j - 1.
            near.iter()
                .position(|&n| n)
                .map_or(OUT, |at| (at + 1).saturating_sub(p.len()))
        })
        .collect()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of token ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A greedy completion of `prompt` through `/v1/completions`: its token ids
/// (`return_token_ids`), with the prompt's ids and the finish checked.
async fn complete(state: Arc<AppState>, prompt: Vec<u32>, stream: bool) -> Vec<u32> {
    let body = json!({
        "prompt": prompt, "max_tokens": OUT, "temperature": 0, "ignore_eos": true,
        "return_token_ids": true, "stream": stream,
    });
    let req = HttpRequest::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, bytes) = served::send(&state, req).await;
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    if !stream {
        let v: Json = serde_json::from_str(&text).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(ids(&choice["prompt_token_ids"]), prompt, "{text}");
        assert_eq!(choice["finish_reason"], "length", "{text}");
        assert_eq!(v["usage"]["completion_tokens"], OUT, "{text}");
        return ids(&choice["token_ids"]);
    }
    let mut tokens = vec![];
    let mut prompt_ids_seen = 0;
    let mut finish = Json::Null;
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    for event in &events[..events.len() - 1] {
        let v: Json = serde_json::from_str(event).unwrap();
        let choice = &v["choices"][0];
        if let Some(p) = choice.get("prompt_token_ids") {
            assert_eq!(ids(p), prompt, "{event}");
            prompt_ids_seen += 1;
        }
        tokens.extend(ids(&choice["token_ids"]));
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(
        prompt_ids_seen, 1,
        "prompt_token_ids on the first chunk only"
    );
    assert_eq!(finish, "length", "{text}");
    tokens
}

/// Tokens compared against the alone run, and whether the served sequence
/// left it (at a near-tie of the tokens, or from output token
/// `routing_tie_from` on; anything else fails).
fn compare(
    what: &str,
    (alone, routing_tie_from): (&Request, usize),
    served: &[u32],
) -> (usize, bool) {
    assert_eq!(served.len(), OUT, "{what}: served {served:?}");
    let want = alone.tokens();
    match want.iter().zip(served).position(|(a, b)| a != b) {
        None => (OUT, false),
        Some(j) => {
            let top = &alone.out[j].top_logprobs;
            let gap = top[0].1 - top[1].1;
            let tie = match routing_tie_from {
                OUT => "no routing near-tie".to_string(),
                at => format!("first routing near-tie before token {at}"),
            };
            println!("{what}: leaves the alone run at token {j} (top-2 gap {gap:.4}, {tie})");
            assert!(
                gap <= NEAR_TIE || j >= routing_tie_from,
                "{what}: token {j} differs ({} served, {} alone) where the alone run's top two are {gap} apart and no routing near-tie precedes",
                served[j],
                want[j]
            );
            (j, true)
        }
    }
}

async fn gate(device: Device, name: &str) {
    let f = Fixture::load(name);
    let prompts = prompts(&f);
    let reference = alone(device, &f, &prompts);
    let routing_ties = routing_near_tie(&f, &prompts, &reference);
    drop(f);
    let server = served::start(device, &common::dir(name), TINY_POOL, 128, 24).await;
    let state = server.state.clone();

    let mut served: Vec<(String, usize, Vec<u32>)> = vec![];
    // Alone: one request at a time.
    for (i, p) in prompts.iter().enumerate() {
        let tokens = complete(state.clone(), p.clone(), false).await;
        served.push((format!("{name} prompt {i} alone"), i, tokens));
    }
    // All at once, each prompt twice (streamed and not): mixed batches and,
    // with 6 pages for up to 6 x 3..5 pages, preemption.
    let batch: Vec<(usize, bool)> = (0..prompts.len())
        .flat_map(|i| [(i, false), (i, true)])
        .collect();
    let outputs = futures_util::future::join_all(
        batch
            .iter()
            .map(|&(i, stream)| complete(state.clone(), prompts[i].clone(), stream)),
    )
    .await;
    for (&(i, stream), tokens) in batch.iter().zip(outputs) {
        let how = if stream { "streamed" } else { "whole" };
        served.push((format!("{name} prompt {i} in the batch, {how}"), i, tokens));
    }

    let mut compared = 0;
    let mut divergences = 0;
    for (what, i, tokens) in &served {
        let (n, diverged) = compare(what, (&reference[*i], routing_ties[*i]), tokens);
        compared += n;
        divergences += diverged as usize;
    }
    let preemptions = served::metric(&state, "vllm:num_preemptions_total").await;
    assert!(
        preemptions > 0.0,
        "{name}: the tiny pool was meant to preempt: {:?}",
        state.engine.stats()
    );
    // Every slot and page is back once the requests are answered.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = state.engine.stats();
        if s.slots_used == 0 && s.pages_used == 0 && s.running == 0 && s.waiting == 0 {
            break;
        }
        assert!(Instant::now() < until, "{name}: engine not idle: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(served::metric(&state, "gdn:state_slots_used").await, 0.0);
    assert_eq!(
        served::metric(&state, "vllm:kv_cache_usage_perc").await,
        0.0
    );
    println!(
        "{name} ({device:?}): {} requests, {compared} tokens compared, {preemptions} preemptions, {divergences} divergences at near-ties",
        served.len()
    );
    // Near-ties are rare: most tokens must have been compared.
    assert!(
        compared * 2 >= served.len() * OUT,
        "{name}: only {compared} tokens compared"
    );
    state.engine.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_greedy_tokens_equal_the_gpu_runtime_alone_up_to_near_ties() {
    if gdn_kernels_testkit::gpu_stream().is_none() {
        return;
    }
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        gate(Device::Gpu, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_greedy_tokens_equal_the_cpu_runtime_alone_up_to_near_ties() {
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        gate(Device::Cpu, name).await;
    }
}
