//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes (the route has
//! read the body).

use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::chat::render_chat;
use super::state::AppState;
use super::timeline::Timeline;
use crate::openai::decode::decode_json;
use crate::openai::request::{DetokenizeRequest, TokenizeChat, TokenizePrompt};
use crate::openai::validate::{token_ids, validate_messages, validate_tool_types};
use crate::openai::ApiError;

/// The ids of a prompt (`prompt`) or of a rendered chat (`messages`).
pub fn tokenize(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    // Chat form if the body has `messages`, else the prompt form: decoding
    // into the form the client meant gives errors that name its fields.
    let probe: serde_json::Value = decode_json(bytes)?;
    let tokens = if probe.get("messages").is_some() {
        let req: TokenizeChat = decode_json(bytes)?;
        state.check_model(req.model.as_deref())?;
        validate_messages(&req.messages)?;
        validate_tool_types(req.tools.as_deref().unwrap_or_default())?;
        let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
        let continue_final = req.continue_final_message.unwrap_or(false);
        let rendered = render_chat(
            state,
            bytes,
            add_generation_prompt && !continue_final,
            continue_final,
            req.chat_template_kwargs.as_ref(),
            false,
            &mut Timeline::off(),
        )?;
        rendered.ids
    } else {
        let req: TokenizePrompt = decode_json(bytes)?;
        state.check_model(req.model.as_deref())?;
        state
            .model
            .encode(&req.prompt, req.add_special_tokens.unwrap_or(true))
            .map_err(ApiError::internal)?
    };
    Ok(axum::Json(json!({
        "count": tokens.len(),
        "max_model_len": state.engine.max_model_len(),
        "tokens": tokens,
        "token_strs": null,
    }))
    .into_response())
}

/// The text of token ids (`tokens`).
pub fn detokenize(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = decode_json(bytes)?;
    state.check_model(req.model.as_deref())?;
    let vocab_size = state.model.vocab_size;
    let ids = token_ids("tokens", &req.tokens, vocab_size)?;
    let prompt = state
        .model
        .tokenizer
        .decode(&ids, false)
        .map_err(ApiError::internal)?;
    Ok(axum::Json(json!({"prompt": prompt})).into_response())
}
