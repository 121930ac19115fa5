//! Answers that close their connection: a request body that stops arriving
//! gets a 408 once it has sent nothing for the header-read timeout (its
//! connection, and the slot it holds under the connection cap, are given
//! back), while a body that keeps coming and a long stream after it are
//! never cut; a 414 closes a kept-alive connection too.

use crate::common;
use crate::http_connections::{exchange, limits, listen, read_one, until_closed, Raw, MODELS};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The header-read timeout, which also bounds each pause in a body.
const GAP: Duration = Duration::from_millis(500);
/// How much later than the timeout a stalled client may be answered.
const MARGIN: Duration = Duration::from_secs(1);
const COMPLETION: &str = r#"{"prompt": "x", "max_tokens": 3}"#;
const CLOSE_MODELS: &[u8] = b"GET /v1/models HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";

/// A JSON POST's head, declaring a body of `len` bytes.
fn post_head(path: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
}

/// A connection that sent a head declaring `body` and its first `sent`
/// bytes, then nothing.
async fn stall(addr: SocketAddr, path: &str, body: &str, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = post_head(path, body.len());
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body.as_bytes()[..sent]).await.unwrap();
    stream
}

/// The 408 a stalled body gets, then the close.
fn expect_body_timeout(bytes: &[u8]) {
    let raw = Raw::parse(bytes).expect("a 408 before the close");
    assert_eq!(raw.status, 408, "{raw:?}");
    assert_eq!(raw.header("connection"), Some("close"), "{raw:?}");
    let error = raw.error();
    assert_eq!(error["code"], "request_timeout");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("request body"), "{message}");
    assert!(message.contains("--header-read-timeout"), "{message}");
}

fn rejected(s: &TestServer, reason: &str) -> u64 {
    s.state
        .metrics
        .rejections
        .with_label_values(&[reason])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_gets_a_408_and_its_connection_closes() {
    let s = server("one", None);
    let (addr, _serving) = listen(&s, limits(100, GAP, Duration::from_secs(30))).await;
    // Not one body byte after the head; half a body, then nothing.
    for (path, sent) in [("/v1/completions", 0), ("/tokenize", COMPLETION.len() / 2)] {
        let mut stream = stall(addr, path, COMPLETION, sent).await;
        let (lived, bytes) = until_closed(&mut stream, GAP + MARGIN).await;
        assert!(lived >= GAP, "{path}: answered after {lived:?}");
        expect_body_timeout(&bytes);
    }
    assert_eq!(rejected(&s, "request_timeout"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_that_keeps_coming_and_its_long_stream_are_served() {
    // Slow steps: the stream lasts several gaps after the body is read.
    let s = server_with(
        "one two three four five six seven eight nine ten",
        None,
        Duration::from_millis(100),
        |_| {},
    );
    let (addr, _serving) = listen(&s, limits(100, GAP, Duration::from_secs(30))).await;
    let body = r#"{"prompt": "x", "max_tokens": 12, "stream": true}"#;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = post_head("/v1/completions", body.len())
        .replace("\r\n\r\n", "\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // A few bytes every third of the gap: the whole body takes over two
    // gaps, no pause one.
    let started = Instant::now();
    for chunk in body.as_bytes().chunks(8) {
        tokio::time::sleep(GAP / 3).await;
        stream.write_all(chunk).await.unwrap();
    }
    assert!(started.elapsed() > 2 * GAP);
    let sent = Instant::now();
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes))
        .await
        .expect("the stream ends")
        .unwrap();
    let streamed = sent.elapsed();
    let raw = Raw::parse(&bytes).expect("a response");
    assert_eq!(raw.status, 200, "{raw:?}");
    let text = String::from_utf8_lossy(&raw.body);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(streamed > 2 * GAP, "the stream took only {streamed:?}");
    assert_eq!(rejected(&s, "request_timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_the_connection_cap_only_until_the_timeout() {
    const CAP: usize = 4;
    let s = server("one", None);
    let (addr, _serving) = listen(&s, limits(CAP, GAP, Duration::from_secs(30))).await;
    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..CAP {
        stalled.push(stall(addr, "/v1/completions", COMPLETION, 0).await);
    }
    let until = Instant::now() + Duration::from_secs(5);
    while s.state.metrics.connections_open.get() < CAP as i64 {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // While they stall, they fill the cap.
    assert_eq!(exchange(addr, CLOSE_MODELS).await.status, 503);
    // Once they time out, a normal client is served again.
    loop {
        let raw = exchange(addr, CLOSE_MODELS).await;
        if raw.status == 200 {
            break;
        }
        assert_eq!(raw.status, 503, "{raw:?}");
        assert!(started.elapsed() < GAP + MARGIN, "still refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for mut stream in stalled {
        let (_, bytes) = until_closed(&mut stream, MARGIN).await;
        expect_body_timeout(&bytes);
    }
    assert_eq!(rejected(&s, "request_timeout"), CAP as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_414_closes_a_kept_alive_connection() {
    let s = server("one", None);
    let keep_alive = Duration::from_secs(30);
    let (addr, _serving) = listen(&s, limits(100, keep_alive, keep_alive)).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(MODELS).await.unwrap();
    assert_eq!(read_one(&mut stream).await.status, 200);
    let long = format!(
        "GET /v1/models?{} HTTP/1.1\r\nhost: t\r\n\r\n",
        "a".repeat(9000)
    );
    stream.write_all(long.as_bytes()).await.unwrap();
    // The answer, then the end of the stream: not the keep-alive timeout's.
    let (lived, bytes) = until_closed(&mut stream, MARGIN).await;
    let raw = Raw::parse(&bytes).expect("a 414 before the close");
    assert_eq!(raw.status, 414, "{raw:?}");
    assert_eq!(raw.header("connection"), Some("close"), "{raw:?}");
    assert_eq!(raw.error()["code"], "uri_too_long");
    assert!(lived < MARGIN, "{lived:?}");
}
