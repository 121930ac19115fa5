//! Structured outputs served on the GPU executor (the GPU test skips
//! without a GPU; `GDN_REQUIRE_GPU=1` makes a missing GPU a failure), and
//! the same harness on the CPU executor. The fixture models have random
//! weights and requests sample at temperature 1, so any valid output is
//! the constraint's doing: each output must parse, validate (JSON schemas
//! with the `jsonschema` crate), and end by its grammar (`stop`), never by
//! length (free JSON whitespace is turned off with llguidance's
//! `x-guidance` option for that reason; `json_object`, whose whitespace
//! cannot be bounded, is left to the engine's CPU tests). Eight requests of each kind run at once;
//! their outputs outgrow the KV pool, so the engine
//! preempts and resumes constrained requests (their matchers replay); a
//! forced tool call must come back as `tool_calls`
//! whose arguments validate against the tool's schema.
//!
//! Fixtures: crates/qwen35/tests/fixtures (or `QWEN35_FIXTURES`).

use qwen35_testkit as common;

use crate::served;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use common::MODELS;
use gdn_http::api::AppState;
use serde_json::{json, Value as Json};
use served::Device;

/// Requests of each kind at once.
const AT_ONCE: u64 = 8;
/// Enough for every constraint below to finish (their lengths are bounded).
const MAX_TOKENS: usize = 160;
/// Prompt tokens of each completion: 18 pages of 16 with the first output
/// token.
const PROMPT: usize = 280;
/// KV pages of 16 positions: the 8 completions' prompts fit with 6 pages to
/// spare, so their outputs outgrow the pool and the engine preempts. (The
/// tool calls' prompts, about a thousand tokens with the tools, fit two
/// at a time.)
const POOL: usize = 150;

fn schema() -> Json {
    json!({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 6},
        "xs": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -5, "maximum": 5}}},
        "required": ["n", "tag", "ok"], "additionalProperties": false,
        // llguidance's option: no free whitespace between tokens, which a
        // random model would otherwise spin in until the length limit.
        "x-guidance": {"whitespace_flexible": false}})
}

fn tool_schema() -> Json {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false})
}

async fn post(state: &Arc<AppState>, path: &str, body: Json) -> Json {
    let req = HttpRequest::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, bytes) = served::send(state, req).await;
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{path} {body}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// `AT_ONCE` seeded completions of `PROMPT`-token prompts (a different
/// one each: no shared prefix) under `fields`, sent together: the
/// texts, each checked to have ended by its grammar.
async fn completions(state: &Arc<AppState>, fields: Json) -> Vec<String> {
    let bodies = (0..AT_ONCE).map(|seed| {
        let mut body = json!({"prompt": vec![5 + seed; PROMPT], "max_tokens": MAX_TOKENS, "temperature": 1.0,
            "seed": seed});
        for (k, v) in fields.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    });
    let answers =
        futures_util::future::join_all(bodies.map(|b| post(state, "/v1/completions", b))).await;
    answers
        .iter()
        .map(|v| {
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "stop", "{fields}: {v}");
            choice["text"].as_str().unwrap().to_string()
        })
        .collect()
}

/// `[a-c]{2,6}x`: checked by hand (no regex engine in the tests).
fn matches_letters_then_x(text: &str) -> bool {
    let Some(body) = text.strip_suffix('x') else {
        return false;
    };
    (2..=6).contains(&body.len()) && body.bytes().all(|b| (b'a'..=b'c').contains(&b))
}

/// `start: "(" num ("," num)* ")"` with `num: /[0-9]{1,2}/`.
fn is_number_tuple(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')) else {
        return false;
    };
    inner
        .split(',')
        .all(|n| (1..=2).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

async fn gate(device: Device, name: &str) {
    let server = served::start(device, &common::dir(name), POOL, 1280, 256).await;
    let state = server.state.clone();
    let validator = jsonschema::validator_for(&schema()).unwrap();

    let schema_field = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema(), "strict": true}}});
    for text in completions(&state, schema_field).await {
        let value: Json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {text:?}"));
        assert!(validator.is_valid(&value), "{name}: invalid: {text}");
    }
    let regex = json!({"structured_outputs": {"regex": "[a-c]{2,6}x"}});
    for text in completions(&state, regex).await {
        assert!(matches_letters_then_x(&text), "{name}: {text:?}");
    }
    let choices = ["yes", "no", "maybe"];
    for text in completions(&state, json!({"guided_choice": choices})).await {
        assert!(choices.contains(&text.as_str()), "{name}: {text:?}");
    }
    let grammar = "start: \"(\" num (\",\" num)* \")\"\nnum: /[0-9]{1,2}/";
    let lark = json!({"structured_outputs": {"grammar": grammar}});
    for text in completions(&state, lark).await {
        assert!(is_number_tuple(&text), "{name}: {text:?}");
    }

    // Forced tool calls on the chat endpoint, named and required.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": tool_schema()}}]);
    let tool_validator = jsonschema::validator_for(&tool_schema()).unwrap();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for tool_choice in [json!("required"), named] {
        let bodies = (0..AT_ONCE).map(|seed| {
            json!({"messages": [{"role": "user", "content": "weather?"}], "tools": tools,
                "tool_choice": tool_choice, "max_tokens": MAX_TOKENS, "temperature": 1.0,
                "seed": seed, "chat_template_kwargs": {"enable_thinking": false}})
        });
        let answers =
            futures_util::future::join_all(bodies.map(|b| post(&state, "/v1/chat/completions", b)))
                .await;
        for v in answers {
            let choice = &v["choices"][0];
            let calls = choice["message"]["tool_calls"].as_array().unwrap();
            // `required` allows several calls in a row (as vLLM's does): a
            // random model may go on calling until the length limit cuts
            // the last one. Every call before it is whole and validates.
            let whole = match choice["finish_reason"].as_str() {
                Some("tool_calls") => calls.len(),
                Some("length") if tool_choice == "required" => calls.len() - 1,
                _ => panic!("{name}: {v}"),
            };
            if tool_choice != "required" {
                assert_eq!(calls.len(), 1, "{name}: a named tool is called once: {v}");
            }
            assert!(whole >= 1, "{name}: no whole tool call: {v}");
            for call in &calls[..whole] {
                assert_eq!(call["function"]["name"], "get_weather", "{v}");
                let arguments: Json =
                    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                assert!(tool_validator.is_valid(&arguments), "{name}: {arguments}");
            }
        }
    }

    let masks = served::metric(&state, "gdn:structured_output_masks_total").await;
    let preemptions = served::metric(&state, "vllm:num_preemptions_total").await;
    println!("{name} ({device:?}): {masks} masks, {preemptions} preemptions");
    assert!(masks > 0.0, "{name}: no token masks were computed");
    assert!(
        preemptions > 0.0,
        "{name}: the pool of {POOL} pages was meant to preempt"
    );
    state
        .engine
        .shutdown(std::time::Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_outputs_served_on_the_gpu_validate_and_end_by_their_grammar() {
    if gdn_kernels_testkit::gpu_stream().is_none() {
        return;
    }
    for name in MODELS {
        gate(Device::Gpu, name).await;
    }
}

/// One fixture on the CPU: the constraint path under test (matchers,
/// masks, replay after preemption) is the engine's and is the same for
/// every model, and the CPU forward of all three fixtures made this the
/// longest test of CI. The GPU variant above keeps every fixture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_outputs_served_on_the_cpu_validate_and_end_by_their_grammar() {
    gate(Device::Cpu, MODELS[0]).await;
}
