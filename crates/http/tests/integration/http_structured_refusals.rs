//! Constraints that compile but cannot be followed (an empty language, a
//! schema whose `$ref`s only loop, a regex or grammar past llguidance's
//! limits) are 400s naming their field before anything reaches the
//! engine, streamed or not, promptly, and are not engine errors in
//! /metrics; so are `min_tokens` and `ignore_eos` beside a constraint. A
//! choice list of thousands works.

use crate::common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::*;
use gdn_http::http::router;
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

/// The promise: a refusal within this, unoptimised build included.
const PROMPT: Duration = Duration::from_secs(1);

const PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

fn body(path: &str, fields: &Json, stream: bool) -> Json {
    let mut body = if path == "/v1/completions" {
        json!({"prompt": "hi", "max_tokens": 8})
    } else {
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    };
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    body["stream"] = json!(stream);
    body
}

/// Status, content type and body of a POST.
async fn call(s: &TestServer, path: &str, body: Json) -> (StatusCode, String, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(s.state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, content_type, bytes)
}

async fn metrics_text(s: &TestServer) -> String {
    let resp = router(s.state.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
        .parse()
        .unwrap()
}

/// Every request of `fields`, on both endpoints, streamed or not: a 400
/// JSON error (never an SSE stream) naming `param`, whose message says
/// `says`, within [`PROMPT`].
async fn refused_everywhere(s: &TestServer, fields: Json, param: &str, says: &str) {
    for path in PATHS {
        for stream in [false, true] {
            let started = Instant::now();
            let (status, content_type, bytes) = call(s, path, body(path, &fields, stream)).await;
            let took = started.elapsed();
            let text = String::from_utf8_lossy(&bytes);
            let what = format!("{path} stream={stream} {param}");
            assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {text}");
            assert!(
                content_type.starts_with("application/json"),
                "{what}: {content_type}"
            );
            let v: Json = serde_json::from_slice(&bytes).expect("a JSON error body");
            let error = &v["error"];
            assert_eq!(error["type"], "invalid_request_error", "{what}: {v}");
            assert_eq!(error["param"], param, "{what}: {v}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains(says), "{what}: {message}");
            assert!(took < PROMPT, "{what} took {took:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_no_output_can_follow_are_400s_before_any_token() {
    let s = server("ok", None);
    let cycle = json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}});
    let nothing = r"[^\s\S]";
    let empty_lark = "start: /[^\\s\\S]/";
    let huge_regex = "[a-z]?".repeat(200);
    let wide_rule: Vec<String> = (0..2000).map(|i| format!("\"c{i}\"")).collect();
    let wide_rule = format!("start: {}", wide_rule.join(" | "));
    let cases = [
        (
            json!({"guided_json": cycle}),
            "guided_json",
            "NoExtensionBias",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"$ref": "#"}}}}),
            "response_format.json_schema.schema",
            "matches no output",
        ),
        (
            json!({"guided_regex": nothing}),
            "guided_regex",
            "matches no output",
        ),
        (
            json!({"structured_outputs": {"regex": nothing}}),
            "structured_outputs.regex",
            "NoExtensionBias",
        ),
        (
            json!({"structured_outputs": {"grammar": empty_lark}}),
            "structured_outputs.grammar",
            "NoExtensionBias",
        ),
        (
            json!({"guided_regex": huge_regex}),
            "guided_regex",
            "too many expressions",
        ),
        (
            json!({"guided_grammar": wide_rule}),
            "guided_grammar",
            "max is 2000",
        ),
    ];
    for (fields, param, says) in cases {
        refused_everywhere(&s, fields, param, says).await;
    }
    assert_eq!(s.steps(), 0, "nothing reached the engine");
    // Refusals, not engine errors: no request ended in error, none ran.
    let text = metrics_text(&s).await;
    assert_eq!(
        metric(
            &text,
            "vllm:request_success_total{finished_reason=\"error\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &text,
            "vllm:request_success_total{finished_reason=\"stop\"}"
        ),
        0.0
    );
    assert_eq!(metric(&text, "gdn:structured_output_masks_total"), 0.0);
    // The server is fine afterwards.
    let (status, _, _) = call(
        &s,
        "/v1/completions",
        body("/v1/completions", &json!({}), false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_and_ignore_eos_beside_a_constraint_are_400s() {
    let s = server("ok", None);
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    for (fields, param, says) in [
        (
            json!({"guided_regex": "[a-z]+", "min_tokens": 2}),
            "min_tokens",
            "min_tokens cannot be used with guided_regex",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "ignore_eos": true}),
            "ignore_eos",
            "ignore_eos cannot be used with response_format",
        ),
    ] {
        refused_everywhere(&s, fields, param, says).await;
    }
    // A forced tool call is a constraint too.
    let fields = json!({"tools": tools, "tool_choice": "required", "min_tokens": 1});
    let path = "/v1/chat/completions";
    let (status, _, bytes) = call(&s, path, body(path, &fields, true)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["param"], "min_tokens", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool_choice"),
        "{v}"
    );
    assert_eq!(s.steps(), 0, "nothing reached the engine");
    // Their defaults written out are no conflict.
    let fields = json!({"guided_regex": "[a-z]+", "min_tokens": 0, "ignore_eos": false});
    let (status, _, bytes) = call(
        &s,
        "/v1/completions",
        body("/v1/completions", &fields, false),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_choices_and_more_are_served() {
    let s = server("c1234", None);
    for n in [1999, 2000, 5000] {
        let choices: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        for path in PATHS {
            let fields = json!({"guided_choice": choices});
            let (status, _, bytes) = call(&s, path, body(path, &fields, false)).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{n} {path}: {}",
                String::from_utf8_lossy(&bytes)
            );
            wait_idle(&s).await;
        }
        let fields = json!({"guided_choice": choices});
        let (status, _, bytes) = call(
            &s,
            "/v1/completions",
            body("/v1/completions", &fields, false),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let v: Json = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["choices"][0]["text"], "c1234", "{n}: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{n}: {v}");
        wait_idle(&s).await;
    }
    // A forced tool call's string enum is one lexeme too (a short one: the
    // tools are in the prompt, which has 2,048 tokens here).
    let output = "I will check.\n</think>\n\n<tool_call>\n<function=f>\n<parameter=unit>\nu49\n</parameter>\n</function>\n</tool_call>";
    let s = server(output, None);
    let units: Vec<String> = (0..50).map(|i| format!("u{i}")).collect();
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": units}},
        "required": ["unit"]}}}]);
    let path = "/v1/chat/completions";
    let fields = json!({"tools": tools, "tool_choice": "required", "max_tokens": 100});
    let (status, _, bytes) = call(&s, path, body(path, &fields, false)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert_eq!(
        calls[0]["function"]["arguments"], r#"{"unit": "u49"}"#,
        "{v}"
    );
    wait_idle(&s).await;
    let text = metrics_text(&s).await;
    assert_eq!(
        metric(
            &text,
            "vllm:request_success_total{finished_reason=\"error\"}"
        ),
        0.0
    );
}
