//! `POST /v1/responses` against the scripted engine: the response object
//! and its output items (reasoning, message, function calls), items and
//! instructions as input, a tool call continued with its output through
//! `previous_response_id`, `text.format`, `max_output_tokens` as an
//! incomplete response, the typed event stream, and the refusals.

use crate::common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value as Json};

const TOOL_OUTPUT: &str = "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
const ANSWER: &str = "Let me think.\n</think>\n\nIt is sunny.";

fn tools() -> Json {
    json!([{"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]},
        "strict": true}])
}

async fn ok(s: &TestServer, body: Json) -> Json {
    let (status, bytes) = post(s, "/v1/responses", body.clone()).await;
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{body} -> {v}");
    v
}

async fn error(s: &TestServer, body: Json, want: StatusCode) -> Json {
    let (status, bytes) = post(s, "/v1/responses", body.clone()).await;
    let v: Json = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, want, "{body} -> {v}");
    let e = &v["error"];
    for field in ["message", "type", "param", "code"] {
        assert!(e.get(field).is_some(), "{v}");
    }
    e.clone()
}

fn message_text(v: &Json) -> String {
    let items = v["output"].as_array().unwrap();
    let message = items.iter().find(|i| i["type"] == "message").unwrap();
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"][0]["type"], "output_text");
    message["content"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_input_answers_a_response_object() {
    let s = server(ANSWER, None);
    let v = ok(&s, json!({"model": "demo", "input": "Weather in Paris?"})).await;
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "demo");
    assert!(v["created_at"].as_u64().unwrap() > 0);
    assert_eq!(v["incomplete_details"], Json::Null);
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(output[0]["content"][0]["text"], "Let me think.\n");
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["status"], "completed");
    assert!(output[1]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(message_text(&v), "It is sunny.");
    let usage = &v["usage"];
    let (input, out) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && out > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), input + out);
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    let reasoning = usage["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(reasoning > 0 && reasoning < out, "{usage}");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_and_instructions_become_the_chat_prompt() {
    let s = server(ANSWER, None);
    let plain = ok(&s, json!({"input": "Weather in Paris?"})).await;
    let items = ok(
        &s,
        json!({
            "instructions": "Answer in one short sentence.",
            "input": [
                {"type": "message", "role": "developer", "content": "Be kind."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
                {"role": "user", "content": "And tomorrow?"},
            ],
        }),
    )
    .await;
    assert_eq!(items["instructions"], "Answer in one short sentence.");
    assert!(
        items["usage"]["input_tokens"].as_u64() > plain["usage"]["input_tokens"].as_u64(),
        "{items}"
    );
    assert_eq!(message_text(&items), "It is sunny.");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_call_and_its_output_continue_the_conversation() {
    let s = server(TOOL_OUTPUT, None);
    let first = ok(
        &s,
        json!({"input": "Weather in Paris?", "tools": tools(), "tool_choice": "auto"}),
    )
    .await;
    assert_eq!(first["status"], "completed");
    let output = first["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{first}");
    assert_eq!(output[0]["type"], "reasoning");
    let call = &output[1];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], r#"{"city": "Paris", "days": 3}"#);
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    assert_eq!(first["tools"][0]["name"], "get_weather");

    // The tool's result, continuing the stored response.
    let follow = json!({
        "previous_response_id": first["id"],
        "tools": tools(),
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 24 C"}],
    });
    let second = ok(&s, follow).await;
    assert_eq!(second["previous_response_id"], first["id"]);
    assert!(
        second["usage"]["input_tokens"].as_u64().unwrap()
            > first["usage"]["input_tokens"].as_u64().unwrap()
                + first["usage"]["output_tokens"].as_u64().unwrap() / 2,
        "{second}"
    );

    // The same turn sent as items, without a stored response.
    let items = json!({
        "tools": tools(),
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I will check."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24 C"},
        ],
    });
    let third = ok(&s, items).await;
    assert_eq!(third["status"], "completed");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_and_required_tool_choices_are_accepted() {
    let s = server(TOOL_OUTPUT, None);
    for choice in [
        json!("required"),
        json!({"type": "function", "name": "get_weather"}),
    ] {
        let v = ok(
            &s,
            json!({"input": "Weather?", "tools": tools(), "tool_choice": choice}),
        )
        .await;
        let output = v["output"].as_array().unwrap();
        assert!(output.iter().any(|i| i["type"] == "function_call"), "{v}");
    }
    let e = error(
        &s,
        json!({"input": "Weather?", "tools": tools(), "tool_choice": {"type": "function", "name": "nope"}}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "tool_choice.name", "{e}");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_format_json_schema_is_a_structured_output() {
    let object = "{\"a\": 1}";
    let s = server(object, None);
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    for format in [
        json!({"type": "json_schema", "name": "A", "schema": schema, "strict": true}),
        json!({"type": "json_object"}),
        json!({"type": "text"}),
    ] {
        let body = json!({"input": "Give me a.", "text": {"format": format},
            "reasoning": {"effort": "low"}, "chat_template_kwargs": {"enable_thinking": false}});
        let v = ok(&s, body).await;
        assert_eq!(message_text(&v), object, "{v}");
        assert_eq!(v["text"]["format"], format);
    }
    // A schema the compiler refuses is chat's 400.
    let bad = json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "A", "schema": {"type": "nonsense"}}}});
    error(&s, bad, StatusCode::BAD_REQUEST).await;
    let e = error(
        &s,
        json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "A"}}}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "text.format.schema");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_output_tokens_makes_an_incomplete_response() {
    let s = server(ANSWER, None);
    let v = ok(&s, json!({"input": "Weather?", "max_output_tokens": 2})).await;
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["max_output_tokens"], 2);
    assert_eq!(v["usage"]["output_tokens"], 2);
    assert_eq!(v["output"][0]["status"], "incomplete");
    let e = error(
        &s,
        json!({"input": "x", "max_output_tokens": 0}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "max_output_tokens");
    wait_idle(&s).await;
}

