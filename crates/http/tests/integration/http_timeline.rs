//! `--request-timeline`: with the flag, a generation request logs one
//! `request_timeline` line when its first text goes out, with the server's
//! stamps and the engine's (one step per prefill chunk, the last one
//! sampling) in time order; without it, none.

use crate::common;

use std::time::Duration;

use crate::log_capture::{capture_logs, captured};
use common::*;
use gdn_http::api::timeline::{LINE_TAG, LOG_TARGET};
use serde_json::{json, Value as Json};

/// The timeline lines of request `id` (the X-Request-Id sent).
fn lines_of(id: &str) -> Vec<Json> {
    captured(|target, _| target == LOG_TARGET)
        .iter()
        .filter_map(|l| l.strip_prefix(LINE_TAG)?.trim().parse::<Json>().ok())
        .filter(|j| j["request"] == id)
        .collect()
}

async fn completion(s: &TestServer, id: &str, prompt: &str) -> Vec<Json> {
    let req = axum::http::Request::post("/v1/completions")
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(axum::body::Body::from(
            json!({"prompt": prompt, "max_tokens": 4, "stream": true}).to_string(),
        ))
        .unwrap();
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let resp = gdn_http::http::router(s.state.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    sse_json(&bytes)
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep green forest where nobody can find it again.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_logs_one_line_per_request_with_every_stamp_in_order() {
    capture_logs();
    let s = server_with(
        "Hello there, friend.",
        None,
        Duration::from_millis(3),
        |c| {
            c.request_timeline = true;
            c.prefix_cache.enabled = false;
            c.max_num_seqs = 4;
            c.max_num_batched_tokens = 16;
        },
    );
    let prompt_tokens = s.state.model.encode(PROMPT, true).unwrap().len();
    assert!(
        prompt_tokens > 32,
        "{prompt_tokens}: want three chunks or more"
    );
    let chunks = completion(&s, "timeline-on", PROMPT).await;
    assert!(!chunks.is_empty());
    let lines = lines_of("timeline-on");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    println!("{line}");
    assert_eq!(line["prompt_tokens"], prompt_tokens);
    assert_eq!(line["cached_tokens"], 0);
    assert_eq!(line["tokens_before_text"], 1);
    let stamps: Vec<(String, f64)> = line["ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
        .collect();
    let names: Vec<&str> = stamps.iter().map(|(n, _)| n.as_str()).collect();
    // The order the work happens in (engine_submitted is stamped inside
    // submit, before the server's "submitted").
    let want = [
        "body_read",
        "decoded",
        "tokenized",
        "engine_submitted",
        "submitted",
        "first_token_sent",
        "first_token_received",
        "first_text",
    ];
    let positions: Vec<usize> = want
        .iter()
        .map(|w| {
            names
                .iter()
                .position(|n| n == w)
                .unwrap_or_else(|| panic!("{w} missing in {names:?}"))
        })
        .collect();
    assert!(positions.windows(2).all(|p| p[0] < p[1]), "{names:?}");
    for other in ["engine_accepted", "first_scheduled"] {
        assert!(names.contains(&other), "{other} missing in {names:?}");
    }
    assert!(stamps.windows(2).all(|w| w[0].1 <= w[1].1), "{stamps:?}");
    // One step per chunk of at most 16 tokens, covering the prompt, the
    // last one sampling; each step took at least the scripted delay.
    let steps = line["steps"].as_array().unwrap();
    assert_eq!(steps.len(), prompt_tokens.div_ceil(16), "{steps:?}");
    let mut covered = 0;
    for (i, st) in steps.iter().enumerate() {
        assert_eq!(st["start"], covered);
        covered += st["len"].as_u64().unwrap() as usize;
        assert_eq!(st["sampled"], i + 1 == steps.len());
        let exec = st["exec_end"].as_f64().unwrap() - st["exec_start"].as_f64().unwrap();
        assert!(exec >= 3.0, "{st}");
    }
    assert_eq!(covered, prompt_tokens);
    let first_text = stamps.iter().find(|(n, _)| n == "first_text").unwrap().1;
    let last_exec = steps.last().unwrap()["exec_end"].as_f64().unwrap();
    assert!(last_exec <= first_text);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_nothing_is_logged() {
    capture_logs();
    let s = server("Hello there.", None);
    assert!(!completion(&s, "timeline-off", PROMPT).await.is_empty());
    assert!(lines_of("timeline-off").is_empty());
    wait_idle(&s).await;
}
