//! The small routes about the server itself: models, health, metrics and
//! the OpenAPI document, in vLLM's shapes.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::EngineState;
use prometheus::{Encoder, TextEncoder};
use serde::Serialize;

use super::respond::json_response;
use super::state::SharedState;
use crate::openai::ApiError;

/// The OpenAPI document of the routes (served for clients and fuzzers).
pub const OPENAPI: &str = include_str!("../../openapi.json");

#[derive(Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: String,
    parent: Option<String>,
    max_model_len: Option<usize>,
    /// The checkpoint's architecture (config.json's `architectures`).
    #[serde(skip_serializing_if = "Option::is_none")]
    architecture: Option<String>,
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
        architecture: state.model.architecture.clone(),
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

/// The document with `model` narrowed to the served name and token ids to
/// the model's vocabulary (so clients and fuzzers generate requests that
/// reach the model, and the ranges it states are the server's).
pub async fn openapi(State(state): State<SharedState>) -> Response {
    let doc = served_openapi(&state.served_model_name, state.model.vocab_size);
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

/// [`OPENAPI`] with its placeholders filled in.
pub fn served_openapi(model: &str, vocab_size: usize) -> String {
    let name = serde_json::to_string(model).unwrap_or_default();
    OPENAPI.replace("\"__SERVED_MODEL__\"", &name).replace(
        "\"__MAX_TOKEN_ID__\"",
        &vocab_size.saturating_sub(1).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_document_states_the_served_limits() {
        let doc: serde_json::Value = serde_json::from_str(&served_openapi("m\"x", 640)).unwrap();
        let text = doc.to_string();
        assert!(!text.contains("__"), "a placeholder left: {text}");
        let detokenize = &doc["paths"]["/detokenize"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"]["properties"];
        assert_eq!(detokenize["tokens"]["items"]["maximum"], 639);
        assert_eq!(detokenize["model"]["enum"][0], "m\"x");
    }
}
