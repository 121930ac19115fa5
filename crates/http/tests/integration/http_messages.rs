//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`)
//! over the scripted engine: content blocks from the chat output parser,
//! stop reasons, the event stream's order and shapes, token counts and
//! Anthropic-shaped errors.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use gdn_http::http::router;
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

const TOOL_OUTPUT: &str = "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

/// Posts as the `anthropic` SDK does: its key and version headers.
async fn post_anthropic(
    s: &TestServer,
    path: &str,
    body: &str,
    content_type: &str,
) -> (StatusCode, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", content_type)
        .header("x-api-key", "sk-ant-anything")
        .header("anthropic-version", "2023-06-01")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(s.state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

async fn messages(s: &TestServer, body: Json) -> (StatusCode, Json) {
    let (status, bytes) =
        post_anthropic(s, "/v1/messages", &body.to_string(), "application/json").await;
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

fn user(text: &str) -> Json {
    json!([{"role": "user", "content": text}])
}

/// The request of a plain answer: thinking off, so the output is text.
fn plain(extra: Json) -> Json {
    let mut body = json!({"model": "demo", "max_tokens": 40, "messages": user("Hi"),
        "thinking": {"type": "disabled"}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn weather_tool() -> Json {
    json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_answer() {
    let s = server("Hello there!", None);
    let (status, v) = messages(&s, plain(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "demo");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Hello there!"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Json::Null);
    let usage = &v["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert!(usage["output_tokens"].as_u64().unwrap() > 0);
    assert_eq!(usage["cache_read_input_tokens"], 0);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_a_thinking_block_before_the_text() {
    let s = server("Let me think.\n</think>\n\nParis.", None);
    let body = json!({"model": "demo", "max_tokens": 40, "messages": user("Capital of France?"),
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u1"}});
    let (status, v) = messages(&s, body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": "Let me think.\n", "signature": ""},
               {"type": "text", "text": "Paris."}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_prompt_is_rendered_as_a_string_or_as_blocks() {
    let s = server("ok", None);
    let count = |system: Json| {
        let mut body = json!({"model": "demo", "messages": user("Hi")});
        if !system.is_null() {
            body["system"] = system;
        }
        let s = &s;
        async move {
            let (status, bytes) = post_anthropic(
                s,
                "/v1/messages/count_tokens",
                &body.to_string(),
                "application/json",
            )
            .await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{}",
                String::from_utf8_lossy(&bytes)
            );
            let v: Json = serde_json::from_slice(&bytes).unwrap();
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let none = count(Json::Null).await;
    let text = count(json!("You are terse and precise.")).await;
    let blocks = count(
        json!([{"type": "text", "text": "You are terse and precise.",
        "cache_control": {"type": "ephemeral"}}]),
    )
    .await;
    assert!(text > none, "{text} <= {none}");
    assert_eq!(text, blocks);
    // The count is the prompt a generation submits.
    let (_, v) = messages(
        &s,
        plain(json!({"system": "You are terse and precise.", "thinking": null})),
    )
    .await;
    assert_eq!(v["usage"]["input_tokens"].as_u64().unwrap(), text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_use_round_trip() {
    let s = server(TOOL_OUTPUT, None);
    let first = json!({"model": "demo", "max_tokens": 200, "messages": user("Weather in Paris?"),
        "tools": weather_tool()});
    let (status, v) = messages(&s, first).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stop_reason"], "tool_use");
    let content = v["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[0]["type"], "thinking");
    let call = &content[1];
    assert_eq!(call["type"], "tool_use");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["input"], json!({"city": "Paris", "days": 3}));
    // The client runs the tool and sends the result back.
    let second = json!({"model": "demo", "max_tokens": 200, "tools": weather_tool(), "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": v["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
            "content": [{"type": "text", "text": "Sunny, 24C"}]}]}]});
    let (status, v2) = messages(&s, second).await;
    assert_eq!(status, StatusCode::OK, "{v2}");
    assert!(
        v2["usage"]["input_tokens"].as_u64() > v["usage"]["input_tokens"].as_u64(),
        "the tool call and its result are in the prompt"
    );
    // A failed tool's result goes back too.
    let failed = json!({"model": "demo", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout", "is_error": true}]}]});
    let (status, _) = post_anthropic(
        &s,
        "/v1/messages/count_tokens",
        &failed.to_string(),
        "application/json",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_choice_calls_the_tool() {
    let s = server(TOOL_OUTPUT, None);
    let body = json!({"model": "demo", "max_tokens": 200, "messages": user("Weather?"),
        "tools": weather_tool(), "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (status, v) = messages(&s, body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let unknown = json!({"model": "demo", "max_tokens": 20, "messages": user("Weather?"),
        "tools": weather_tool(), "tool_choice": {"type": "tool", "name": "nope"}});
    let (status, v) = messages(&s, unknown).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequence_and_max_tokens_stop_reasons() {
    let s = server(
        "Hello world, this is a long scripted answer that goes on and on and on.",
        None,
    );
    let (status, v) = messages(&s, plain(json!({"stop_sequences": ["o w"]}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["content"], json!([{"type": "text", "text": "Hell"}]));
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "o w");
    let (status, v) = messages(
        &s,
        plain(json!({"max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 20})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Json::Null);
    assert_eq!(v["usage"]["output_tokens"], 3);
    wait_idle(&s).await;
}

/// `(event name, data)` of each event of an SSE body.
fn events(bytes: &[u8]) -> Vec<(String, Json)> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(d).unwrap());
                }
            }
            (name.expect(e), data.expect(e))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_event_order() {
    let s = server(TOOL_OUTPUT, None);
    let body = json!({"model": "demo", "max_tokens": 200, "messages": user("Weather in Paris?"),
        "tools": weather_tool(), "stream": true});
    let (status, bytes) =
        post_anthropic(&s, "/v1/messages", &body.to_string(), "application/json").await;
    assert_eq!(status, StatusCode::OK);
    let events = events(&bytes);
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            name.as_str(),
            "the event names its data's type"
        );
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut squeezed: Vec<&str> = names.clone();
    squeezed.dedup();
    assert_eq!(
        squeezed,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{names:?}"
    );
    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Json::Null);
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let thinking: String = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == 0)
        .map(|(_, d)| d["delta"]["thinking"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(thinking, "I will check.\n");
    let (_, tool_start) = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["index"] == 1)
        .unwrap();
    assert_eq!(tool_start["content_block"]["type"], "tool_use");
    assert_eq!(tool_start["content_block"]["input"], json!({}));
    let (_, tool_delta) = events
        .iter()
        .find(|(n, d)| n == "content_block_delta" && d["index"] == 1)
        .unwrap();
    assert_eq!(tool_delta["delta"]["type"], "input_json_delta");
    let input: Json =
        serde_json::from_str(tool_delta["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"city": "Paris", "days": 3}));
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "tool_use", "stop_sequence": null})
    );
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 0);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_matches_the_whole_answer() {
    let s = server("Hello there, streaming world!", None);
    let body = plain(json!({"stream": true, "stop_sequences": ["world"]}));
    let (status, bytes) =
        post_anthropic(&s, "/v1/messages", &body.to_string(), "application/json").await;
    assert_eq!(status, StatusCode::OK);
    let events = events(&bytes);
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, "Hello there, streaming ");
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "world"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_anthropics_shape() {
    let s = server("ok", None);
    let cases = [
        (
            json!({"model": "demo", "messages": user("x")}),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(json!({"model": "claude-opus"})),
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
        (
            plain(json!({"messages": []})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(json!({"messages": [{"role": "system", "content": "x"}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(
                json!({"messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            plain(json!({"tool_choice": {"type": "any"}})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
    ];
    for (body, want_status, want_type) in cases {
        let (status, v) = messages(&s, body.clone()).await;
        assert_eq!(status, want_status, "{body} -> {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], want_type, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, bytes) = post_anthropic(&s, "/v1/messages", "{not json", "application/json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (status, bytes) = post_anthropic(&s, "/v1/messages/count_tokens", "{}", "text/plain").await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (status, bytes) = post_anthropic(
        &s,
        "/v1/messages/count_tokens",
        &json!({"model": "other", "messages": user("x")}).to_string(),
        "application/json",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
}
