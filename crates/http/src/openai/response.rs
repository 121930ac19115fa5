//! Response bodies and stream chunks, with their fields in vLLM's order
//! (serde writes struct fields in declaration order; `json!` maps would be
//! sorted). Absent optional fields are left out, as vLLM's
//! `exclude_unset` chunks do.

use serde::Serialize;
use serde_json::Value as Json;

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionOut {
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Only in stream deltas (which call of the choice this is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub function: FunctionOut,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopLogprobOut {
    pub token: String,
    pub logprob: Json,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LogprobOut {
    pub token: String,
    pub logprob: Json,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobOut>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<LogprobOut>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.role.is_none()
            && self.content.is_none()
            && self.reasoning_content.is_none()
            && self.tool_calls.is_empty()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// Present (maybe null) on the choice's last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Json>,
    /// `return_token_ids`: the tokens of this chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Chunk<'a, C: Serialize> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Chat with `return_token_ids`: on the first chunk of each choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: Message,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Json,
    /// `return_token_ids`: every sampled token (the stop token too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Json,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Json>,
    /// `return_token_ids`: every sampled token (the stop token too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A completions stream chunk's choice (vLLM puts `prompt_token_ids` before
/// `token_ids` here, after it in the whole response).
#[derive(Clone, Debug, Serialize)]
pub struct CompletionChunkChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Json,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Json>,
    /// `return_token_ids`: on the choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// `return_token_ids`: the tokens of this chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A whole response (`chat.completion`, `text_completion`): the chunk
/// layout with usage always present.
#[derive(Clone, Debug, Serialize)]
pub struct Completion<'a, C: Serialize> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    pub usage: Usage,
    /// Chat with `return_token_ids` (completions put it on the choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A response id such as `chatcmpl-<32 hex>` (random per process and call).
pub fn random_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hex = String::with_capacity(32);
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        hex.push_str(&format!("{:016x}", h.finish()));
    }
    format!("{prefix}{hex}")
}

/// Seconds since the Unix epoch (the `created` of responses and models).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
