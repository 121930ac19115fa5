//! The connection layer over real sockets: the header-read and keep-alive
//! timeouts, the cap on open connections, and the statuses the HTTP stack
//! answers before any route (400, 405, 408, 413, 414, 431) in OpenAI's
//! error shape. Small limits keep the tests short.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use gdn_http::http::ConnectionLimits;
use gdn_http::serve::{serve, ServeEnd};
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEAD_TIMEOUT: Duration = Duration::from_millis(400);

/// Serves `s` on a loopback port with `limits`.
pub(crate) async fn listen(
    s: &TestServer,
    limits: ConnectionLimits,
) -> (SocketAddr, tokio::task::JoinHandle<ServeEnd>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(serve(
        listener,
        s.state.clone(),
        limits,
        Duration::from_secs(5),
    ));
    (addr, serving)
}

pub(crate) fn limits(
    max_connections: usize,
    head: Duration,
    keep_alive: Duration,
) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        header_read_timeout: Some(head),
        keep_alive_timeout: Some(keep_alive),
    }
}

/// A response as read off the wire.
#[derive(Debug)]
pub(crate) struct Raw {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn parse(bytes: &[u8]) -> Option<Raw> {
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        let status = head.get(9..12)?.parse().ok()?;
        Some(Raw {
            status,
            head,
            body: bytes[end + 4..].to_vec(),
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
    }

    /// The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn error(&self) -> Json {
        let v: Json = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{e}: {:?} {}",
                self.head,
                String::from_utf8_lossy(&self.body)
            )
        });
        let error = &v["error"];
        for key in ["message", "type", "param", "code"] {
            assert!(error.get(key).is_some(), "no {key} in {v}");
        }
        assert!(error["message"].as_str().unwrap().len() > 10, "{v}");
        error.clone()
    }
}

/// Sends `request` on a fresh connection and reads until the server
/// closes it (at most 10 s).
pub(crate) async fn exchange(addr: SocketAddr, request: &[u8]) -> Raw {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes)).await;
    Raw::parse(&bytes)
        .unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&bytes)))
}

/// Reads one response with a content-length body off a kept-alive stream.
pub(crate) async fn read_one(stream: &mut TcpStream) -> Raw {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(raw) = Raw::parse(&bytes) {
            let len: usize = raw.header("content-length").unwrap().parse().unwrap();
            if raw.body.len() >= len {
                return raw;
            }
        }
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        bytes.extend_from_slice(&buf[..n]);
    }
}

/// How long until the server closes `stream`, and what it sent first.
pub(crate) async fn until_closed(stream: &mut TcpStream, limit: Duration) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "still open after {limit:?}");
    (start.elapsed(), bytes)
}

