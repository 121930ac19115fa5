//! Prefix caching through the server: a 5-turn chat on the demo checkpoint,
//! rendered by the server's own chat template (Qwen3.5's), thinking on and
//! off, and an agent's tool-call loop; each on the CPU executor (CI) and on
//! the GPU runtime (skipped without a GPU; `GDN_REQUIRE_GPU=1` makes that a
//! failure). Each turn re-sends the whole conversation, as chat clients do,
//! to a server with `--enable-prefix-caching` and one with
//! `--no-enable-prefix-caching`; the cache-off server's answers make the
//! history both servers get next, so their prompts are the same. The
//! generated token ids must be equal, turn by turn: on the CPU exactly; on
//! the GPU up to a near-tie (bf16 sums depend on the step's shape, which
//! the cache changes): where the two first differ, the cache-off run's top
//! two log-probabilities must be at most `NEAR_TIE` apart (qwen35's
//! gpu_engine.rs rule), and that answer is compared no further. And `usage.prompt_tokens_details.cached_tokens` must be exactly the
//! longest earlier snapshot point that prefixes the new prompt: after an
//! earlier prompt's final `<|im_start|>assistant\n`, before its last token
//! (when that marker is not just before it), or at the end of its
//! generation (the design's points, recomputed here from the token ids
//! alone). The template drops earlier turns'
//! `<think>` blocks, so the marker point is the one that serves each new
//! turn: the test also checks that every turn after the first is served at
//! least up to the previous prompt's final `<|im_start|>assistant\n`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use clap::Parser;
use engine::scheduler::MARKER_COVERS_END;
use engine::EngineState;
use gdn_http::api::AppState;
use gdn_http::http::router;
use gdn_server::cli::Args;
use gdn_server::executor;
use gdn_server::{prepare, Prepared};
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");
/// The near-tie of qwen35's gpu_engine.rs: a quarter of the HF gate's
/// regret limit.
const NEAR_TIE: f64 = 0.05;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Device {
    Cpu,
    Gpu,
}

/// Whether a test on `device` runs here (the GPU's tests return early, and
/// pass, without a usable GPU unless `GDN_REQUIRE_GPU=1`).
fn runs_on(device: Device) -> bool {
    device == Device::Cpu || gdn_kernels_testkit::gpu_stream().is_some()
}

