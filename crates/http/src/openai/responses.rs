//! `POST /v1/responses` requests as vLLM accepts them, and their
//! translation into the chat request that generates them: `instructions`
//! and `input` items become chat messages, flat function tools become
//! chat's nested ones, `text.format` becomes `response_format`,
//! `max_output_tokens` becomes `max_completion_tokens`, and chat's sampling
//! fields pass through unchanged. What a chat request cannot honour
//! (built-in tools, images, files, background runs) is refused with a 400
//! naming the field, rather than dropped.

use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

use super::error::ApiError;

/// The fields this endpoint reads itself; the rest of the body is read
/// only for [`PASSED_TO_CHAT`].
#[derive(Debug, Default, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Json>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub text: Option<TextConfig>,
    pub max_output_tokens: Option<i64>,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
    pub stream: Option<bool>,
    pub background: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub parallel_tool_calls: Option<bool>,
    pub metadata: Option<Map<String, Json>>,
    pub user: Option<String>,
    pub truncation: Option<String>,
    /// Stored prompt templates and conversations are OpenAI-hosted state.
    pub prompt: Option<Json>,
    pub conversation: Option<Json>,
}

#[derive(Debug, Default, Deserialize)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<Json>,
    pub strict: Option<bool>,
}

/// Chat's sampling and output fields that mean the same on both endpoints
/// (vLLM's Responses extras): copied into the chat body as they came.
pub const PASSED_TO_CHAT: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "structured_outputs",
];

/// A Responses request as a chat request.
pub struct ChatTranslation {
    /// The chat request body (JSON), to decode and submit as chat's own.
    pub body: Json,
    /// The conversation without `instructions`: the stored history and
    /// this request's input, as chat messages (what a response that
    /// continues this one starts from, with this one's output).
    pub conversation: Vec<Json>,
}

fn refuse(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_value", message).with_param(param)
}

fn unsupported(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("unsupported_value", message).with_param(param)
}

/// Translates `req` (decoded from `raw`) into a chat request continuing
/// `history` (the chat messages of the response `previous_response_id`
/// names; empty without one).
pub fn to_chat(
    req: &ResponsesRequest,
    raw: &Map<String, Json>,
    history: Vec<Json>,
) -> Result<ChatTranslation, ApiError> {
    check_unsupported(req)?;
    let input = req
        .input
        .as_ref()
        .ok_or_else(|| refuse("input", "`input` is required."))?;
    let mut conversation = history;
    input_messages(input, &mut conversation)?;
    let messages = with_instructions(req.instructions.as_deref(), &conversation);
    let mut body = Map::new();
    for field in PASSED_TO_CHAT {
        if let Some(v) = raw.get(*field) {
            body.insert((*field).into(), v.clone());
        }
    }
    body.insert("messages".into(), Json::Array(messages));
    if let Some(max) = req.max_output_tokens {
        if max < 1 {
            return Err(refuse(
                "max_output_tokens",
                format!("`max_output_tokens` must be at least 1, got {max}."),
            ));
        }
        body.insert("max_completion_tokens".into(), max.into());
    }
    if let Some(tools) = &req.tools {
        body.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = &req.tool_choice {
        body.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(format) = req.text.as_ref().and_then(|t| t.format.as_ref()) {
        if let Some(format) = response_format(format)? {
            body.insert("response_format".into(), format);
        }
    }
    Ok(ChatTranslation {
        body: Json::Object(body),
        conversation,
    })
}

/// `instructions` and the conversation's leading system messages as the
/// one system message the chat template takes (Qwen's template refuses a
/// system message anywhere but first).
fn with_instructions(instructions: Option<&str>, conversation: &[Json]) -> Vec<Json> {
    let leading = conversation
        .iter()
        .take_while(|m| m["role"] == "system")
        .count();
    let system: Vec<&str> = instructions
        .into_iter()
        .chain(
            conversation[..leading]
                .iter()
                .filter_map(|m| m["content"].as_str()),
        )
        .collect();
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system.join("\n\n")}));
    }
    messages.extend(conversation[leading..].iter().cloned());
    messages
}

/// A chat error's `param` as the Responses request names it.
pub fn responses_param(param: &str) -> String {
    const RENAMES: [(&str, &str); 5] = [
        ("messages", "input"),
        ("max_completion_tokens", "max_output_tokens"),
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("tool_choice.function", "tool_choice"),
    ];
    for (chat, responses) in RENAMES {
        if let Some(rest) = param.strip_prefix(chat) {
            if rest.is_empty() || rest.starts_with(['.', '[']) {
                return format!("{responses}{rest}");
            }
        }
    }
    // tools[i].function.x -> tools[i].x
    match (param.strip_prefix("tools["), param.find("].function")) {
        (Some(_), Some(at)) => format!("{}{}", &param[..at + 1], &param[at + 10..]),
        _ => param.to_string(),
    }
}

