//! The IO under each HTTP/1.1 connection ([`Watched`]): it times the
//! connection between requests and while a request head arrives, and it
//! answers in OpenAI's error shape where hyper would answer with an empty
//! body.
//!
//! - Idle (before the first request, or once a response is all written):
//!   closed quietly after the keep-alive timeout.
//! - A request head under way (bytes read, no request handed to the router
//!   yet): after the header-read timeout, a 408 and the connection closes.
//!   A slow trickle of header bytes does not restart the clock.
//! - hyper answers a head it cannot take itself (400 malformed, 414 past
//!   its URI limit, 431 past the header limits), with an empty body; that
//!   answer is replaced by the same status with the error body.
//!
//! The stage comes from the router's side ([`ConnectionStage`], shared with
//! the connection's service): hyper hands a request over once its head is
//! parsed, and drops the response body once it has queued all of it; the
//! flush after that puts the last bytes on the wire. hyper writes nothing
//! between that flush and the next request it hands over except its own
//! answer to a head it refused.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::limits::{ConnectionLimits, MAX_HEADERS, MAX_HEADER_BYTES, MAX_URI_BYTES};
use crate::openai::ApiError;

/// How long a connection the server answered and closes may still deliver
/// what its peer sends: closing a socket with unread bytes resets it, and
/// a reset can destroy the answer before the peer reads it.
const LINGER: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for a request's first byte, since then.
    Idle { since: Instant },
    /// A request head is arriving, since its first byte.
    Head { since: Instant },
    /// The router has the request; its response is not all written.
    Busy,
    /// The response body is done; hyper's last bytes may be unwritten.
    Flushing,
}

/// Where a connection is between requests, shared by its IO and its
/// service.
#[derive(Debug)]
pub(crate) struct ConnectionStage(Mutex<Stage>);

impl ConnectionStage {
    pub fn new() -> Arc<Self> {
        Arc::new(ConnectionStage(Mutex::new(Stage::Idle {
            since: Instant::now(),
        })))
    }

    fn get(&self) -> Stage {
        *self.0.lock().unwrap()
    }

    /// hyper handed a request to the router.
    pub fn request_started(&self) {
        *self.0.lock().unwrap() = Stage::Busy;
    }

    /// hyper dropped the response body: all of it is queued.
    pub fn response_done(&self) {
        let mut stage = self.0.lock().unwrap();
        if *stage == Stage::Busy {
            *stage = Stage::Flushing;
        }
    }

    fn bytes_arrived(&self) {
        let mut stage = self.0.lock().unwrap();
        if let Stage::Idle { .. } = *stage {
            *stage = Stage::Head {
                since: Instant::now(),
            };
        }
    }

    fn flushed(&self) {
        let mut stage = self.0.lock().unwrap();
        if *stage == Stage::Flushing {
            *stage = Stage::Idle {
                since: Instant::now(),
            };
        }
    }
}

