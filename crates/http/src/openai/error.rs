//! The one mapping from anything that goes wrong to an HTTP status and an
//! OpenAI-shaped body `{"error": {"message", "type", "param", "code"}}`.
//!
//! Statuses follow vLLM (400 for every invalid input, never 422; 404 for an
//! unknown model; 503 when shedding); `type` and `code` use OpenAI's strings
//! (`invalid_request_error`, `context_length_exceeded`, ...) so SDKs that
//! branch on them work. Internal errors are logged and masked.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::SubmitError;
use serde_json::json;

use super::validate::ValidationError;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: &'static str,
    pub retry_after: Option<Duration>,
    /// The answer closes the connection (`Connection: close`): the client
    /// either stalled or sent what a kept-alive connection should not carry
    /// on from.
    pub closes_connection: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code,
            retry_after: None,
            closes_connection: false,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message.into(),
        )
    }

    /// The body is not JSON of the expected shape (serde's message, which
    /// names the offending value and position but no server path).
    pub fn malformed_body(message: impl Into<String>, param: Option<String>) -> Self {
        let mut e = Self::bad_request("invalid_request_body", message);
        e.param = param;
        e
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("The request body is larger than the server's limit of {limit} bytes (--max-request-bytes)."),
        )
    }

    pub fn unsupported_media_type(got: Option<&str>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "unsupported_media_type",
            format!(
                "Expected 'Content-Type: application/json', got {}.",
                got.map(|g| format!("'{g}'"))
                    .unwrap_or_else(|| "none".into())
            ),
        )
    }

    /// A chat request to a model without a chat template (vLLM refuses
    /// these too).
    pub fn no_chat_template() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "no_chat_template",
            "This model has no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template), so chat messages cannot be turned into a prompt. Start the server with --chat-template FILE, or send a prompt to /v1/completions.".into(),
        )
        .with_param("messages")
    }

    pub fn model_not_found(requested: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{requested}` does not exist. This server serves `{served}`."),
        )
        .with_param("model")
    }

    /// `previous_response_id` names no stored response (never stored,
    /// `store: false`, or dropped as newer ones came).
    pub fn previous_response_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "previous_response_not_found",
            format!("Previous response with id '{id}' not found."),
        )
        .with_param("previous_response_id")
    }

    pub fn not_found_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_route",
            format!("No route {path}."),
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "Method not allowed on this route.".into(),
        )
    }

    /// The request's head did not arrive within `--header-read-timeout`
    /// (the connection is closed after this answer).
    pub fn request_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!(
                "The request's headers did not arrive within the server's limit of {} (--header-read-timeout).",
                seconds(limit)
            ),
        )
        .closing()
    }

    /// The request's body stopped: no bytes of it for `--header-read-timeout`
    /// (the connection is closed after this answer; counted with the heads'
    /// timeouts under `request_timeout`).
    pub fn body_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!(
                "No bytes of the request body arrived for the server's limit of {} (--header-read-timeout).",
                seconds(limit)
            ),
        )
        .closing()
    }

    /// The request line's target is longer than the server takes (the
    /// connection is closed after this answer, as hyper does for the targets
    /// its parser refuses).
    pub fn uri_too_long(limit: usize) -> Self {
        Self::new(
            StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            "uri_too_long",
            format!("The request target is longer than the server's limit of {limit} bytes."),
        )
        .closing()
    }

    fn closing(mut self) -> Self {
        self.closes_connection = true;
        self
    }

    /// The request's header section is over the server's limits.
    pub fn header_fields_too_large(max_headers: usize, max_bytes: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            "request_header_fields_too_large",
            format!(
                "The request's header section is larger than the server's limits of {max_headers} header fields and {max_bytes} bytes (request line included)."
            ),
        )
    }

    /// The bytes received are not an HTTP/1.1 request.
    pub fn malformed_http() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "malformed_http_request",
            "The request is not valid HTTP/1.1 (request line or header fields).".into(),
        )
    }

    /// `--limit-concurrency` connections are open (this one is closed
    /// after the answer).
    pub fn too_many_connections(limit: usize, retry_after: Duration) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "too_many_connections",
            format!(
                "The server has {limit} connections open, its limit (--limit-concurrency); retry later."
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    pub fn overloaded(retry_after: Duration) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "server_overloaded",
            "The server's running batch is full and its queue is at its limit (--max-num-queued-reqs); retry later.".into(),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// `--max-num-queued-tokens` would be exceeded (counted under its own
    /// reason, `queued_tokens_exceeded`).
    pub fn too_many_queued_tokens(
        retry_after: Duration,
        queued_tokens: usize,
        prompt_tokens: usize,
        limit: usize,
    ) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "queued_tokens_exceeded",
            format!(
                "The server's queue holds {queued_tokens} prompt tokens; this request's {prompt_tokens} would exceed its limit of {limit} (--max-num-queued-tokens); retry later."
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            "service_unavailable",
            message.into(),
        );
        e.retry_after = Some(Duration::from_secs(1));
        e
    }

    /// A request the server's shutdown cut off: its drain deadline
    /// (`--shutdown-timeout`) passed first.
    pub fn server_shutdown(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            "server_shutdown",
            message.into(),
        );
        e.retry_after = Some(Duration::from_secs(1));
        e
    }

    /// A request the engine could not complete (its message is written
    /// for clients by the engine).
    pub fn engine_failure(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "engine_failure",
            message.into(),
        )
    }

    /// A failure that is not the client's: logged in full, shown masked.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        log::error!("internal error: {detail}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            "Internal server error.".into(),
        )
    }

    /// A whole HTTP/1.1 response that closes the connection, for answers
    /// written below the router (the connection layer's own refusals).
    pub fn to_closing_http1(&self) -> Vec<u8> {
        let body = self.body().to_string();
        let reason = self.status.canonical_reason().unwrap_or("");
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.status.as_u16(),
            body.len()
        );
        if let Some(after) = self.retry_after {
            head.push_str(&format!(
                "retry-after: {}\r\nx-should-retry: true\r\n",
                after.as_secs().max(1)
            ));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        bytes
    }

    /// The JSON body (also what an SSE error event carries).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// `2 s`, `0.5 s`: a limit as the flags give it.
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1);
            let headers = resp.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            // The openai SDKs retry 503s; say it is safe and when.
            headers.insert("x-should-retry", HeaderValue::from_static("true"));
        }
        if self.closes_connection {
            // hyper closes the connection once a response saying so is out.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        let mut api = ApiError::bad_request(e.code(), e.to_string());
        api.param = e.param();
        api
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::TooLong {
                prompt_tokens,
                max_tokens,
                max_model_len,
            } => ValidationError::MaxTokensTooLarge {
                max_tokens,
                prompt_tokens,
                max_model_len,
            }
            .into(),
            SubmitError::Invalid(m) => ApiError::bad_request("invalid_value", m),
            SubmitError::Constraint(e) => ApiError::bad_request("invalid_value", e.to_string()),
            SubmitError::Overloaded { retry_after } => ApiError::overloaded(retry_after),
            SubmitError::TooManyQueuedTokens {
                retry_after,
                queued_tokens,
                prompt_tokens,
                limit,
            } => ApiError::too_many_queued_tokens(retry_after, queued_tokens, prompt_tokens, limit),
            SubmitError::ShuttingDown => ApiError::unavailable("The server is shutting down."),
            SubmitError::Loading => ApiError::unavailable("The model is still loading."),
            SubmitError::Dead(detail) => {
                log::error!("engine is dead: {detail}");
                ApiError::unavailable("The engine has stopped; the server cannot serve requests.")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_are_masked_and_overload_says_when_to_retry() {
        let e = ApiError::internal("panic at /work/secret/path.rs:12");
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.body()["error"]["message"], "Internal server error.");
        let resp = ApiError::overloaded(Duration::from_secs(3)).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        assert_eq!(resp.headers()["x-should-retry"], "true");
    }

    #[test]
    fn engine_refusals_map_to_client_statuses() {
        let too_long = ApiError::from(SubmitError::TooLong {
            prompt_tokens: 10,
            max_tokens: 60,
            max_model_len: 64,
        });
        assert_eq!(
            (too_long.status, too_long.code),
            (StatusCode::BAD_REQUEST, "context_length_exceeded")
        );
        assert!(
            too_long.message.contains("60 > 64 - 10"),
            "{}",
            too_long.message
        );
        let dead = ApiError::from(SubmitError::Dead("cuda error 700 at kernel.cu".into()));
        assert_eq!(dead.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!dead.message.contains("kernel.cu"));
    }
}
