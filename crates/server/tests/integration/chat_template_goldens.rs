//! The demo's chat template rendered by the server equals transformers'
//! own renders (tests/fixtures/chat_template/goldens.json, made by
//! transformers 5.24 with jinja2 3.1.6 from the same template text), byte
//! for byte and token id for token id; template errors carry the template's
//! own message. The server path is the one requests take: the OpenAI
//! request's messages as the client sent them (tool-call arguments as JSON
//! text or mappings), decoded into ordered template values.

use std::path::Path;

use gdn_http::model::ModelFiles;
use gdn_http::text::template::{decode_tool_call_arguments, RenderInput, TemplateError};
use minijinja::value::Value;
use serde_json::Value as Json;

fn goldens() -> Vec<Json> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template/goldens.json");
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Json = serde_json::from_str(&text).unwrap();
    doc["cases"].as_array().unwrap().clone()
}

fn demo() -> ModelFiles {
    ModelFiles::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("demo"), None).unwrap()
}

#[test]
fn renders_equal_transformers_bytes_and_token_ids() {
    let model = demo();
    let raw = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template/goldens.json"),
    )
    .unwrap();
    // Key order matters (tool schemas are dumped into the prompt), so the
    // requests are taken from the file as ordered template values.
    let ordered: Value = serde_json::from_str(&raw).unwrap();
    let cases = goldens();
    assert!(
        cases.len() >= 20,
        "expected the full golden set, got {}",
        cases.len()
    );
    let mut rendered_cases = 0;
    let mut error_cases = 0;
    for (i, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let ordered_case = ordered
            .get_attr("cases")
            .unwrap()
            .get_item_by_index(i)
            .unwrap();
        let request = ordered_case.get_attr("request").unwrap();
        let request_json: Json =
            serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
        let result = render_ordered(&model, &request, &request_json);
        if let Some(expected_error) = case.get("error").and_then(Json::as_str) {
            assert_eq!(
                result,
                Err(TemplateError::Raised(expected_error.to_string())),
                "{name}: expected the template's raise_exception message"
            );
            error_cases += 1;
            continue;
        }
        let rendered = result.unwrap_or_else(|e| panic!("{name}: render failed: {e}"));
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{name}: render differs from transformers'"
        );
        let ids = model.encode(&rendered, false).unwrap();
        let expected_ids: Vec<u32> = case["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            ids, expected_ids,
            "{name}: token ids differ from transformers'"
        );
        rendered_cases += 1;
    }
    assert!(
        rendered_cases >= 15 && error_cases >= 3,
        "{rendered_cases} renders, {error_cases} errors"
    );
}

/// Renders from ordered template values, as the chat route does: the
/// request's messages as sent (tool-call arguments as JSON text or
/// mappings), tools and chat_template_kwargs, in the client's key order
/// (tool schemas are dumped into the prompt; serde_json::Value would sort
/// them).
fn render_ordered(
    model: &ModelFiles,
    request: &Value,
    request_json: &Json,
) -> Result<String, TemplateError> {
    let mut messages: Vec<Value> = request
        .get_attr("messages")
        .unwrap()
        .try_iter()
        .unwrap()
        .collect();
    decode_tool_call_arguments(&mut messages).unwrap();
    let tools = request.get_attr("tools").unwrap();
    let tools = (!tools.is_none() && !tools.is_undefined()).then_some(tools);
    let kwargs_value = request.get_attr("chat_template_kwargs").unwrap();
    let kwargs: Vec<(String, Value)> = match kwargs_value.try_iter() {
        Ok(keys) => keys
            .map(|k| {
                (
                    k.as_str().unwrap().to_string(),
                    kwargs_value.get_item(&k).unwrap(),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let template = model
        .template
        .as_ref()
        .expect("the demo has a chat template");
    template.render(&RenderInput {
        messages: &messages,
        tools: tools.as_ref(),
        add_generation_prompt: request_json["add_generation_prompt"]
            .as_bool()
            .unwrap_or(true),
        continue_final_message: false,
        kwargs: &kwargs,
    })
}
