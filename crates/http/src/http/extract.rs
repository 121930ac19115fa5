//! Request bodies: read within the limits ([`read_body`]), and the common
//! entry of the generation routes ([`answer`]).

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::response::Response;

use super::body_timeout::BodyStalled;
use crate::api::request_id::RequestId;
use crate::api::state::{AppState, SharedState};
use crate::api::timeline::Timeline;
use crate::openai::decode::decode_json_ignoring;
use crate::openai::request::GenerationRequest;
use crate::openai::ApiError;

/// Reads a request body: 415 unless `Content-Type: application/json`, 413
/// over `--max-request-bytes`, 408 when its bytes stop arriving.
/// [`decode_json`] then gives 400 for anything serde refuses.
pub async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("<non-ASCII>"));
    let is_json = content_type
        .and_then(|ct| ct.split(';').next())
        .map(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
        .unwrap_or(false);
    if !is_json {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let limit = state.max_request_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    // to_bytes fails past the limit, when the body stalls (its bytes stopped
    // for the body timeout: 408, and the connection closes) or when the
    // client's body breaks off (then nobody reads the answer).
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|e| match BodyStalled::find(&e) {
            Some(BodyStalled(gap)) => ApiError::body_timeout(gap),
            None => ApiError::body_too_large(limit),
        })
}

/// A generation route (chat, completions): reads and decodes the body
/// (415/413/400; the other endpoint's fields, `ignored`, dropped unread),
/// checks `model` (404), then `run` answers from the request's id, fields,
/// raw body and its timeline (`--request-timeline`; off: empty); an error
/// is counted under its reason and becomes its response.
pub async fn answer<F, Fut>(state: SharedState, req: Request, ignored: &[&str], run: F) -> Response
where
    F: FnOnce(SharedState, RequestId, GenerationRequest, Bytes, Timeline) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>>,
{
    answer_body(
        state,
        req,
        |state, request_id, bytes, mut timeline| async move {
            let request: GenerationRequest = decode_json_ignoring(&bytes, ignored)?;
            state.check_model(request.model.as_deref())?;
            timeline.mark("decoded");
            run(state.clone(), request_id, request, bytes, timeline).await
        },
    )
    .await
}

/// A route that decodes its body itself (`/v1/responses`): reads the body
/// (415/413/408), then `run` answers from the request's id, the raw body
/// and its timeline; an error is counted under its reason and becomes its
/// response.
pub async fn answer_body<F, Fut>(state: SharedState, req: Request, run: F) -> Response
where
    F: FnOnce(SharedState, RequestId, Bytes, Timeline) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>>,
{
    let mut timeline = Timeline::start(state.request_timeline);
    let (parts, body) = req.into_parts();
    let request_id = parts
        .extensions
        .get::<RequestId>()
        .cloned()
        .unwrap_or_else(RequestId::fresh);
    let answered = async {
        let bytes = read_body(&state, &parts.headers, body).await?;
        timeline.mark("body_read");
        run(state.clone(), request_id, bytes, timeline).await
    };
    match answered.await {
        Ok(response) => response,
        Err(e) => state.reject(e),
    }
}
