//! Structured outputs and forced tool calls over HTTP (the scripted
//! executor: the output is fixed, so these check the request side and the
//! response path; the engine compiles and enforces each constraint, so the
//! script is one the constraint accepts): every field form is accepted on
//! both endpoints, conflicts and bad shapes are 400s naming the field with
//! the compiler's message, a forced tool call answers as `tool_calls`.

use crate::common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value as Json};

const TOOL_OUTPUT: &str = "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

fn tools() -> Json {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}])
}

fn with(mut body: Json, fields: &Json) -> Json {
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn chat(fields: Json) -> Json {
    with(
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        &fields,
    )
}

fn completion(fields: Json) -> Json {
    with(json!({"prompt": "hi", "max_tokens": 4}), &fields)
}

async fn error_of(s: &TestServer, path: &str, body: Json) -> Json {
    let (status, bytes) = post(s, path, body.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}");
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    v["error"].clone()
}

/// Every constraint form with a scripted output it accepts (the engine
/// compiles and enforces the constraint: an output it refuses would fail
/// the request).
fn constraint_forms() -> Vec<(Json, &'static str)> {
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let object = "{\"a\": 1}";
    vec![
        (json!({"response_format": {"type": "text"}}), object),
        (json!({"response_format": {"type": "json_object"}}), object),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": schema, "strict": true}}}),
            object,
        ),
        (json!({"structured_outputs": {"json": schema}}), object),
        (
            json!({"structured_outputs": {"json": schema.to_string()}}),
            object,
        ),
        (json!({"structured_outputs": {"regex": "[0-9]{3}"}}), "123"),
        (
            json!({"structured_outputs": {"choice": ["yes", "no"]}}),
            "yes",
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"a\" | \"b\""}}),
            "a",
        ),
        (json!({"structured_outputs": {"json_object": true}}), object),
        (json!({"guided_json": schema}), object),
        (json!({"guided_regex": "[a-z]+"}), "abc"),
        (json!({"guided_choice": ["red", "green"]}), "red"),
        (json!({"guided_grammar": "start: /[0-9]+/"}), "42"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_constraint_form_is_accepted_on_both_endpoints() {
    for (form, output) in constraint_forms() {
        let s = server(output, None);
        for (path, body) in [
            ("/v1/chat/completions", chat(form.clone())),
            ("/v1/completions", completion(form.clone())),
        ] {
            let (status, bytes) = post(&s, path, body).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{path} {form}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        wait_idle(&s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_bad_shapes_are_400s_naming_the_field() {
    let s = server("ok", None);
    let cases = [
        (
            json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
            "guided_regex",
            "response_format, guided_regex",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
            "structured_outputs.choice",
            "structured_outputs.regex, structured_outputs.choice",
        ),
        (
            json!({"guided_json": {}, "guided_grammar": "start: \"a\""}),
            "guided_grammar",
            "guided_json, guided_grammar",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            "'xml'",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
            "required",
        ),
        (json!({"guided_json": "[1]"}), "guided_json", "an array"),
        (
            json!({"guided_json": 7}),
            "guided_json",
            "a JSON schema must be",
        ),
        (json!({"guided_choice": []}), "guided_choice", "non-empty"),
        (json!({"guided_choice": "yes"}), "guided_choice", "sequence"),
        (json!({"guided_regex": 5}), "guided_regex", "string"),
        (
            json!({"structured_outputs": {"grammar": ["x"]}}),
            "structured_outputs.grammar",
            "string",
        ),
        // A key it does not know, or none: refused, never unconstrained.
        (
            json!({"structured_outputs": {"yaml": "a: 1"}}),
            "structured_outputs.yaml",
            "unknown field `yaml`",
        ),
        (
            json!({"structured_outputs": {}}),
            "structured_outputs",
            "names no constraint",
        ),
    ];
    for (fields, param, says) in cases {
        for (path, body) in [
            ("/v1/chat/completions", chat(fields.clone())),
            ("/v1/completions", completion(fields.clone())),
        ] {
            let error = error_of(&s, path, body).await;
            assert_eq!(error["param"], param, "{path} {fields}: {error}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains(says), "{path} {fields}: {message}");
        }
    }
    // The server is fine afterwards.
    let (status, _) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_rules() {
    let s = server("ok", None);
    for (fields, param, says) in [
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
            "'nope'",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice",
            "no tools",
        ),
        (
            json!({"tools": tools(), "tool_choice": "sometimes"}),
            "tool_choice",
            "'required'",
        ),
        (
            json!({"tools": tools(), "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
            "tool_choice, response_format",
        ),
    ] {
        let error = error_of(&s, "/v1/chat/completions", chat(fields.clone())).await;
        assert_eq!(error["param"], param, "{fields}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(says), "{fields}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_over_the_limit_are_400s_before_the_engine() {
    let s = server_with("ok", None, std::time::Duration::ZERO, |c| {
        c.max_constraint_bytes = 200
    });
    let long = "a".repeat(201);
    let error = error_of(
        &s,
        "/v1/completions",
        completion(json!({"guided_regex": long})),
    )
    .await;
    assert_eq!(error["param"], "guided_regex");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("--max-constraint-bytes"));
    // A forced call's grammar is built from the tools: it counts too.
    let many: Vec<Json> = (0..20)
        .map(|i| json!({"type": "function", "function": {"name": format!("tool_{i}")}}))
        .collect();
    let error = error_of(
        &s,
        "/v1/chat/completions",
        chat(json!({"tools": many, "tool_choice": "required"})),
    )
    .await;
    assert_eq!(error["param"], "tools");
    assert_eq!(s.steps(), 0, "nothing reached the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_answers_as_tool_calls() {
    let s = server(TOOL_OUTPUT, None);
    for tool_choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let fields = json!({"tools": tools(), "tool_choice": tool_choice, "max_tokens": 200});
        let (status, body) = post(&s, "/v1/chat/completions", chat(fields.clone())).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let v: Json = serde_json::from_slice(&body).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(
            calls[0]["function"]["arguments"],
            r#"{"city": "Paris", "days": 3}"#
        );
        // Streamed: the call is a tool_calls delta, the finish reason the same.
        let (status, body) = post(
            &s,
            "/v1/chat/completions",
            with(chat(fields), &json!({"stream": true})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let chunks = sse_json(&body);
        let calls: Vec<Json> = chunks
            .iter()
            .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
            .flatten()
            .collect();
        assert_eq!(calls.len(), 1, "{chunks:?}");
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }
    wait_idle(&s).await;
}

/// The compiler's refusal is a 400 naming the field, with its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_schema_regex_or_grammar_is_a_400_with_the_compilers_message() {
    let s = server("ok", None);
    for (fields, param) in [
        (json!({"guided_regex": "(unclosed"}), "guided_regex"),
        (
            json!({"structured_outputs": {"grammar": "start: undefined_rule"}}),
            "structured_outputs.grammar",
        ),
        (
            json!({"guided_json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}),
            "guided_json",
        ),
    ] {
        for (path, body) in [
            ("/v1/chat/completions", chat(fields.clone())),
            ("/v1/completions", completion(fields.clone())),
        ] {
            let error = error_of(&s, path, body).await;
            assert_eq!(error["param"], param, "{path} {fields}: {error}");
            let message = error["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("Invalid {param}: ")),
                "{message}"
            );
            assert!(message.len() > format!("Invalid {param}: ").len() + 3);
        }
    }
    assert_eq!(s.steps(), 0, "nothing reached the engine");
}
