//! The request body's read timeout ([`TimedBody`]): once a request is
//! handed to the router, a body whose bytes stop arriving for
//! `--header-read-timeout` fails with [`BodyStalled`], which the body
//! reader answers with a 408 that closes the connection.
//!
//! The limit is on each gap between body bytes, not on the whole body
//! (nginx's `client_body_timeout` works the same way): a large prompt over
//! a slow link keeps going as long as it moves, while a client that sends a
//! head and then nothing gives its connection (and its
//! `--limit-concurrency` slot) back. hyper has no body timeout of its own,
//! and the socket-level watchdog cannot tell a body being waited for from a
//! response being streamed (hyper reads the socket then too, to notice a
//! client going away); the body itself can, and it stops timing once it
//! ended, so a streamed response is never cut off by this.
//!
//! The clock runs only while the body is waited for: it starts when its
//! reader finds no bytes ready and restarts with every chunk hyper hands
//! over (each chunk is what one read of the socket brought).

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::BoxError;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

/// No body bytes arrived for this long while the body was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no request body bytes arrived for {0:?}")]
pub struct BodyStalled(pub Duration);

impl BodyStalled {
    /// The stall somewhere in `e`'s chain of sources (the body readers
    /// wrap a body's error in their own).
    pub fn find(e: &(dyn Error + 'static)) -> Option<BodyStalled> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(stalled) = e.downcast_ref::<BodyStalled>() {
                return Some(*stalled);
            }
            next = e.source();
        }
        None
    }
}

/// A request body that fails with [`BodyStalled`] once no bytes arrived
/// for `gap` while it was waited for (`None`: it waits forever).
pub(crate) struct TimedBody<B> {
    body: B,
    gap: Option<Duration>,
    /// Armed while the reader waits; dropped with each chunk.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    pub fn new(body: B, gap: Option<Duration>) -> Self {
        TimedBody {
            body,
            gap,
            timer: None,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.timer = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(gap) = this.gap else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
        ready!(timer.as_mut().poll(cx));
        log::debug!("no request body bytes for {gap:?}: 408");
        Poll::Ready(Some(Err(BodyStalled(gap).into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body as AxumBody;
    use futures_util::stream::{self, StreamExt};

    const GAP: Duration = Duration::from_millis(150);

    async fn read(body: AxumBody) -> Result<Bytes, axum::Error> {
        let timed = AxumBody::new(TimedBody::new(body, Some(GAP)));
        axum::body::to_bytes(timed, 1 << 20).await
    }

    #[tokio::test]
    async fn a_stalled_body_fails_with_a_stall_the_reader_can_find() {
        let silent = stream::pending::<Result<Bytes, std::io::Error>>();
        let started = tokio::time::Instant::now();
        let e = read(AxumBody::from_stream(silent)).await.unwrap_err();
        assert!(started.elapsed() >= GAP);
        assert_eq!(BodyStalled::find(&e), Some(BodyStalled(GAP)));
        let broken = stream::iter([Err::<Bytes, _>(std::io::Error::other("reset"))]);
        let e = read(AxumBody::from_stream(broken)).await.unwrap_err();
        assert_eq!(BodyStalled::find(&e), None);
    }

    #[tokio::test]
    async fn a_body_that_keeps_moving_is_read_past_the_gap() {
        // Ten chunks a third of the gap apart: the whole body takes longer
        // than three gaps.
        let slow = stream::iter(0..10u8).then(|i| async move {
            tokio::time::sleep(GAP / 3).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![i]))
        });
        let bytes = read(AxumBody::from_stream(slow)).await.unwrap();
        assert_eq!(&bytes[..], &(0..10).collect::<Vec<u8>>()[..]);
    }
}
