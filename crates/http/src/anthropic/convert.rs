//! A Messages request as the chat request it asks for: the body of a
//! `/v1/chat/completions` request (OpenAI's shape), which then goes
//! through chat's validation, template, tool-call grammar and sampling
//! unchanged, so both routes render and generate alike.

use serde_json::{json, Map, Value as Json};

use super::request::{
    ContentBlock, InputMessage, MessageContent, MessagesRequest, Role, SystemField, TextBlock,
    Thinking, ToolChoice, ToolResultContent,
};
use crate::openai::ApiError;

/// What the chat body is for: a generation takes the sampling fields, a
/// token count only the prompt's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Generate,
    CountTokens,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_value", message).with_param(param)
}

/// The chat request body of `req`, or why it cannot be one (400).
pub fn chat_body(req: &MessagesRequest, purpose: Purpose) -> Result<Json, ApiError> {
    if req.messages.is_empty() {
        return Err(invalid(
            "messages",
            "messages must contain at least one message.",
        ));
    }
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text = match system {
            SystemField::Text(t) => t.clone(),
            SystemField::Blocks(blocks) => join_texts(blocks),
        };
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, m) in req.messages.iter().enumerate() {
        convert_message(m, i, &mut messages)?;
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    // A conversation that ends with the assistant is a prefill: the answer
    // continues that turn (Anthropic's semantics), not a new one.
    if req
        .messages
        .last()
        .is_some_and(|m| m.role == Role::Assistant)
    {
        body.insert("add_generation_prompt".into(), json!(false));
        body.insert("continue_final_message".into(), json!(true));
    }
    body.insert("messages".into(), Json::Array(messages));
    if let Some(tools) = &req.tools {
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(invalid(
                    format!("tools[{i}].type"),
                    format!("Tool type '{kind}' is not supported: only client tools (with an input_schema) are."),
                ));
            }
            out.push(json!({"type": "function", "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            }}));
        }
        body.insert("tools".into(), Json::Array(out));
    }
    if let Some(choice) = &req.tool_choice {
        let chat_choice = match choice {
            ToolChoice::Auto { .. } => json!("auto"),
            ToolChoice::Any { .. } => json!("required"),
            ToolChoice::Tool { name, .. } => {
                json!({"type": "function", "function": {"name": name}})
            }
            ToolChoice::Nothing => json!("none"),
        };
        body.insert("tool_choice".into(), chat_choice);
        if let Some(disable) = choice.disable_parallel_tool_use() {
            body.insert("parallel_tool_calls".into(), json!(!disable));
        }
    }
    if let Some(thinking) = &req.thinking {
        let on = !matches!(thinking, Thinking::Disabled);
        // Qwen's template reads `enable_thinking`; a template that does
        // not ignores the extra variable.
        body.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": on}),
        );
    }
    if purpose == Purpose::Generate {
        let max_tokens = req
            .max_tokens
            .ok_or_else(|| invalid("max_tokens", "max_tokens: Field required."))?;
        body.insert("max_tokens".into(), json!(max_tokens));
        let optional = [
            ("temperature", req.temperature.map(Json::from)),
            ("top_p", req.top_p.map(Json::from)),
            ("top_k", req.top_k.map(Json::from)),
            ("stream", req.stream.map(Json::from)),
            ("stop", req.stop_sequences.as_ref().map(|s| json!(s))),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                body.insert(key.into(), v);
            }
        }
    }
    Ok(Json::Object(body))
}

fn join_texts(blocks: &[TextBlock]) -> String {
    blocks
        .iter()
        .map(|TextBlock::Text { text }| text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Appends message `index` as chat messages: a user turn's tool results
/// become `tool` messages (before its text, as Anthropic puts results
/// first), an assistant turn's `tool_use` blocks its `tool_calls` and its
/// thinking its `reasoning_content`.
fn convert_message(m: &InputMessage, index: usize, out: &mut Vec<Json>) -> Result<(), ApiError> {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let blocks = match &m.content {
        MessageContent::Text(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        MessageContent::Blocks(blocks) => blocks,
    };
    if blocks.is_empty() {
        return Err(invalid(
            format!("messages[{index}].content"),
            "A message's content must not be empty.",
        ));
    }
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let misplaced = |what: &str, owner: &str| {
            invalid(
                format!("messages[{index}].content[{j}]"),
                format!("{what} blocks belong to {owner} messages."),
            )
        };
        match block {
            ContentBlock::Text { text: t } => text.push_str(t),
            ContentBlock::ToolUse { id, name, input } => {
                if m.role != Role::Assistant {
                    return Err(misplaced("tool_use", "assistant"));
                }
                tool_calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input}}));
            }
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                if m.role != Role::User {
                    return Err(misplaced("tool_result", "user"));
                }
                let mut result = match content {
                    None => String::new(),
                    Some(ToolResultContent::Text(t)) => t.clone(),
                    Some(ToolResultContent::Blocks(b)) => join_texts(b),
                };
                // The template shows the model only the text: say it failed.
                if *is_error == Some(true) {
                    result = format!("Error: {result}");
                }
                out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": result}));
            }
            ContentBlock::Thinking { thinking, .. } => {
                if m.role != Role::Assistant {
                    return Err(misplaced("thinking", "assistant"));
                }
                reasoning.push_str(thinking);
            }
            ContentBlock::RedactedThinking { .. } => {}
        }
    }
    let has_text = !text.is_empty();
    if m.role == Role::User {
        if has_text {
            out.push(json!({"role": "user", "content": text}));
        }
        return Ok(());
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), json!(text));
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Json::Array(tool_calls));
    }
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    out.push(Json::Object(message));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Json) -> Result<Json, ApiError> {
        let req: MessagesRequest = serde_json::from_value(v).unwrap();
        chat_body(&req, Purpose::Generate)
    }

    #[test]
    fn tool_round_trip_becomes_tool_calls_and_tool_messages() {
        let chat = body(json!({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Need a tool.", "signature": ""},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks"}]}]}))
        .unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(m[2]["reasoning_content"], "Need a tool.");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
        assert_eq!(chat["max_tokens"], 5);
    }

    #[test]
    fn refusals_name_the_field() {
        let no_max = body(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(no_max.unwrap_err().param.as_deref(), Some("max_tokens"));
        let empty = body(json!({"model": "m", "max_tokens": 1, "messages": []}));
        assert_eq!(empty.unwrap_err().param.as_deref(), Some("messages"));
        let misplaced = body(json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}));
        assert_eq!(
            misplaced.unwrap_err().param.as_deref(),
            Some("messages[0].content[0]")
        );
    }
}