async fn start(device: Device, cache_flag: &str) -> Prepared {
    let args = Args::parse_from([
        "gdn-server",
        "--model",
        DEMO,
        "--device",
        match device {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        },
        // KV pages for every prompt of the test and their cached copies:
        // page pressure would evict cached pages and change the expected
        // hits below (on the CPU only a bound on the total).
        "--num-gpu-blocks-override",
        "512",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "256",
        "--block-size",
        "64",
        // Room for every snapshot of the test (3 per request, 10 requests):
        // no eviction, so the expected hits below are exact.
        "--prefix-cache-state-budget",
        "64",
        cache_flag,
    ]);
    let prepared = prepare(&args, executor::pick).expect("the server starts");
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        match prepared.state.engine.state() {
            EngineState::Ready => break,
            EngineState::Dead(why) => panic!("the engine failed to load: {why}"),
            state => assert!(Instant::now() < until, "not loaded: {state:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    prepared
}

async fn chat(state: &Arc<AppState>, messages: &[Json], thinking: bool) -> Json {
    let body = json!({
        "messages": messages, "max_tokens": 12, "temperature": 0,
        "return_token_ids": true, "logprobs": true, "top_logprobs": 2,
        "chat_template_kwargs": {"enable_thinking": thinking},
    });
    let req = HttpRequest::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of token ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The output token ids of `on` (cache on) and `off` (cache off) to the
/// same prompt are equal: exactly on the CPU, up to a near-tie on the GPU
/// (where they first differ, `off`'s top two log-probabilities are at most
/// `NEAR_TIE` apart).
fn same_output(device: Device, on: &Json, off: &Json, what: &str) {
    let (o, o_off) = (
        ids(&on["choices"][0]["token_ids"]),
        ids(&off["choices"][0]["token_ids"]),
    );
    let entries = off["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no logprobs: {off}"));
    assert_eq!(entries.len(), o_off.len(), "{what}: a logprob per token");
    let Some(j) = o.iter().zip(&o_off).position(|(a, b)| a != b) else {
        assert_eq!(
            o.len(),
            o_off.len(),
            "{what}: cache on and off differ in length"
        );
        return;
    };
    assert_eq!(
        device,
        Device::Gpu,
        "{what}: cache on and off differ at token {j}"
    );
    let top = entries[j]["top_logprobs"].as_array().unwrap();
    let gap = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
    println!("{what}: cache on leaves cache off at token {j} (top-2 gap {gap:.4})");
    assert!(
        gap <= NEAR_TIE,
        "{what}: token {j} differs ({} on, {} off) where cache off's top two are {gap} apart",
        o[j],
        o_off[j]
    );
}

/// One conversation sent to both servers, the cache-off server's answers
/// making the history: per turn, (prompt ids, the cache-on output ids,
/// cached_tokens). Asserts their outputs are the same (`same_output`).
async fn conversation(
    device: Device,
    on: &Arc<AppState>,
    off: &Arc<AppState>,
    thinking: bool,
) -> Vec<(Vec<u32>, Vec<u32>, usize)> {
    let questions = [
        "What is the capital of France?",
        "And of Italy?",
        "Which of the two is larger?",
        "Name a river in each.",
        "Thanks. Summarise in one line.",
    ];
    let mut messages =
        vec![json!({"role": "system", "content": "You are a terse geography tutor."})];
    let mut turns = vec![];
    for (turn, q) in questions.into_iter().enumerate() {
        messages.push(json!({"role": "user", "content": q}));
        let v = chat(on, &messages, thinking).await;
        let v_off = chat(off, &messages, thinking).await;
        let prompt = ids(&v["prompt_token_ids"]);
        assert_eq!(
            prompt,
            ids(&v_off["prompt_token_ids"]),
            "turn {turn}: prompts differ"
        );
        let what = format!("{device:?}, thinking {thinking}, turn {turn}");
        same_output(device, &v, &v_off, &what);
        assert_eq!(v_off["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        let usage = &v["usage"];
        assert_eq!(usage["prompt_tokens"], prompt.len(), "{v}");
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens: {v}")) as usize;
        // The client sends the answer back as content (reasoning dropped).
        let content = v_off["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("");
        messages.push(json!({"role": "assistant", "content": content}));
        turns.push((prompt, ids(&v["choices"][0]["token_ids"]), cached));
    }
    turns
}

/// Positions after the last occurrence of `marker` in `tokens`.
fn after_last(tokens: &[u32], marker: &[u32]) -> Option<usize> {
    tokens
        .windows(marker.len())
        .rposition(|w| w == marker)
        .map(|i| i + marker.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_turn_chat_cache_on_equals_off_with_exact_cached_tokens() {
    five_turn_chat(Device::Cpu).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_turn_chat_on_the_gpu() {
    if runs_on(Device::Gpu) {
        five_turn_chat(Device::Gpu).await;
    }
}

async fn five_turn_chat(device: Device) {
    let tokenizer = tokenizers::Tokenizer::from_file(format!("{DEMO}/tokenizer.json")).unwrap();
    let marker = tokenizer
        .encode("<|im_start|>assistant\n", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert!(!marker.is_empty());
    let on = start(device, "--enable-prefix-caching").await;
    let off = start(device, "--no-enable-prefix-caching").await;
    // Snapshot points of every request the cached server has served (the
    // thinking-off conversation also shares the thinking one's first
    // prompt up to its `<|im_start|>assistant\n`).
    let mut points: Vec<Vec<u32>> = vec![];
    for thinking in [true, false] {
        let with = conversation(device, &on.state, &off.state, thinking).await;
        for (turn, (p, o, cached)) in with.iter().enumerate() {
            let expected = points
                .iter()
                .filter(|s| s.len() < p.len() && p.starts_with(s))
                .map(Vec::len)
                .max()
                .unwrap_or(0);
            println!(
                "thinking {thinking}, turn {turn}: {} prompt tokens, {cached} cached",
                p.len()
            );
            assert_eq!(
                *cached, expected,
                "thinking {thinking}, turn {turn}: cached_tokens"
            );
            if turn > 0 {
                let previous = &with[turn - 1].0;
                let m = after_last(previous, &marker).expect("a generation prompt");
                assert!(p.starts_with(&previous[..m]));
                assert!(*cached >= m, "turn {turn}: {cached} < {m}");
            }
            // This request's own points: the marker; before the last prompt
            // token unless the marker is at most MARKER_COVERS_END before
            // it; the end of its generation (the last token is not fed).
            let m = after_last(p, &marker);
            if let Some(m) = m {
                points.push(p[..m].to_vec());
            }
            if m.is_none_or(|m| m + MARKER_COVERS_END < p.len() - 1) {
                points.push(p[..p.len() - 1].to_vec());
            }
            points.push([&p[..], &o[..o.len() - 1]].concat());
        }
    }
    on.state.engine.shutdown(Duration::from_secs(5)).await;
    off.state.engine.shutdown(Duration::from_secs(5)).await;
}

async fn chat_tools(state: &Arc<AppState>, messages: &[Json], tools: &Json) -> Json {
    let body = json!({
        "messages": messages, "tools": tools, "max_tokens": 10, "temperature": 0,
        "return_token_ids": true, "logprobs": true, "top_logprobs": 2,
    });
    let req = HttpRequest::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn tool_call(id: &str, city: &str) -> Json {
    json!({"role": "assistant", "content": "", "tool_calls": [{
        "id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": json!({"city": city}).to_string()},
    }]})
}

/// An agent's tool-call loop (the assistant calls a tool, the tool answers,
/// the next turn follows) and a second conversation with the same system
/// prompt and tools. The demo model cannot call tools, so the assistant's
/// calls are the client's (as an agent re-sends them); cache on == off per
/// request, and `cached_tokens` is the longest earlier snapshot point that
/// prefixes the prompt, the points recomputed from the token ids: the
/// design's points of the first test, plus the end of the preamble (the
/// system block with the tool definitions and `<|im_start|>user\n`, found
/// here by its first `<|im_start|>user\n`) when it is at least a page (64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_loop_and_a_shared_tools_preamble() {
    tool_call_loop(Device::Cpu).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_loop_on_the_gpu() {
    if runs_on(Device::Gpu) {
        tool_call_loop(Device::Gpu).await;
    }
}

async fn tool_call_loop(device: Device) {
    let tokenizer = tokenizers::Tokenizer::from_file(format!("{DEMO}/tokenizer.json")).unwrap();
    let encode = |s: &str| tokenizer.encode(s, false).unwrap().get_ids().to_vec();
    let marker = encode("<|im_start|>assistant\n");
    let user_header = encode("<|im_start|>user\n");
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city: temperature and sky.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
        }, "required": ["city"]},
    }}]);
    let system = json!({"role": "system", "content": "You are a weather assistant. Use the tool."});
    let conversations: Vec<Vec<Vec<Json>>> = {
        let paris = vec![
            system.clone(),
            json!({"role": "user", "content": "What is the weather in Paris?"}),
        ];
        let turn2 = [
            &paris[..],
            &[
                tool_call("call_1", "Paris"),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}),
            ],
        ]
        .concat();
        let turn3 = [
            &turn2[..],
            &[
                json!({"role": "assistant", "content": "It is 18C and sunny in Paris."}),
                json!({"role": "user", "content": "And in Rome?"}),
            ],
        ]
        .concat();
        let turn4 = [
            &turn3[..],
            &[
                tool_call("call_2", "Rome"),
                json!({"role": "tool", "tool_call_id": "call_2", "content": "24C, clear"}),
            ],
        ]
        .concat();
        let oslo = vec![
            system.clone(),
            json!({"role": "user", "content": "Is it snowing in Oslo?"}),
        ];
        vec![vec![paris, turn2, turn3, turn4], vec![oslo]]
    };
    let on = start(device, "--enable-prefix-caching").await;
    let off = start(device, "--no-enable-prefix-caching").await;
    let mut points: Vec<Vec<u32>> = vec![];
    let mut preamble: Option<usize> = None;
    for (c, turns) in conversations.iter().enumerate() {
        for (turn, messages) in turns.iter().enumerate() {
            let with = chat_tools(&on.state, messages, &tools).await;
            let without = chat_tools(&off.state, messages, &tools).await;
            let p = ids(&with["prompt_token_ids"]);
            let o = ids(&with["choices"][0]["token_ids"]);
            assert_eq!(p, ids(&without["prompt_token_ids"]));
            let what = format!("{device:?}, conversation {c}, turn {turn}");
            same_output(device, &with, &without, &what);
            assert_eq!(
                without["usage"]["prompt_tokens_details"]["cached_tokens"],
                0
            );
            let cached = with["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap() as usize;
            let expected = points
                .iter()
                .filter(|s| s.len() < p.len() && p.starts_with(s))
                .map(Vec::len)
                .max()
                .unwrap_or(0);
            println!(
                "conversation {c}, turn {turn}: {} prompt tokens, {cached} cached",
                p.len()
            );
            assert_eq!(cached, expected, "conversation {c}, turn {turn}");
            if c == 1 {
                // A new conversation: served its whole preamble, which the
                // first conversation's first request left.
                assert_eq!(Some(cached), preamble, "the preamble was not served");
            }
            // The preamble: up to the first user header, a page at least.
            let first_user = p
                .windows(user_header.len())
                .position(|w| w == user_header)
                .expect("a user turn")
                + user_header.len();
            assert!(first_user >= 64, "the tools make a long preamble");
            preamble.get_or_insert(first_user);
            points.push(p[..first_user].to_vec());
            let m = after_last(&p, &marker);
            if let Some(m) = m {
                points.push(p[..m].to_vec());
            }
            if m.is_none_or(|m| m + MARKER_COVERS_END < p.len() - 1) {
                points.push(p[..p.len() - 1].to_vec());
            }
            points.push([&p[..], &o[..o.len() - 1]].concat());
        }
    }
    on.state.engine.shutdown(Duration::from_secs(5)).await;
    off.state.engine.shutdown(Duration::from_secs(5)).await;
}
