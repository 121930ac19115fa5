//! What every handler shares: the engine, the model's text side, the
//! server's limits and switches, and the server's own metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use engine::{EngineHandle, EngineState};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::response_store::ResponseStore;
use crate::model::ModelFiles;
use crate::openai::ApiError;
use crate::startup::Startup;

pub struct ServerMetrics {
    pub disconnects: IntCounter,
    pub rejections: IntCounterVec,
    /// Open HTTP connections (`--limit-concurrency` bounds them).
    pub connections_open: IntGauge,
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
        let connections_open = IntGauge::new(
            "gdn:http_connections_open",
            "Open HTTP connections (lingering closes included)",
        )?;
        registry.register(Box::new(disconnects.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(connections_open.clone()))?;
        Ok(ServerMetrics {
            disconnects,
            rejections,
            connections_open,
        })
    }
}

pub struct AppState {
    pub engine: EngineHandle,
    pub model: ModelFiles,
    pub served_model_name: String,
    pub max_request_bytes: usize,
    /// Longest schema, regex, grammar or choice list (or built tool-call
    /// grammar) a request may constrain its output with.
    pub max_constraint_bytes: usize,
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
    pub startup: Arc<Startup>,
    /// Stored responses for `previous_response_id`.
    pub responses: ResponseStore,
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
