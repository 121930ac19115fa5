//! Chat requests the server refuses before rendering: a `tool` message
//! without `tool_call_id`, and any chat request to a model without a chat
//! template (a base model, which is still served for completions).

use crate::common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value as Json};

fn error_of(status: StatusCode, body: &[u8]) -> (StatusCode, Json) {
    let v: Json = serde_json::from_slice(body).unwrap();
    (status, v["error"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_message_without_its_call_id_is_a_400_naming_the_field() {
    let s = server("one", None);
    let messages = json!([
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "multiply", "arguments": "{\"a\": 6, \"b\": 7}"}}]},
        {"role": "tool", "content": "42"},
    ]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 2}),
        ),
        ("/tokenize", json!({"messages": messages})),
    ] {
        let (status, body) = post(&s, path, body).await;
        let (status, error) = error_of(status, &body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["param"], "messages[2].tool_call_id", "{path}");
        assert_eq!(error["code"], "missing_required_parameter", "{path}");
    }
    // With the id, both go through.
    let mut answered = messages.clone();
    answered[2]["tool_call_id"] = json!("call_1");
    let (status, body) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": answered, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, _) = post(&s, "/tokenize", json!({"messages": answered})).await;
    assert_eq!(status, StatusCode::OK);
}

/// A copy of the demo checkpoint with no chat template anywhere.
fn base_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(demo_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        if name == "chat_template.jinja" {
            continue;
        }
        std::fs::copy(&path, dir.path().join(name)).unwrap();
    }
    let config_path = dir.path().join("tokenizer_config.json");
    let mut config: Json = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    assert!(config
        .as_object_mut()
        .unwrap()
        .remove("chat_template")
        .is_some());
    std::fs::write(&config_path, config.to_string()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_model_serves_completions_and_refuses_chat_naming_the_flag() {
    let dir = base_model();
    let s = server_with("one two", None, std::time::Duration::ZERO, |c| {
        c.model_dir = dir.path().to_path_buf()
    });
    assert!(s.state.model.template.is_none());
    let (status, body) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, _) = post(&s, "/tokenize", json!({"prompt": "x"})).await;
    assert_eq!(status, StatusCode::OK);
    let messages = json!([{"role": "user", "content": "hi"}]);
    for (path, body) in [
        ("/v1/chat/completions", json!({"messages": messages})),
        ("/tokenize", json!({"messages": messages})),
    ] {
        let (status, body) = post(&s, path, body).await;
        let (status, error) = error_of(status, &body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["code"], "no_chat_template", "{path}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("--chat-template"),
            "{error}"
        );
    }
    // --chat-template gives it one.
    let template = demo_dir().join("chat_template.jinja");
    let s = server_with("one two", None, std::time::Duration::ZERO, |c| {
        c.model_dir = dir.path().to_path_buf();
        c.chat_template = Some(template);
    });
    let (status, _) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_generation_route_ignores_the_others_fields() {
    // As unknown fields are ignored, so are the other endpoint's, whatever
    // their value (the OpenAPI document does not list them there).
    let s = server("one", None);
    let (status, body) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2, "messages": {"not": "a list"},
               "tools": 5, "max_completion_tokens": "many", "top_logprobs": -1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, body) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
               "prompt": {"not": "a prompt"}, "echo": "yes", "suffix": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    // Its own fields are still checked, with their path.
    let (status, body) = post(&s, "/v1/completions", json!({"prompt": {"x": 1}})).await;
    let (status, error) = error_of(status, &body);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "prompt", "{error}");
}
