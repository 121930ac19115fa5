//! The limits a connection is held to: how many may be open, how long a
//! request head, a pause in its body and an idle connection may take, and
//! the sizes of a head.
//! Shared by the accept loop (connections.rs) and the per-connection
//! watchdog (watchdog.rs).

use std::time::Duration;

/// Header fields a request may carry (hyper's default).
pub const MAX_HEADERS: usize = 100;
/// Bytes of a request's head, request line included: far above what an
/// OpenAI client sends (a few hundred bytes), small enough that a head is
/// never a memory cost.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Bytes of a request target (path and query): nginx's default request
/// line buffer. The routes take no query; hyper's own limit is higher.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The connection limits (gdn-server's `--limit-concurrency`,
/// `--timeout-keep-alive`, `--header-read-timeout`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnectionLimits {
    /// Open connections at most; one more is answered 503 and closed.
    pub max_connections: usize,
    /// From a request's first byte to the end of its head, and the longest
    /// a body being read may go without bytes (`None`: no limit); past it,
    /// 408 and the connection closes.
    pub header_read_timeout: Option<Duration>,
    /// How long a connection may wait for its next (or first) request
    /// (`None`: no limit).
    pub keep_alive_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    /// gdn-server's defaults: uvicorn's keep-alive timeout (5 s), a head
    /// within 10 s, and 4096 connections (well under the usual 20,000+
    /// file descriptors a service gets; the program lowers it to what its
    /// descriptor limit allows).
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            header_read_timeout: Some(Duration::from_secs(10)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
        }
    }
}
