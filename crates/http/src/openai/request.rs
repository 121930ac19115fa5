//! Request bodies of the OpenAI API as vLLM accepts them. Unknown fields are
//! ignored (serde's default), as vLLM's `extra="allow"` does: clients such as
//! guidellm send vendor extras. Integer fields are `i64` so that a negative
//! value reaches validation and gets a range error naming the field, rather
//! than a type error.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value as Json};

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub continuous_usage_stats: Option<bool>,
}

/// One body type for chat and completions (not two structs sharing a
/// `#[serde(flatten)]` part: flatten buffers the body and loses the field
/// path that errors report as `param`). Chat needs `messages`, completions
/// `prompt`; each ignores the other's fields ([`CHAT_ONLY_FIELDS`],
/// [`COMPLETIONS_ONLY_FIELDS`]) as it ignores unknown ones.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationRequest {
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<Prompt>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<Map<String, Json>>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub include_stop_str_in_output: Option<bool>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub skip_special_tokens: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub response_format: Option<ResponseFormat>,
    /// vLLM's structured outputs object (one constraint at most).
    pub structured_outputs: Option<StructuredOutputs>,
    /// vLLM's older top-level forms of `structured_outputs`.
    #[serde(default, deserialize_with = "schema_value")]
    pub guided_json: Option<Json>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub prompt_logprobs: Option<i64>,
    pub best_of: Option<i64>,
    /// Chat: a boolean; completions: the number of top logprobs (0..=20).
    pub logprobs: Option<Json>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Json>>,
    pub include_reasoning: Option<bool>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub add_special_tokens: Option<bool>,
    /// vLLM's extra: answer with the prompt's and the output's token ids.
    pub return_token_ids: Option<bool>,
}

/// The fields only chat reads: a completions request drops them unread.
pub const CHAT_ONLY_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "include_reasoning",
];

/// The fields only completions read: a chat request drops them unread.
pub const COMPLETIONS_ONLY_FIELDS: &[&str] = &["prompt", "echo", "suffix", "add_special_tokens"];

/// OpenAI's `response_format`: `text`, `json_object` or `json_schema`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(default, deserialize_with = "schema_value")]
    pub schema: Option<Json>,
    /// Accepted and ignored: the schema is always enforced.
    pub strict: Option<bool>,
}

/// A JSON schema field: an object or a boolean, or JSON text of one (what
/// the text holds is checked where the schema is used); anything else is
/// refused as the body is read, whether or not the field is used.
fn schema_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    match Option::<Json>::deserialize(d)? {
        Some(Json::Number(_) | Json::Array(_)) => Err(serde::de::Error::custom(
            "a JSON schema must be an object or a boolean, or JSON text of one",
        )),
        value => Ok(value),
    }
}

/// vLLM's `structured_outputs`: each field is one kind of constraint. An
/// unknown key is refused rather than ignored: a misspelled constraint would
/// otherwise run unconstrained.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema, or JSON text of one.
    #[serde(default, deserialize_with = "schema_value")]
    pub json: Option<Json>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    /// A Lark (llguidance) grammar.
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text (OpenAI); a mapping is accepted too (transformers style).
    pub arguments: Json,
}

#[derive(Debug, Deserialize)]
pub struct ToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCall,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema (an object, as OpenAI requires).
    pub parameters: Option<Map<String, Json>>,
}

#[derive(Debug, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Debug, Deserialize)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// The parts of a chat request the template sees, decoded a second time
/// from the same body into minijinja values so that the client's key order
/// (and any extra keys) reach the template as transformers would pass them.
#[derive(Debug, Deserialize)]
pub struct ChatTemplateView {
    pub messages: Vec<minijinja::Value>,
    pub tools: Option<minijinja::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Deserialize)]
pub struct TokenizePrompt {
    pub model: Option<String>,
    pub prompt: String,
    pub add_special_tokens: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct TokenizeChat {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Json>>,
    pub tools: Option<Vec<Tool>>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}
