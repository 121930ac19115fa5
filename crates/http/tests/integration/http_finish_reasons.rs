//! `vllm:request_success_total{finished_reason}` and
//! `gdn:requests_aborted_total` for every way a request ends, through the
//! HTTP layer over the real engine with the scripted executor: a stop
//! string (found by the server, which ends the engine request itself), a
//! stop token, EOS, the length limit, a client that goes away, and a step
//! that fails.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use gdn_http::http::router;
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

/// The value of `series` in the server's /metrics text.
async fn metric(s: &TestServer, series: &str) -> f64 {
    let resp = router(s.state.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
        .parse()
        .unwrap()
}

async fn finished(s: &TestServer, reason: &str) -> f64 {
    metric(
        s,
        &format!("vllm:request_success_total{{finished_reason=\"{reason}\"}}"),
    )
    .await
}

/// A completion's finish reason and stop reason.
async fn complete(s: &TestServer, request: Json) -> (Json, Json) {
    let (status, body) = post(s, "/v1/completions", request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Json = serde_json::from_slice(&body).unwrap();
    let choice = &v["choices"][0];
    (
        choice["finish_reason"].clone(),
        choice["stop_reason"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_finish_reason_is_counted_under_its_name() {
    let long = "Hello world, this is a long scripted answer. ".repeat(20);
    let s = server(&long, None);
    let tokens = s.script.lock().unwrap().tokens.clone();

    // A stop string: the server finds it and ends the engine request.
    let (reason, stop) = complete(
        &s,
        json!({"prompt": "x", "stop": ["o w"], "max_tokens": 60}),
    )
    .await;
    assert_eq!((reason, stop), (json!("stop"), json!("o w")));
    wait_idle(&s).await;
    assert_eq!(finished(&s, "stop").await, 1.0);
    assert_eq!(finished(&s, "abort").await, 0.0);

    // A stop token: the engine stops on it.
    let stop_token = tokens[4];
    assert!(!tokens[..4].contains(&stop_token));
    let (reason, stop) = complete(
        &s,
        json!({"prompt": "x", "stop_token_ids": [stop_token], "max_tokens": 60}),
    )
    .await;
    assert_eq!((reason, stop), (json!("stop"), json!(stop_token)));

    // EOS: a short script ends in the tokenizer's <|im_end|>.
    let short = server("Hi there", None);
    let (reason, stop) = complete(&short, json!({"prompt": "x", "max_tokens": 60})).await;
    assert_eq!((reason, stop), (json!("stop"), Json::Null));
    assert_eq!(finished(&short, "stop").await, 1.0);

    // The length limit.
    let (reason, _) = complete(&s, json!({"prompt": "x", "max_tokens": 3})).await;
    assert_eq!(reason, json!("length"));

    // A client that goes away mid-stream.
    let request = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": "x", "max_tokens": 500, "stream": true}).to_string(),
        ))
        .unwrap();
    let resp = router(s.state.clone()).oneshot(request).await.unwrap();
    let mut body = resp.into_body();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    wait_idle(&s).await;

    // A step that fails on the device.
    s.script.lock().unwrap().fail_step = Some(s.steps());
    let (status, _) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    wait_idle(&s).await;

    // The engine thread counts an abort at its next loop.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while finished(&s, "abort").await < 1.0 {
        assert!(std::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(finished(&s, "stop").await, 2.0);
    assert_eq!(finished(&s, "length").await, 1.0);
    assert_eq!(finished(&s, "abort").await, 1.0);
    assert_eq!(finished(&s, "error").await, 1.0);
    assert_eq!(metric(&s, "gdn:requests_aborted_total").await, 1.0);
}
