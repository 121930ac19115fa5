//! SSE plumbing of the response path: the response with the keep-alive
//! policy, the next progress or the events that end a stream on an engine
//! failure, the closing usage chunk and `[DONE]`, and the guard that counts
//! (and logs) a client that went away.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;

use super::generate::{Generation, Progress};
use super::state::{AppState, SharedState};
use crate::openai::ApiError;

pub type SseItem = Result<SseEvent, Infallible>;

/// An SSE response with the server's keep-alive policy: a comment while
/// nothing else is sent (queued, long prefill) keeps proxies from timing out
/// and lets a disconnect be seen (`--sse-keepalive-secs`).
pub fn sse_response<S>(state: &AppState, events: S) -> Response
where
    S: Stream<Item = SseItem> + Send + 'static,
{
    let sse = Sse::new(events);
    match state.sse_keepalive {
        Some(interval) => sse
            .keep_alive(KeepAlive::new().interval(interval))
            .into_response(),
        None => sse.into_response(),
    }
}

/// One `data:` event.
pub fn data(text: String) -> SseItem {
    Ok(SseEvent::default().data(text))
}

/// The next progress of `generation` (`None` when every choice finished);
/// on an engine failure, the events that end the stream: the error as a
/// `data:` event, then `[DONE]` (the response already started with 200).
pub async fn next_progress(
    generation: &mut Generation,
    guard: &mut DisconnectGuard,
) -> Option<Result<Progress, [SseItem; 2]>> {
    match generation.next().await? {
        Ok(p) => Some(Ok(p)),
        Err(failure) => {
            log::warn!(
                "request {}: failed after the stream started: {failure}",
                guard.request_id
            );
            guard.done();
            Some(Err([
                data(ApiError::from(failure).body().to_string()),
                data("[DONE]".into()),
            ]))
        }
    }
}

/// The events that close a stream whose choices all finished: the usage
/// chunk (when asked for), then `[DONE]`.
pub fn closing(usage_chunk: Option<String>, guard: &mut DisconnectGuard) -> Vec<SseItem> {
    guard.done();
    usage_chunk
        .into_iter()
        .chain(Some("[DONE]".to_string()))
        .map(data)
        .collect()
}

/// Counts a client disconnect unless the response completed.
pub struct DisconnectGuard {
    state: SharedState,
    request_id: String,
    done: bool,
}

impl DisconnectGuard {
    pub fn new(state: SharedState, request_id: &str) -> Self {
        DisconnectGuard {
            state,
            request_id: request_id.to_string(),
            done: false,
        }
    }
    pub fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if !self.done {
            log::info!(
                "request {}: the client went away before the response was complete",
                self.request_id
            );
            self.state.metrics.disconnects.inc();
        }
    }
}
