//! Request bodies of Anthropic's Messages API as vLLM accepts them:
//! `POST /v1/messages` and `POST /v1/messages/count_tokens` share one type
//! (count_tokens has no `max_tokens`). Unknown fields are ignored (serde's
//! default) as vLLM does: Claude Code sends `cache_control` on blocks,
//! `metadata`, betas' extras. Block types the text model cannot take
//! (`image`, `document`, server tools) are refused by serde's tag check,
//! with the path of the offending block as `param`.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    /// Required by `/v1/messages` (checked there), absent in count_tokens.
    pub max_tokens: Option<i64>,
    pub messages: Vec<InputMessage>,
    pub system: Option<SystemField>,
    pub tools: Option<Vec<ToolDef>>,
    pub tool_choice: Option<ToolChoice>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    pub thinking: Option<Thinking>,
    /// Accepted and ignored (Anthropic's `user_id` for abuse tracking).
    pub metadata: Option<Json>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SystemField {
    Text(String),
    Blocks(Vec<TextBlock>),
}

/// A block that may only be text (system prompt, tool result content).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextBlock {
    Text { text: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

#[derive(Debug, Deserialize)]
pub struct InputMessage {
    pub role: Role,
    pub content: MessageContent,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Map<String, Json>,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
        is_error: Option<bool>,
    },
    /// A thinking block sent back (Claude Code returns them with tools);
    /// its text is the turn's reasoning, its signature is not checked.
    Thinking {
        thinking: String,
        signature: Option<String>,
    },
    /// Redacted thinking carries no text this model could read: dropped.
    RedactedThinking {
        data: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<TextBlock>),
}

#[derive(Debug, Deserialize)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema object, as Anthropic requires.
    pub input_schema: Map<String, Json>,
    /// `custom` (or absent): a client tool. Server tools (web search, bash,
    /// ...) have no schema and are refused where the input_schema is missing.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    #[serde(rename = "none")]
    Nothing,
}

impl ToolChoice {
    pub fn disable_parallel_tool_use(&self) -> Option<bool> {
        match self {
            ToolChoice::Auto {
                disable_parallel_tool_use,
            }
            | ToolChoice::Any {
                disable_parallel_tool_use,
            }
            | ToolChoice::Tool {
                disable_parallel_tool_use,
                ..
            } => *disable_parallel_tool_use,
            ToolChoice::Nothing => None,
        }
    }
}

/// Extended thinking: on or off for Qwen's template (`enable_thinking`);
/// the budget is accepted but not enforced (`max_tokens` bounds the whole
/// output, reasoning included).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    Enabled {
        budget_tokens: Option<i64>,
    },
    /// Newer clients' "the model decides" and "between tool calls": Qwen
    /// thinks (its template has no finer switch).
    Adaptive,
    BetweenTools,
    Disabled,
}
