//! The small routes: models, health, metrics, tokenize, detokenize and the
//! OpenAPI document, in vLLM's shapes.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::EngineState;
use prometheus::{Encoder, TextEncoder};
use serde::Serialize;
use serde_json::json;

use crate::app::{decode_json, read_body, SharedState};
use crate::chat::{json_response, render_chat};
use crate::error::ApiError;
use crate::openai::{DetokenizeRequest, TokenizeChat, TokenizePrompt};
use crate::validate::{token_ids, ValidationError};

/// The OpenAPI document of the routes (served for clients and fuzzers).
pub const OPENAPI: &str = include_str!("../openapi.json");

#[derive(Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: String,
    parent: Option<String>,
    max_model_len: Option<usize>,
}

#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

pub async fn models(State(state): State<SharedState>) -> Response {
    let card = ModelCard {
        id: state.served_model_name.clone(),
        object: "model",
        created: state.created,
        owned_by: "gdn",
        root: state.model.dir.display().to_string(),
        parent: None,
        max_model_len: state.engine.max_model_len(),
    };
    json_response(&ModelList {
        object: "list",
        data: vec![card],
    })
}

/// 200 with an empty body when ready (vLLM); 503 while loading, draining
/// or after the engine died.
pub async fn health(State(state): State<SharedState>) -> Response {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return ApiError::unavailable("The server is shutting down.").into_response();
    }
    match state.engine.state() {
        EngineState::Ready => StatusCode::OK.into_response(),
        EngineState::Loading => {
            ApiError::unavailable("The model is still loading.").into_response()
        }
        EngineState::Draining => {
            ApiError::unavailable("The server is shutting down.").into_response()
        }
        EngineState::Dead(detail) => {
            log::error!("health: engine is dead: {detail}");
            ApiError::unavailable("The engine has stopped.").into_response()
        }
    }
}

pub async fn metrics(State(state): State<SharedState>) -> Response {
    let encoder = TextEncoder::new();
    let mut buf = Vec::new();
    if let Err(e) = encoder.encode(&state.registry.gather(), &mut buf) {
        return ApiError::internal(format!("metrics encoding: {e}")).into_response();
    }
    (
        [(header::CONTENT_TYPE, encoder.format_type().to_string())],
        buf,
    )
        .into_response()
}

pub async fn tokenize(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let bytes = read_body(&state, &headers, body).await?;
        // Chat form if the body has `messages`, else the prompt form: decoding
        // into the form the client meant gives errors that name its fields.
        let probe: serde_json::Value = decode_json(&bytes)?;
        let tokens = if probe.get("messages").is_some() {
            let req: TokenizeChat = decode_json(&bytes)?;
            state.check_model(req.model.as_deref())?;
            if req.messages.is_empty() {
                return Err(ValidationError::EmptyMessages.into());
            }
            let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
            let continue_final = req.continue_final_message.unwrap_or(false);
            let rendered = render_chat(
                &state,
                &bytes,
                add_generation_prompt && !continue_final,
                continue_final,
                req.chat_template_kwargs.as_ref(),
                false,
                &mut crate::timeline::Timeline::off(),
            )?;
            rendered.ids
        } else {
            let req: TokenizePrompt = decode_json(&bytes)?;
            state.check_model(req.model.as_deref())?;
            state
                .model
                .encode(&req.prompt, req.add_special_tokens.unwrap_or(true))
                .map_err(ApiError::internal)?
        };
        Ok::<_, ApiError>(axum::Json(json!({
            "count": tokens.len(),
            "max_model_len": state.engine.max_model_len(),
            "tokens": tokens,
            "token_strs": null,
        })))
    }
    .await;
    match result {
        Ok(r) => r.into_response(),
        Err(e) => state.reject(e),
    }
}

pub async fn detokenize(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let bytes = read_body(&state, &headers, body).await?;
        let req: DetokenizeRequest = decode_json(&bytes)?;
        state.check_model(req.model.as_deref())?;
        let vocab_size = state.model.vocab_size;
        let ids = token_ids("tokens", &req.tokens, vocab_size)?;
        let prompt = state
            .model
            .tokenizer
            .decode(&ids, false)
            .map_err(ApiError::internal)?;
        Ok::<_, ApiError>(axum::Json(json!({"prompt": prompt})))
    }
    .await;
    match result {
        Ok(r) => r.into_response(),
        Err(e) => state.reject(e),
    }
}

/// The document with `model` narrowed to the served name (so clients and
/// fuzzers generate requests that reach the model).
pub async fn openapi(State(state): State<SharedState>) -> Response {
    let name = serde_json::to_string(&state.served_model_name).unwrap_or_default();
    let doc = OPENAPI.replace("\"__SERVED_MODEL__\"", &name);
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}