fn events(bytes: &[u8]) -> Vec<Json> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(!text.contains("[DONE]"));
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut lines = e.lines();
            let kind = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            let v: Json = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], kind);
            v
        })
        .collect()
}

fn kinds(events: &[Json]) -> Vec<&str> {
    let mut kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    kinds.dedup();
    kinds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_sends_the_typed_events_in_order() {
    let s = server(ANSWER, None);
    let (status, bytes) = post(
        &s,
        "/v1/responses",
        json!({"input": "Weather?", "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events = events(&bytes);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "It is sunny.");
    let done = events.last().unwrap();
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(message_text(&done["response"]), "It is sunny.");
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[0]["response"]["id"], done["response"]["id"]);
    let first_delta = events
        .iter()
        .find(|e| e["type"] == "response.output_text.delta")
        .unwrap();
    let item_id = &first_delta["item_id"];
    assert_eq!(done["response"]["output"][1]["id"], *item_id);

    // The streamed response is stored: it can be continued.
    let next = ok(
        &s,
        json!({"input": "Thanks!", "previous_response_id": done["response"]["id"]}),
    )
    .await;
    assert_eq!(next["status"], "completed");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_a_function_call() {
    let s = server(TOOL_OUTPUT, None);
    let (status, bytes) = post(
        &s,
        "/v1/responses",
        json!({"input": "Weather?", "stream": true, "tools": tools()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events = events(&bytes);
    let kinds = kinds(&events);
    let tail = &kinds[kinds.len() - 5..];
    assert_eq!(
        tail,
        [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let done = events
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done["arguments"], r#"{"city": "Paris", "days": 3}"#);
    let last = events.last().unwrap();
    assert_eq!(last["response"]["output"][1]["type"], "function_call");
    assert_eq!(last["response"]["output"][1]["id"], done["item_id"]);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_must_name_a_stored_response() {
    let s = server(ANSWER, None);
    let e = error(
        &s,
        json!({"input": "x", "previous_response_id": "resp_unknown"}),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(e["code"], "previous_response_not_found");
    assert_eq!(e["param"], "previous_response_id");
    let unstored = ok(&s, json!({"input": "x", "store": false})).await;
    assert_eq!(unstored["store"], false);
    let e = error(
        &s,
        json!({"input": "y", "previous_response_id": unstored["id"]}),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(e["code"], "previous_response_not_found");
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_honoured_is_refused() {
    let s = server(ANSWER, None);
    let cases = [
        (json!({}), "input"),
        (json!({"input": 3}), "input"),
        (json!({"input": []}), "input"),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"role": "tool", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"type": "function_call_output", "output": "x"}]}),
            "input[0].call_id",
        ),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "web_search"}}),
            "tool_choice",
        ),
        (json!({"input": "x", "temperature": -1}), "temperature"),
        (json!({"input": "x", "stream": "yes"}), "stream"),
    ];
    for (body, param) in cases {
        let e = error(&s, body.clone(), StatusCode::BAD_REQUEST).await;
        assert_eq!(e["param"], param, "{body} -> {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    error(
        &s,
        json!({"input": "x", "model": "other"}),
        StatusCode::NOT_FOUND,
    )
    .await;
    let (status, _) = post(&s, "/v1/responses", json!([1, 2])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    wait_idle(&s).await;
}
