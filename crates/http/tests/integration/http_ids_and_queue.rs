//! `X-Request-Id` (accepted or generated, echoed in the header, the body's
//! `id` and the request's log lines) and `--max-num-queued-tokens` (503 with
//! Retry-After and its own rejection reason), over the real engine with the
//! scripted executor.

use crate::common;

use std::time::Duration;

use crate::log_capture::{capture_logs, captured};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use common::*;
use gdn_http::http::router;
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

fn lines_with(needle: &str) -> Vec<String> {
    captured(|_, line| line.contains(needle))
}

fn request(path: &str, body: &Json, request_id: Option<&str>) -> Request<Body> {
    let mut req = Request::post(path).header("content-type", "application/json");
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

async fn call(
    s: &TestServer,
    path: &str,
    body: Json,
    request_id: Option<&str>,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let resp = router(s.state.clone())
        .oneshot(request(path, &body, request_id))
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes().to_vec();
    (parts.status, parts.headers, bytes)
}

fn echoed(headers: &HeaderMap) -> String {
    headers["x-request-id"].to_str().unwrap().to_string()
}

fn chat(stream: bool) -> Json {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_request_id_names_the_response_and_its_log_lines() {
    capture_logs();
    let s = server("one two three", None);
    let (status, headers, body) =
        call(&s, "/v1/chat/completions", chat(false), Some("client-7f3a")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed(&headers), "client-7f3a");
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["id"], "chatcmpl-client-7f3a");
    // Streaming: the header comes with the 200, every chunk carries the id.
    let stream = json!({"prompt": "x", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, headers, body) = call(&s, "/v1/completions", stream, Some("client-8b")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed(&headers), "client-8b");
    let chunks = sse_json(&body);
    assert!(chunks.len() >= 2, "{chunks:?}");
    assert!(
        chunks.iter().all(|c| c["id"] == "cmpl-client-8b"),
        "{chunks:?}"
    );
    // The log lines of the request name it: its submission and its error.
    assert!(
        lines_with("request client-7f3a: engine requests").len() == 1,
        "{:?}",
        lines_with("client-7f3a")
    );
    let wrong_model = json!({"model": "other", "prompt": "x"});
    let (status, headers, _) = call(&s, "/v1/completions", wrong_model, Some("client-404")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(echoed(&headers), "client-404");
    let logged = lines_with("request client-404:");
    assert!(
        logged.len() == 1 && logged[0].contains("/v1/completions") && logged[0].contains("404"),
        "{logged:?}"
    );
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_header_each_request_gets_a_fresh_id_used_everywhere() {
    let s = server("one two three", None);
    let mut seen = Vec::new();
    for stream in [false, true] {
        let (status, headers, body) = call(&s, "/v1/chat/completions", chat(stream), None).await;
        assert_eq!(status, StatusCode::OK);
        let id = echoed(&headers);
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        let ids: Vec<Json> = if stream {
            sse_json(&body).iter().map(|c| c["id"].clone()).collect()
        } else {
            vec![serde_json::from_slice::<Json>(&body).unwrap()["id"].clone()]
        };
        assert!(
            ids.iter().all(|i| *i == format!("chatcmpl-{id}")),
            "{ids:?} vs {id}"
        );
        seen.push(id);
    }
    assert_ne!(seen[0], seen[1]);
    // Other routes echo it too.
    let resp = router(s.state.clone())
        .oneshot(Request::get("/health").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"].len(), 32);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_that_cannot_be_echoed_is_a_400() {
    let s = server("one", None);
    let too_long = "a".repeat(gdn_http::api::MAX_REQUEST_ID_LEN + 1);
    for bad in ["has space", "", too_long.as_str()] {
        let (status, headers, body) =
            call(&s, "/v1/chat/completions", chat(false), Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert!(headers.get("x-request-id").is_none());
        let v: Json = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_request_id");
        assert_eq!(v["error"]["param"], "X-Request-Id");
        assert!(v["error"]["message"].as_str().unwrap().contains("256"));
    }
    // The longest accepted.
    let longest = "b".repeat(gdn_http::api::MAX_REQUEST_ID_LEN);
    let (status, headers, _) = call(&s, "/v1/chat/completions", chat(false), Some(&longest)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed(&headers), longest);
    wait_idle(&s).await;
}

/// `gdn:http_rejections_total{reason=...}` from /metrics.
async fn rejections(s: &TestServer, reason: &str) -> u64 {
    let resp = router(s.state.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let key = format!("gdn:http_rejections_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_prompt_tokens_over_the_limit_are_a_503_with_retry_after() {
    // One request runs at a time (slow steps); the queue holds 8 prompt tokens.
    let long = "word ".repeat(300);
    let s = server_with(&long, None, Duration::from_millis(5), |c| {
        c.max_num_seqs = 1;
        c.max_num_queued_tokens = Some(8);
    });
    let app = router(s.state.clone());
    let streaming = |ids: &[u32]| {
        request(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 500, "stream": true}),
            None,
        )
    };
    let running = app.clone().oneshot(streaming(&[1, 2, 3])).await.unwrap();
    for _ in 0..400 {
        if s.state.engine.stats().running == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = app
        .clone()
        .oneshot(streaming(&[4, 5, 6, 7, 8]))
        .await
        .unwrap();
    assert_eq!(s.state.engine.queued_tokens(), 5);
    // 5 queued + 5 more > 8.
    let five = json!({"prompt": [9, 10, 11, 12, 13], "max_tokens": 2});
    let (status, headers, body) = call(&s, "/v1/completions", five.clone(), Some("q-1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(echoed(&headers), "q-1");
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "queued_tokens_exceeded", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("--max-num-queued-tokens") && message.contains(" 8 "),
        "{message}"
    );
    assert_eq!(rejections(&s, "queued_tokens_exceeded").await, 1);
    assert_eq!(rejections(&s, "server_overloaded").await, 0);
    // Three more tokens fit (5 + 3 = 8).
    let three = json!({"prompt": [9, 10, 11], "max_tokens": 2, "stream": true});
    let fits = app
        .clone()
        .oneshot(request("/v1/completions", &three, None))
        .await
        .unwrap();
    assert_eq!(fits.status(), StatusCode::OK);
    assert_eq!(s.state.engine.queued_tokens(), 8);
    // Once the queue empties, the refused request goes through.
    drop((running, queued, fits));
    wait_idle(&s).await;
    assert_eq!(s.state.engine.queued_tokens(), 0);
    let (status, _, _) = call(&s, "/v1/completions", five, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_within_the_slots_is_served_and_past_slots_plus_queue_is_a_503() {
    // The scripted executor has 8 state slots; two more requests may wait.
    let long = "word ".repeat(300);
    let s = server_with(&long, None, Duration::from_millis(5), |c| {
        c.max_num_queued_reqs = 2;
    });
    let app = router(s.state.clone());
    let streaming = json!({"prompt": [1, 2, 3], "max_tokens": 200, "stream": true});
    // Ten at once: eight run, two wait.
    let burst = (0..10).map(|_| {
        app.clone()
            .oneshot(request("/v1/completions", &streaming, None))
    });
    let held = futures_util::future::join_all(burst).await;
    for resp in &held {
        assert_eq!(resp.as_ref().unwrap().status(), StatusCode::OK);
    }
    let (status, headers, body) = call(&s, "/v1/completions", streaming.clone(), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "server_overloaded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-num-queued-reqs"),
        "{v}"
    );
    assert_eq!(rejections(&s, "server_overloaded").await, 1);
    drop(held);
    wait_idle(&s).await;
}
