//! Shared server state, the router, request-body decoding and the server's
//! own metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engine::{EngineHandle, EngineState};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::model::ModelFiles;
use crate::openai::GenerationRequest;
use crate::timeline::Timeline;
use crate::{chat, completions, routes};

pub struct ServerMetrics {
    pub disconnects: IntCounter,
    pub rejections: IntCounterVec,
}

impl ServerMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let disconnects = IntCounter::with_opts(Opts::new(
            "vllm:http_requests_client_disconnected_total",
            "Requests whose client went away before the response was complete",
        ))?;
        let rejections = IntCounterVec::new(
            Opts::new(
                "gdn:http_rejections_total",
                "Requests answered with an error status, by reason (the error code)",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(disconnects.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        Ok(ServerMetrics {
            disconnects,
            rejections,
        })
    }
}

pub struct AppState {
    pub engine: EngineHandle,
    pub model: ModelFiles,
    pub served_model_name: String,
    pub max_request_bytes: usize,
    /// Interval of SSE keep-alive comments (`None`: none are sent).
    pub sse_keepalive: Option<std::time::Duration>,
    /// `--request-timeline`: log where each request's first token went.
    pub request_timeline: bool,
    /// Prefix caching is on: chat requests look for their preamble's end
    /// (a snapshot point; two more renders and an encoding per request).
    pub prefix_caching: bool,
    pub registry: Registry,
    pub metrics: ServerMetrics,
    /// Set on SIGTERM/SIGINT: new work gets 503 while the engine drains.
    pub draining: AtomicBool,
    pub created: u64,
    /// Start-up phase times (`gdn:startup_phase_seconds`).
    pub startup: Arc<crate::startup::Startup>,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// Counts the error under its reason and turns it into a response.
    pub fn reject(&self, e: ApiError) -> Response {
        self.metrics.rejections.with_label_values(&[e.code]).inc();
        e.into_response()
    }

    /// The request's `model` must be the served name (or absent).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.served_model_name => {
                Err(ApiError::model_not_found(m, &self.served_model_name))
            }
            _ => Ok(()),
        }
    }

    /// New generation work is accepted only when ready and not draining.
    pub fn check_accepting(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("The server is shutting down."));
        }
        match self.engine.state() {
            EngineState::Ready => Ok(()),
            EngineState::Loading => Err(ApiError::unavailable("The model is still loading.")),
            EngineState::Draining => Err(ApiError::unavailable("The server is shutting down.")),
            EngineState::Dead(detail) => {
                log::error!("engine is dead: {detail}");
                Err(ApiError::unavailable(
                    "The engine has stopped; the server cannot serve requests.",
                ))
            }
        }
    }

    pub fn max_model_len(&self) -> Result<usize, ApiError> {
        self.engine
            .max_model_len()
            .ok_or_else(|| ApiError::unavailable("The model is still loading."))
    }
}

/// Reads a request body: 415 unless `Content-Type: application/json`, 413
/// over `--max-request-bytes`. [`decode_json`] then gives 400 for anything
/// serde refuses.
pub async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
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
    // to_bytes fails only past the limit or when the client's body breaks
    // off (then nobody reads the answer).
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::body_too_large(limit))?;
    Ok(bytes)
}

/// 400 for anything serde refuses (malformed JSON, wrong types, NaN,
/// numbers out of range, invalid UTF-8), with the dotted path of the
/// offending field as `param`.
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let inner = e.into_inner();
        let message = match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("The request body is not valid JSON: {inner}")
            }
            _ => format!("Invalid request body: {inner}"),
        };
        ApiError::malformed_body(message, param)
    })?;
    de.end().map_err(|e| {
        ApiError::malformed_body(format!("The request body is not valid JSON: {e}"), None)
    })?;
    Ok(value)
}

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
    /// The client's header value if it is 1 to [`MAX_REQUEST_ID_LEN`]
    /// visible ASCII characters (it goes into headers, JSON and logs as
    /// is); a 400 otherwise. No header: a fresh id.
    pub fn from_header(value: Option<&HeaderValue>) -> Result<RequestId, ApiError> {
        let Some(value) = value else {
            return Ok(RequestId(random_id("")));
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

    /// Logs which engine requests serve this HTTP request.
    pub fn log_submitted(&self, generation: &crate::generate::Generation) {
        log::debug!(
            "request {self}: engine requests {:?}, {} prompt tokens",
            generation.engine_ids(),
            generation.prompt_tokens.iter().sum::<usize>()
        );
    }
}

/// Gives every request its [`RequestId`] (an extension handlers read),
/// echoes it in the response header and logs error statuses under it.
async fn with_request_id(
    State(state): State<SharedState>,
    mut req: Request,
    next: Next,
) -> Response {
    let id = match RequestId::from_header(req.headers().get(REQUEST_ID_HEADER)) {
        Ok(id) => id,
        Err(e) => return state.reject(e),
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    req.extensions_mut().insert(id.clone());
    let mut resp = next.run(req).await;
    let status = resp.status();
    if status.is_client_error() || status.is_server_error() {
        log::info!("request {id}: {method} {path} -> {status}");
    }
    let value = HeaderValue::from_str(&id.0).expect("checked or generated as visible ASCII");
    resp.headers_mut().insert(REQUEST_ID_HEADER, value);
    resp
}

/// A generation route (chat, completions): reads and decodes the body
/// (415/413/400), checks `model` (404), then `run` answers from the
/// request's id, fields, raw body and its timeline (`--request-timeline`;
/// off: empty); an error is counted under its reason and becomes its
/// response.
pub async fn answer<F, Fut>(state: SharedState, req: Request, run: F) -> Response
where
    F: FnOnce(SharedState, RequestId, GenerationRequest, axum::body::Bytes, Timeline) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>>,
{
    let mut timeline = Timeline::start(state.request_timeline);
    let (parts, body) = req.into_parts();
    let request_id = parts
        .extensions
        .get::<RequestId>()
        .cloned()
        .unwrap_or_else(|| RequestId(random_id("")));
    let answered = async {
        let bytes = read_body(&state, &parts.headers, body).await?;
        timeline.mark("body_read");
        let request: GenerationRequest = decode_json(&bytes)?;
        state.check_model(request.model.as_deref())?;
        timeline.mark("decoded");
        run(state.clone(), request_id, request, bytes, timeline).await
    };
    match answered.await {
        Ok(response) => response,
        Err(e) => state.reject(e),
    }
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

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn not_found(state: axum::extract::State<SharedState>, req: Request) -> Response {
    state.reject(ApiError::not_found_route(req.uri().path()))
}

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(routes::models))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route("/openapi.json", get(routes::openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            with_request_id,
        ))
        .with_state(state)
}