/// A connection counted against `--limit-concurrency` until its socket
/// closes (lingering included).
pub(crate) struct OpenConnection {
    /// Given back (to the accept loop's count) on drop.
    _permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl OpenConnection {
    pub fn new(permit: OwnedSemaphorePermit, gauge: IntGauge) -> Self {
        gauge.inc();
        OpenConnection {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The socket of one connection, watched (see the module docs).
pub(crate) struct Watched<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    /// `None` only once handed to the lingering close.
    io: Option<IO>,
    stage: Arc<ConnectionStage>,
    limits: ConnectionLimits,
    timer: Pin<Box<Sleep>>,
    /// hyper's own answer to a head it refused, held back.
    held: Vec<u8>,
    /// Our answer, and how much of it is written.
    answer: Option<(Vec<u8>, usize)>,
    /// The head timed out: the read side fails once the 408 is out.
    timed_out: bool,
    /// The idle timeout passed: the read side reports the end.
    idle_closed: bool,
    rejections: IntCounterVec,
    open: Option<OpenConnection>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Watched<IO> {
    pub fn new(
        io: IO,
        stage: Arc<ConnectionStage>,
        limits: ConnectionLimits,
        rejections: IntCounterVec,
        open: OpenConnection,
    ) -> Self {
        Watched {
            io: Some(io),
            stage,
            limits,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            held: Vec::new(),
            answer: None,
            timed_out: false,
            idle_closed: false,
            rejections,
            open: Some(open),
        }
    }

    fn io(&mut self) -> Pin<&mut IO> {
        Pin::new(self.io.as_mut().expect("present until dropped"))
    }

    /// When the current stage runs out (`None`: it does not).
    fn deadline(&self, stage: Stage) -> Option<Instant> {
        match stage {
            Stage::Idle { since } => self.limits.keep_alive_timeout.map(|t| since + t),
            Stage::Head { since } => self.limits.header_read_timeout.map(|t| since + t),
            Stage::Busy | Stage::Flushing => None,
        }
    }

    fn answer_with(&mut self, error: ApiError) {
        self.rejections.with_label_values(&[error.code]).inc();
        self.answer = Some((error.to_closing_http1(), 0));
    }

    /// Writes our answer out (then flushes).
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let io = self.io.as_mut().expect("present until dropped");
        if let Some((bytes, written)) = self.answer.as_mut() {
            while *written < bytes.len() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &bytes[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
            }
        }
        Pin::new(io).poll_flush(cx)
    }

    /// Replaces hyper's held answer by ours, once.
    fn take_held(&mut self) {
        if self.held.is_empty() || self.answer.is_some() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        match automatic_answer(&held) {
            Some(error) => self.answer_with(error),
            // Not a refusal hyper makes: let it through as it is.
            None => self.answer = Some((held, 0)),
        }
    }

    fn write_or_hold(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.stage.get() {
            Stage::Busy | Stage::Flushing => self.io().poll_write_vectored(cx, bufs),
            Stage::Idle { .. } | Stage::Head { .. } => {
                let mut n = 0;
                for buf in bufs {
                    self.held.extend_from_slice(buf);
                    n += buf.len();
                }
                Poll::Ready(Ok(n))
            }
        }
    }
}

/// hyper's answer to a head it refused, in the error shape (`None`: the
/// bytes are not such an answer).
fn automatic_answer(held: &[u8]) -> Option<ApiError> {
    let status = held.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    match status {
        b"400" => Some(ApiError::malformed_http()),
        b"414" => Some(ApiError::uri_too_long(MAX_URI_BYTES)),
        b"431" => Some(ApiError::header_fields_too_large(
            MAX_HEADERS,
            MAX_HEADER_BYTES,
        )),
        _ => None,
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.timed_out {
            ready!(this.poll_answer(cx))?;
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        if this.idle_closed {
            return Poll::Ready(Ok(()));
        }
        let stage = this.stage.get();
        if let Some(deadline) = this.deadline(stage) {
            this.timer.as_mut().reset(deadline);
            if this.timer.as_mut().poll(cx).is_ready() {
                if let Stage::Head { .. } = stage {
                    let limit = this.limits.header_read_timeout.unwrap_or_default();
                    log::debug!("a request head did not arrive within {limit:?}: 408");
                    this.answer_with(ApiError::request_timeout(limit));
                    this.timed_out = true;
                    ready!(this.poll_answer(cx))?;
                    return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                }
                // Idle: an end of stream, which hyper takes as a quiet close.
                this.idle_closed = true;
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        ready!(this.io().poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.stage.bytes_arrived();
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_or_hold(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_or_hold(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.take_held();
        if this.answer.is_some() {
            ready!(this.poll_answer(cx))?;
        } else {
            ready!(this.io().poll_flush(cx))?;
        }
        this.stage.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.take_held();
        if this.answer.is_some() {
            ready!(this.poll_answer(cx))?;
        }
        this.io().poll_shutdown(cx)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Watched<IO> {
    fn drop(&mut self) {
        // Only a connection we answered and close may have unread bytes
        // whose reset would destroy the answer.
        if self.answer.is_none() {
            return;
        }
        let (Some(io), Ok(runtime)) = (self.io.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let open = self.open.take();
        runtime.spawn(async move {
            linger(io).await;
            drop(open);
        });
    }
}

/// Closes the write side, then reads and discards what the peer still
/// sends for at most [`LINGER`] (a lingering close).
pub(crate) async fn linger<IO: AsyncRead + AsyncWrite + Unpin>(mut io: IO) {
    let _ = io.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_own_refusals_become_error_bodies_and_nothing_else_does() {
        let bare = |status: &str| format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        for (status, code) in [
            ("400 Bad Request", "malformed_http_request"),
            ("414 URI Too Long", "uri_too_long"),
            (
                "431 Request Header Fields Too Large",
                "request_header_fields_too_large",
            ),
        ] {
            let e = automatic_answer(bare(status).as_bytes()).unwrap();
            assert_eq!(e.code, code);
            assert_eq!(e.status.as_u16().to_string(), status[..3]);
        }
        assert!(automatic_answer(bare("200 OK").as_bytes()).is_none());
        assert!(automatic_answer(b"0\r\n\r\n").is_none());
    }
}
