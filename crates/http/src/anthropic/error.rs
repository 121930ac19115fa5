//! Errors in Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`: the status stays the server's (vLLM's), the `type` is
//! the one Anthropic's SDKs map that status to. The retry headers stay, so
//! the SDKs' retries of overload work as with the OpenAI routes.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

use crate::api::state::AppState;
use crate::openai::ApiError;

/// Anthropic's error `type` for a status.
pub fn error_type(e: &ApiError) -> &'static str {
    match e.status.as_u16() {
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The error body (also what a stream's `error` event carries).
pub fn body(e: &ApiError) -> Json {
    json!({"type": "error", "error": {"type": error_type(e), "message": e.message}})
}

/// Counts the error under its reason (as [`AppState::reject`] does) and
/// answers in Anthropic's shape.
pub fn reject(state: &AppState, e: ApiError) -> Response {
    state.metrics.rejections.with_label_values(&[e.code]).inc();
    let mut resp = (e.status, axum::Json(body(&e))).into_response();
    let openai = e.into_response();
    for name in [header::RETRY_AFTER, header::CONNECTION] {
        if let Some(v) = openai.headers().get(&name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    if let Some(v) = openai.headers().get("x-should-retry") {
        resp.headers_mut().insert("x-should-retry", v.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn statuses_map_to_anthropic_types() {
        let e = ApiError::model_not_found("x", "demo");
        assert_eq!(body(&e)["error"]["type"], "not_found_error");
        assert_eq!(body(&e)["type"], "error");
        assert_eq!(
            error_type(&ApiError::overloaded(Duration::from_secs(1))),
            "overloaded_error"
        );
        assert_eq!(error_type(&ApiError::engine_failure("x")), "api_error");
        assert_eq!(
            error_type(&ApiError::bad_request("c", "m")),
            "invalid_request_error"
        );
    }
}
