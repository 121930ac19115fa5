//! Logprobs in the two shapes OpenAI has: chat's `logprobs.content` list and
//! completions' parallel lists with text offsets.

use serde_json::{json, Value as Json};

use super::generate::TokenLogprob;
use crate::openai::response::{LogprobOut, TopLogprobOut};

/// JSON cannot hold -inf: vLLM writes -9999.0 for it.
pub fn json_logprob(lp: f32) -> Json {
    if lp.is_finite() {
        json!(lp)
    } else {
        json!(-9999.0)
    }
}

/// Completions' logprobs object (`text_offset` counts from `offset`).
pub fn completion_logprobs(entries: &[TokenLogprob], mut offset: usize) -> Json {
    let mut text_offset = Vec::new();
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    for e in entries {
        text_offset.push(offset);
        offset += e.text.len();
        tokens.push(e.text.clone());
        token_logprobs.push(json_logprob(e.logprob));
        let mut top = serde_json::Map::new();
        for (_, text, lp) in &e.top {
            top.entry(text.clone()).or_insert(json_logprob(*lp));
        }
        top_logprobs.push(Json::Object(top));
    }
    json!({
        "text_offset": text_offset,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    })
}

/// Chat's `logprobs.content` entries.
pub fn chat_logprobs(entries: &[TokenLogprob]) -> Vec<LogprobOut> {
    entries
        .iter()
        .map(|e| LogprobOut {
            token: e.text.clone(),
            logprob: json_logprob(e.logprob),
            bytes: e.text.as_bytes().to_vec(),
            top_logprobs: e
                .top
                .iter()
                .map(|(_, text, lp)| TopLogprobOut {
                    token: text.clone(),
                    logprob: json_logprob(*lp),
                    bytes: text.as_bytes().to_vec(),
                })
                .collect(),
        })
        .collect()
}
