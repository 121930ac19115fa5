//! The id of one HTTP request (`X-Request-Id`).

use axum::http::HeaderValue;

use crate::openai::response::random_id;
use crate::openai::ApiError;

/// The id of one HTTP request: the client's `X-Request-Id`, else a fresh
/// 32-hex one. Echoed in the response's `X-Request-Id` (streams too: it is
/// a header), the body's `id` (`chatcmpl-<id>`, `cmpl-<id>`, as vLLM
/// builds it) and the log lines of the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest `X-Request-Id` accepted (it is logged and sent back).
pub const MAX_REQUEST_ID_LEN: usize = 256;

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl RequestId {
    /// A fresh random id (no header, or a request that reached a handler
    /// without the middleware).
    pub fn fresh() -> RequestId {
        RequestId(random_id(""))
    }

    /// The client's header value if it is 1 to [`MAX_REQUEST_ID_LEN`]
    /// visible ASCII characters (it goes into headers, JSON and logs as
    /// is); a 400 otherwise. No header: a fresh id.
    pub fn from_header(value: Option<&HeaderValue>) -> Result<RequestId, ApiError> {
        let Some(value) = value else {
            return Ok(RequestId::fresh());
        };
        let bytes = value.as_bytes();
        if bytes.is_empty()
            || bytes.len() > MAX_REQUEST_ID_LEN
            || !bytes.iter().all(|b| b.is_ascii_graphic())
        {
            return Err(ApiError::bad_request(
                "invalid_request_id",
                format!(
                    "X-Request-Id must be 1 to {MAX_REQUEST_ID_LEN} visible ASCII characters (no spaces)."
                ),
            )
            .with_param("X-Request-Id"));
        }
        Ok(RequestId(String::from_utf8_lossy(bytes).into_owned()))
    }
}