fn check_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(unsupported(
            "background",
            "Background responses are not supported: send `background: false` (or leave it out).",
        ));
    }
    if req.prompt.is_some() {
        return Err(unsupported(
            "prompt",
            "Stored prompt templates are not supported: send the text as `input`.",
        ));
    }
    if req.conversation.is_some() {
        return Err(unsupported(
            "conversation",
            "Conversations are not supported: continue a response with `previous_response_id`.",
        ));
    }
    if req.top_logprobs.is_some_and(|k| k != 0) {
        return Err(unsupported(
            "top_logprobs",
            "Logprobs are not supported on /v1/responses: use /v1/chat/completions.",
        ));
    }
    match req.truncation.as_deref() {
        None | Some("disabled") | Some("auto") => Ok(()),
        Some(other) => Err(refuse(
            "truncation",
            format!("`truncation` must be 'auto' or 'disabled', got '{other}'."),
        )),
    }
}

/// Appends the chat messages of `input` (a string: one user message; a
/// list: message, function_call, function_call_output and reasoning items).
fn input_messages(input: &Json, messages: &mut Vec<Json>) -> Result<(), ApiError> {
    let items = match input {
        Json::String(text) => {
            messages.push(json!({"role": "user", "content": text}));
            return Ok(());
        }
        Json::Array(items) => items,
        _ => {
            return Err(refuse(
                "input",
                "`input` must be a string or a list of items.",
            ))
        }
    };
    // Reasoning goes with the assistant turn that follows it.
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let Some(obj) = item.as_object() else {
            return Err(refuse(param, "An input item must be an object."));
        };
        let kind = match obj.get("type") {
            None => "message",
            Some(Json::String(t)) => t.as_str(),
            Some(_) => return Err(refuse(format!("{param}.type"), "`type` must be a string.")),
        };
        match kind {
            "message" => {
                let mut message = input_message(obj, &param)?;
                if message["role"] == "assistant" {
                    if let Some(r) = reasoning.take() {
                        message["reasoning_content"] = r.into();
                    }
                }
                messages.push(message);
            }
            "function_call" => {
                let call = json!({
                    "id": string_field(obj, "call_id", &param)?,
                    "type": "function",
                    "function": {
                        "name": string_field(obj, "name", &param)?,
                        "arguments": string_field(obj, "arguments", &param)?,
                    },
                });
                assistant_turn(messages, reasoning.take())["tool_calls"]
                    .as_array_mut()
                    .expect("an assistant turn has a tool_calls list")
                    .push(call);
            }
            "function_call_output" => {
                let output = match obj.get("output") {
                    Some(Json::String(s)) => s.clone(),
                    Some(Json::Array(parts)) => parts_text(parts, &format!("{param}.output"))?,
                    _ => {
                        return Err(refuse(
                            format!("{param}.output"),
                            "`output` must be a string or a list of text parts.",
                        ))
                    }
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": string_field(obj, "call_id", &param)?,
                    "content": output,
                }));
            }
            "reasoning" => {
                let text = reasoning_text(obj);
                reasoning.get_or_insert_with(String::new).push_str(&text);
            }
            other => {
                return Err(unsupported(
                    format!("{param}.type"),
                    format!("Input items of type '{other}' are not supported: send message, function_call, function_call_output or reasoning items."),
                ))
            }
        }
    }
    if messages.is_empty() {
        return Err(refuse("input", "`input` has no messages."));
    }
    Ok(())
}

/// The assistant message that function calls join: the last message when
/// it is an assistant's, else a new one (with `reasoning`, if any).
fn assistant_turn(messages: &mut Vec<Json>, reasoning: Option<String>) -> &mut Json {
    let continues = messages.last().is_some_and(|m| m["role"] == "assistant");
    if !continues {
        let mut turn = json!({"role": "assistant", "content": ""});
        if let Some(r) = reasoning {
            turn["reasoning_content"] = r.into();
        }
        messages.push(turn);
    }
    let turn = messages.last_mut().expect("just ensured");
    if !turn["tool_calls"].is_array() {
        turn["tool_calls"] = json!([]);
    }
    turn
}

