//! The route table and what wraps it: the request-id middleware, the
//! target length check (414), the 404 and 405 fallbacks.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::extract::{answer, answer_body, read_body};
use super::limits::MAX_URI_BYTES;
use super::request_id::with_request_id;
use crate::anthropic;
use crate::api::request_id::RequestId;
use crate::api::state::{AppState, SharedState};
use crate::api::{chat, completions, info, responses, tokenize};
use crate::openai::request::{CHAT_ONLY_FIELDS, COMPLETIONS_ONLY_FIELDS};
use crate::openai::ApiError;

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(text_completions))
        .route("/v1/responses", post(responses_route))
        .route("/v1/messages", post(anthropic_messages))
        .route("/v1/messages/count_tokens", post(anthropic_count_tokens))
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(tokenize_route))
        .route("/detokenize", post(detokenize_route))
        .route("/openapi.json", get(info::openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_long_targets,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            with_request_id,
        ))
        .with_state(state)
}

async fn chat_completions(State(state): State<SharedState>, req: Request) -> Response {
    answer(state, req, COMPLETIONS_ONLY_FIELDS, chat::run).await
}

async fn text_completions(State(state): State<SharedState>, req: Request) -> Response {
    answer(state, req, CHAT_ONLY_FIELDS, completions::run).await
}

async fn responses_route(State(state): State<SharedState>, req: Request) -> Response {
    answer_body(state, req, responses::run).await
}

/// Anthropic's routes: the body is read here (415/413/408); the handler
/// answers every error, these too, in Anthropic's shape.
async fn anthropic_messages(State(state): State<SharedState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let request_id = parts
        .extensions
        .get::<RequestId>()
        .cloned()
        .unwrap_or_else(RequestId::fresh);
    let bytes = read_body(&state, &parts.headers, body).await;
    anthropic::messages(state, request_id, bytes).await
}

async fn anthropic_count_tokens(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let bytes = read_body(&state, &headers, body).await;
    anthropic::count_tokens(state, bytes).await
}

async fn tokenize_route(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    with_body(&state, &headers, body, tokenize::tokenize).await
}

async fn detokenize_route(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    with_body(&state, &headers, body, tokenize::detokenize).await
}

/// Reads the body (415/413) and answers from it; an error is counted under
/// its reason and becomes its response.
async fn with_body(
    state: &AppState,
    headers: &HeaderMap,
    body: axum::body::Body,
    answer: fn(&AppState, &[u8]) -> Result<Response, ApiError>,
) -> Response {
    let answered = match read_body(state, headers, body).await {
        Ok(bytes) => answer(state, &bytes),
        Err(e) => Err(e),
    };
    answered.unwrap_or_else(|e| state.reject(e))
}

/// 414 for a request target over [`MAX_URI_BYTES`].
async fn refuse_long_targets(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    let target = req.uri().path_and_query().map_or(0, |t| t.as_str().len());
    if target > MAX_URI_BYTES {
        return state.reject(ApiError::uri_too_long(MAX_URI_BYTES));
    }
    next.run(req).await
}

async fn not_found(state: State<SharedState>, req: Request) -> Response {
    state.reject(ApiError::not_found_route(req.uri().path()))
}
