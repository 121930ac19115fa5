//! gdn-server serving the tiny MoE fixtures on the CPU executor (CI):
//! greedy completions of token-id prompts, several at once, equal the
//! greedy loop of qwen35's CPU reference forward (the forward its HF fp32
//! gate checks) on each prompt alone; `/v1/models` lists the model with
//! its architecture.

use crate::served;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use gdn_http::api::AppState;
use qwen35::CpuModel;
use qwen35_testkit::{Fixture, MOE_MODELS};
use serde_json::{json, Value as Json};
use served::Device;

const MAX_TOKENS: usize = 10;
/// KV pages of 16 positions: room for every prompt at once (no preemption).
const POOL: usize = 4 * 512 / 16;

async fn call(state: &Arc<AppState>, req: HttpRequest<Body>) -> Json {
    let (status, bytes) = served::send(state, req).await;
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

async fn complete(state: Arc<AppState>, prompt: Vec<u32>) -> Vec<u32> {
    let body = json!({
        "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": true, "return_token_ids": true,
    });
    let req = HttpRequest::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let v = call(&state, req).await;
    let ids = &v["choices"][0]["token_ids"];
    ids.as_array()
        .unwrap_or_else(|| panic!("no token_ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy tokens of the CPU reference forward on `prompt` alone.
fn reference(model: &CpuModel, prompt: &[u32]) -> Vec<u32> {
    let mut state = model.new_state();
    let mut logits = model.forward(prompt, &mut state).unwrap().pop().unwrap();
    let mut out = vec![];
    for _ in 0..MAX_TOKENS {
        let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        out.push(best as u32);
        logits = model.forward(&[best as u32], &mut state).unwrap().remove(0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_greedy_equals_the_cpu_reference_on_the_moe_fixtures() {
    for name in MOE_MODELS {
        let f = Fixture::load(name);
        let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        let prepared = served::start(Device::Cpu, &f.dir, POOL, 512, 32).await;
        let state = prepared.state.clone();
        let models = call(
            &state,
            HttpRequest::get("/v1/models").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(
            models["data"][0]["id"],
            f.dir.to_str().unwrap(),
            "{name}: {models}"
        );
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(f.dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(
            models["data"][0]["architecture"], config["architectures"][0],
            "{name}: {models}"
        );
        assert!(
            models["data"][0]["architecture"]
                .as_str()
                .is_some_and(|a| a.starts_with("Qwen3_5Moe")),
            "{name}: {models}"
        );
        let prompts: Vec<Vec<u32>> = f
            .prompts
            .iter()
            .filter(|p| p.len() <= 128)
            .cloned()
            .collect();
        assert!(prompts.len() >= 3, "{name}");
        // All at once: chunked prefills share steps with decodes.
        let tasks: Vec<_> = prompts
            .iter()
            .map(|p| tokio::spawn(complete(state.clone(), p.clone())))
            .collect();
        for (p, t) in prompts.iter().zip(tasks) {
            let got = t.await.unwrap();
            assert_eq!(
                got,
                reference(&model, p),
                "{name}: {} prompt tokens",
                p.len()
            );
        }
        drop(prepared);
    }
}
