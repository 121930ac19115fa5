//! The serving lifecycle: serve until SIGTERM/SIGINT or until the engine
//! stops on its own, drain, close; and the start-up line once the engine
//! is ready.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::api::state::AppState;
use crate::http::{router, serve_connections, ConnectionLimits, ConnectionMetrics};

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

/// Why [`serve`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeEnd {
    /// SIGTERM/SIGINT: drained and stopped as asked; `cut_off` requests
    /// were still running at the drain deadline and got an error.
    Signal { cut_off: usize },
    /// The engine stopped on its own; the reason.
    EngineStopped(String),
}

/// Serves until a shutdown signal, then drains; or until the engine stops
/// on its own. The listener stays open while draining so new requests get
/// a clear 503 rather than a refused connection. Either way the responses
/// in flight finish first (after an engine stop, or past the drain
/// deadline, with their error events).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    connections: ConnectionLimits,
    drain_deadline: Duration,
) -> ServeEnd {
    let app = router(state.clone());
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let ended = tokio::spawn(async move {
        let signalled = tokio::select! {
            _ = shutdown_signal() => true,
            _ = drain_state.engine.stopped() => false,
        };
        drain_state.draining.store(true, Ordering::SeqCst);
        let end = if signalled {
            log::info!("shutdown: refusing new work, draining for up to {drain_deadline:?}");
            let drained = drain_state.engine.shutdown(drain_deadline).await;
            if drained.cut_off > 0 {
                log::error!(
                    "shutdown: the drain deadline ({drain_deadline:?}, --shutdown-timeout) cut off {} requests",
                    drained.cut_off
                );
            }
            log::info!("shutdown: engine stopped");
            ServeEnd::Signal {
                cut_off: drained.cut_off,
            }
        } else {
            let why = match drain_state.engine.state() {
                engine::EngineState::Dead(why) => why,
                other => format!("the engine thread ended ({other:?})"),
            };
            log::error!("the engine stopped ({why}); closing the server");
            ServeEnd::EngineStopped(why)
        };
        let _ = closed_tx.send(());
        end
    });
    let metrics = ConnectionMetrics {
        rejections: state.metrics.rejections.clone(),
        open: state.metrics.connections_open.clone(),
    };
    serve_connections(listener, app, connections, metrics, async move {
        let _ = closed_rx.await;
    })
    .await;
    ended
        .await
        .unwrap_or_else(|e| ServeEnd::EngineStopped(format!("the shutdown task failed: {e}")))
}

/// Logs the start-up summary line once the engine is ready (nothing if it
/// fails to load: the engine logs why).
pub(super) async fn report_startup(state: Arc<AppState>) {
    loop {
        match state.engine.state() {
            engine::EngineState::Loading => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            engine::EngineState::Ready => {
                log::info!("{}", state.startup.ready());
                return;
            }
            _ => return,
        }
    }
}
