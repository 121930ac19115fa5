//! Serving HTTP/1.1 connections: the accept loop with a cap on open
//! connections, and each connection's task (hyper's HTTP/1.1 over the
//! [`Watched`] socket, the router as its service). A connection over the
//! cap is answered with a 503 (Retry-After) and closed; an idle one is
//! closed after the keep-alive timeout; a request head that does not
//! arrive in time gets a 408 (see [`super::watchdog`]), and so does a body
//! whose bytes stop arriving (see `super::body_timeout`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use prometheus::{IntCounterVec, IntGauge};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use super::body_timeout::TimedBody;
use super::limits::{ConnectionLimits, MAX_HEADERS, MAX_HEADER_BYTES};
use super::watchdog::{linger, ConnectionStage, OpenConnection, Watched};
use crate::openai::ApiError;

/// Connections refused at once beyond the cap (each is read, answered and
/// closed within a few seconds); past this many they are closed at once.
const REFUSING_AT_ONCE: usize = 256;
/// How long a refused connection may take to send its request head.
const REFUSAL_READ: Duration = Duration::from_secs(1);
/// How long a client over the cap is asked to wait.
const REFUSAL_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Pause after an accept error that is not the peer's (e.g. out of file
/// descriptors), so the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the connection layer counts.
#[derive(Clone)]
pub struct ConnectionMetrics {
    /// `gdn:http_rejections_total{reason}`.
    pub rejections: IntCounterVec,
    /// `gdn:http_connections_open`.
    pub open: IntGauge,
}

/// Accepts connections on `listener` and serves `app` on each until
/// `closed` resolves; then stops accepting, lets every connection finish
/// its request in flight (idle ones close at once) and returns once all
/// are closed.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    closed: impl Future<Output = ()>,
) {
    let slots = limits.max_connections.clamp(1, u32::MAX as usize);
    let open = Arc::new(Semaphore::new(slots));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let (stop, stopped) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_headers(MAX_HEADERS)
        .max_header_size(MAX_HEADER_BYTES)
        // The watchdog times heads itself, to answer with a 408.
        .header_read_timeout(None);
    let http = Arc::new(http);
    tokio::pin!(closed);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !is_peer_error(&e) {
                        log::warn!("accepting a connection: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            _ = &mut closed => break,
        };
        if let Ok(permit) = open.clone().try_acquire_owned() {
            let connection = OpenConnection::new(permit, metrics.open.clone());
            tokio::spawn(serve_one(
                stream,
                connection,
                http.clone(),
                app.clone(),
                limits,
                metrics.rejections.clone(),
                stopped.clone(),
            ));
        } else if let Ok(permit) = refusing.clone().try_acquire_owned() {
            tokio::spawn(refuse(stream, permit, slots, metrics.rejections.clone()));
        } else {
            metrics
                .rejections
                .with_label_values(&["too_many_connections"])
                .inc();
        }
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a slot until its socket closes.
    let _ = open.acquire_many(slots as u32).await;
}

/// A connection error of the peer's making (nothing to wait out).
fn is_peer_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

async fn serve_one(
    stream: TcpStream,
    connection: OpenConnection,
    http: Arc<hyper::server::conn::http1::Builder>,
    app: Router,
    limits: ConnectionLimits,
    rejections: IntCounterVec,
    stopped: watch::Receiver<bool>,
) {
    let mut stopped = stopped;
    let stage = ConnectionStage::new();
    let io = Watched::new(stream, stage.clone(), limits, rejections, connection);
    let service = RouterService {
        app,
        stage,
        body_gap: limits.header_read_timeout,
    };
    let conn = http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let stop = async move {
        // Err: the accept loop is gone, which also means stop.
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = stop => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        log::debug!("connection ended: {e}");
    }
}

/// Answers a connection over the cap with a 503 and closes it. The
/// request head is read first: a peer still sending when the socket
/// closes would get a reset instead of the answer.
async fn refuse(
    mut stream: TcpStream,
    _refusing: OwnedSemaphorePermit,
    limit: usize,
    rejections: IntCounterVec,
) {
    let error = ApiError::too_many_connections(limit, REFUSAL_RETRY_AFTER);
    rejections.with_label_values(&[error.code]).inc();
    log::debug!("{limit} connections open: refusing one more");
    let _ = tokio::time::timeout(REFUSAL_READ, read_head(&mut stream)).await;
    if stream.write_all(&error.to_closing_http1()).await.is_ok() {
        linger(stream).await;
    }
}

/// Reads until the end of a request head (or its size limit, or EOF).
async fn read_head(stream: &mut TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while head.len() < MAX_HEADER_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
}

/// The router as one connection's hyper service: marks the connection busy
/// while a request is served, and times the request's body.
#[derive(Clone)]
struct RouterService {
    app: Router,
    stage: Arc<ConnectionStage>,
    /// The longest a request body may go without bytes while it is read.
    body_gap: Option<Duration>,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for RouterService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ServiceFuture;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.stage.request_started();
        let app = self.app.clone();
        let stage = self.stage.clone();
        let request = request.map(|body| TimedBody::new(body, self.body_gap));
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| TrackedBody { body, stage }))
        })
    }
}

/// A response body that tells the connection when hyper is done with it.
struct TrackedBody {
    body: Body,
    stage: Arc<ConnectionStage>,
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        self.stage.response_done();
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