pub(crate) const MODELS: &[u8] = b"GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_heads_are_cut_while_a_normal_client_keeps_its_latency() {
    let s = server("one two three", None);
    let (addr, _serving) = listen(&s, limits(200, HEAD_TIMEOUT, Duration::from_secs(30))).await;
    // Slowloris: a head one byte every 50 ms, never finished.
    let tricklers: Vec<_> = (0..40)
        .map(|_| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                let (mut read, mut write) = stream.into_split();
                let started = Instant::now();
                let trickle = tokio::spawn(async move {
                    let head = b"POST /v1/completions HTTP/1.1\r\nhost: t\r\nx-slow: ";
                    for byte in head.iter().chain(std::iter::repeat(&b'a')) {
                        if write.write_all(&[*byte]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
                let mut bytes = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut bytes))
                    .await;
                trickle.abort();
                (started.elapsed(), bytes)
            })
        })
        .collect();
    // Meanwhile a normal client: each request answered as fast as alone.
    let mut latencies = Vec::new();
    for i in 0..20 {
        let start = Instant::now();
        let raw = if i % 4 == 0 {
            let body = r#"{"prompt": "x", "max_tokens": 3}"#;
            let request = format!(
                "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            exchange(addr, request.as_bytes()).await
        } else {
            exchange(
                addr,
                b"GET /v1/models HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
            )
            .await
        };
        assert_eq!(raw.status, 200, "{raw:?}");
        latencies.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    assert!(
        latencies[latencies.len() - 1] < Duration::from_millis(500),
        "{latencies:?}"
    );
    for trickler in tricklers {
        let (lived, bytes) = trickler.await.unwrap();
        assert!(
            lived >= HEAD_TIMEOUT && lived < HEAD_TIMEOUT + Duration::from_secs(2),
            "a trickling client lived {lived:?}"
        );
        let raw = Raw::parse(&bytes).expect("a 408 before the close");
        assert_eq!(raw.status, 408);
        assert_eq!(raw.header("connection"), Some("close"));
        assert_eq!(raw.error()["code"], "request_timeout");
    }
    let rejected = s
        .state
        .metrics
        .rejections
        .with_label_values(&["request_timeout"])
        .get();
    assert_eq!(rejected, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_keep_alive_timeout() {
    let s = server("one", None);
    let keep_alive = Duration::from_millis(300);
    let (addr, _serving) = listen(&s, limits(100, Duration::from_secs(30), keep_alive)).await;
    // Never a byte: closed quietly.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (lived, bytes) = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(bytes.is_empty());
    assert!(lived >= keep_alive - Duration::from_millis(50), "{lived:?}");
    // Requests on one connection, each within the timeout of the last
    // response: it stays open; then it idles and is closed.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    for _ in 0..4 {
        kept.write_all(MODELS).await.unwrap();
        assert_eq!(read_one(&mut kept).await.status, 200);
        tokio::time::sleep(keep_alive / 2).await;
    }
    let (lived, bytes) = until_closed(&mut kept, Duration::from_secs(5)).await;
    assert!(bytes.is_empty(), "{:?}", String::from_utf8_lossy(&bytes));
    assert!(lived < keep_alive + Duration::from_secs(1), "{lived:?}");
    let open = || s.state.metrics.connections_open.get();
    let until = Instant::now() + Duration::from_secs(5);
    while open() != 0 {
        assert!(Instant::now() < until, "{} connections still open", open());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_gets_a_503_with_retry_after() {
    let s = server("one", None);
    let (addr, _serving) = listen(
        &s,
        limits(5, Duration::from_secs(30), Duration::from_secs(30)),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let until = Instant::now() + Duration::from_secs(5);
    while s.state.metrics.connections_open.get() < 5 {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let raw = exchange(addr, MODELS).await;
    assert_eq!(raw.status, 503, "{raw:?}");
    assert_eq!(raw.header("retry-after"), Some("1"));
    assert_eq!(raw.header("connection"), Some("close"));
    let error = raw.error();
    assert_eq!(error["code"], "too_many_connections");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("--limit-concurrency"));
    let rejected = |reason: &str| {
        s.state
            .metrics
            .rejections
            .with_label_values(&[reason])
            .get()
    };
    assert_eq!(rejected("too_many_connections"), 1);
    // The held connections still serve, and one closed makes room.
    held[0].write_all(MODELS).await.unwrap();
    assert_eq!(read_one(&mut held[0]).await.status, 200);
    drop(held.pop());
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let raw = exchange(
            addr,
            b"GET /v1/models HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        )
        .await;
        if raw.status == 200 {
            break;
        }
        assert!(Instant::now() < until, "{raw:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_http_stack_refuses_has_the_openai_error_shape() {
    let s = server_with("one", None, Duration::ZERO, |c| c.max_request_bytes = 1000);
    let (addr, _serving) = listen(&s, limits(100, HEAD_TIMEOUT, Duration::from_secs(30))).await;
    let expect = |raw: &Raw, status: u16, code: &str| {
        assert_eq!(raw.status, status, "{raw:?}");
        assert_eq!(
            raw.header("content-type"),
            Some("application/json"),
            "{raw:?}"
        );
        assert_eq!(raw.error()["code"], code, "{raw:?}");
    };
    // 431: a header section over 64 KiB, or over 100 fields.
    let big = format!(
        "GET /v1/models HTTP/1.1\r\nhost: t\r\nx-big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let raw = exchange(addr, big.as_bytes()).await;
    expect(&raw, 431, "request_header_fields_too_large");
    assert!(raw.error()["message"]
        .as_str()
        .unwrap()
        .contains("100 header fields"));
    let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
    let raw = exchange(
        addr,
        format!("GET /v1/models HTTP/1.1\r\nhost: t\r\n{many}\r\n").as_bytes(),
    )
    .await;
    expect(&raw, 431, "request_header_fields_too_large");
    // 414: a target over 8 KiB.
    let long = format!(
        "GET /v1/models?{} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        "a".repeat(9000)
    );
    let raw = exchange(addr, long.as_bytes()).await;
    expect(&raw, 414, "uri_too_long");
    assert!(raw.error()["message"].as_str().unwrap().contains("8192"));
    // 400: not HTTP.
    expect(
        &exchange(addr, b"NOT HTTP AT ALL\r\n\r\n").await,
        400,
        "malformed_http_request",
    );
    // 408: a head that stops half-way.
    let raw = exchange(addr, b"GET /v1/models HTTP/1.1\r\nhost: t\r\n").await;
    expect(&raw, 408, "request_timeout");
    assert!(raw.error()["message"]
        .as_str()
        .unwrap()
        .contains("--header-read-timeout"));
    // 405: a route asked with the wrong method, with the methods it takes.
    let raw = exchange(
        addr,
        b"GET /v1/completions HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    expect(&raw, 405, "method_not_allowed");
    assert_eq!(raw.header("allow"), Some("post"));
    // 413: a body over --max-request-bytes, declared or chunked.
    let declared = "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 5000\r\nconnection: close\r\n\r\n";
    expect(
        &exchange(addr, declared.as_bytes()).await,
        413,
        "request_too_large",
    );
    let chunk = "a".repeat(1500);
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    expect(
        &exchange(addr, chunked.as_bytes()).await,
        413,
        "request_too_large",
    );
    // Each is counted under its code.
    let rejected = |reason: &str| {
        s.state
            .metrics
            .rejections
            .with_label_values(&[reason])
            .get()
    };
    assert_eq!(rejected("request_header_fields_too_large"), 2);
    assert_eq!(rejected("uri_too_long"), 1);
    assert_eq!(rejected("malformed_http_request"), 1);
    assert_eq!(rejected("request_timeout"), 1);
}