fn input_message(obj: &Map<String, Json>, param: &str) -> Result<Json, ApiError> {
    let role = string_field(obj, "role", param)?;
    if !["user", "system", "developer", "assistant"].contains(&role.as_str()) {
        return Err(refuse(
            format!("{param}.role"),
            format!("`role` must be user, system, developer or assistant, got '{role}'."),
        ));
    }
    let content = match obj.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => parts_text(parts, &format!("{param}.content"))?,
        _ => {
            return Err(refuse(
                format!("{param}.content"),
                "`content` must be a string or a list of text parts.",
            ))
        }
    };
    // OpenAI's developer messages are what chat templates call system.
    let role = if role == "developer" { "system" } else { &role };
    Ok(json!({"role": role, "content": content}))
}

/// The text of input_text/output_text parts, joined (the model reads text
/// only: image, file and audio parts are refused).
fn parts_text(parts: &[Json], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Json::as_str).unwrap_or("");
        match (kind, part.get("text")) {
            ("input_text" | "output_text" | "text", Some(Json::String(t))) => text.push_str(t),
            ("input_text" | "output_text" | "text", _) => {
                return Err(refuse(
                    format!("{param}[{j}].text"),
                    "A text part needs `text` as a string.",
                ))
            }
            _ => {
                return Err(unsupported(
                    format!("{param}[{j}].type"),
                    format!("Content parts of type '{kind}' are not supported: this model reads input_text and output_text parts."),
                ))
            }
        }
    }
    Ok(text)
}

fn reasoning_text(obj: &Map<String, Json>) -> String {
    let parts = obj
        .get("content")
        .and_then(Json::as_array)
        .filter(|c| !c.is_empty())
        .or_else(|| obj.get("summary").and_then(Json::as_array));
    parts
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Json::as_str))
        .collect()
}

fn string_field(obj: &Map<String, Json>, field: &str, param: &str) -> Result<String, ApiError> {
    match obj.get(field) {
        Some(Json::String(s)) => Ok(s.clone()),
        _ => Err(refuse(
            format!("{param}.{field}"),
            format!("`{field}` is required and must be a string."),
        )),
    }
}

/// Flat Responses function tools as chat's `{type, function: {...}}`.
fn chat_tools(tools: &[Json]) -> Result<Json, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let param = format!("tools[{i}]");
        let Some(obj) = tool.as_object() else {
            return Err(refuse(param, "A tool must be an object."));
        };
        match obj.get("type").and_then(Json::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(unsupported(
                    format!("{param}.type"),
                    format!("Tools of type '{other}' are not supported: only function tools are (built-in tools run on OpenAI's side)."),
                ))
            }
            None => return Err(refuse(format!("{param}.type"), "`type` is required.")),
        }
        let mut function = Map::new();
        function.insert("name".into(), string_field(obj, "name", &param)?.into());
        for field in ["description", "parameters", "strict"] {
            match obj.get(field) {
                None | Some(Json::Null) => {}
                Some(v) => {
                    function.insert(field.into(), v.clone());
                }
            }
        }
        if function.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(refuse(
                format!("{param}.parameters"),
                "`parameters` must be a JSON schema object.",
            ));
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Json::Array(out))
}

fn chat_tool_choice(choice: &Json) -> Result<Json, ApiError> {
    match choice {
        Json::String(_) => Ok(choice.clone()),
        Json::Object(obj) => match (obj.get("type").and_then(Json::as_str), obj.get("name")) {
            (Some("function"), Some(Json::String(name))) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            (Some("function"), _) => Err(refuse(
                "tool_choice.name",
                "A function tool choice needs `name`.",
            )),
            (kind, _) => Err(unsupported(
                "tool_choice",
                format!(
                    "`tool_choice` of type '{}' is not supported: use auto, none, required or {{\"type\": \"function\", \"name\": ...}}.",
                    kind.unwrap_or("")
                ),
            )),
        },
        _ => Err(refuse(
            "tool_choice",
            "`tool_choice` must be a string or an object.",
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(format: &TextFormat) -> Result<Option<Json>, ApiError> {
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(json!({"type": "json_object"}))),
        "json_schema" => {
            let schema = format.schema.as_ref().ok_or_else(|| {
                refuse("text.format.schema", "A json_schema format needs `schema`.")
            })?;
            let mut spec =
                json!({"schema": schema, "name": format.name.as_deref().unwrap_or("response")});
            if let Some(d) = &format.description {
                spec["description"] = d.clone().into();
            }
            if let Some(s) = format.strict {
                spec["strict"] = s.into();
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": spec})))
        }
        other => Err(refuse(
            "text.format.type",
            format!("`text.format.type` must be text, json_object or json_schema, got '{other}'."),
        )),
    }
}
