//! SIGTERM on the gdn-server program (the demo on the CPU executor): a
//! drain that finishes every request exits 0; one whose deadline cuts
//! requests off exits 1, says how many in its log, and gives those
//! requests a `server_shutdown` error, not an engine failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// A running gdn-server and its stderr lines (read by a thread).
struct Server {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gdn-server"))
            .args(["--host", "127.0.0.1", "--port", "0", "--device", "cpu"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting gdn-server");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut server = Server {
            child,
            port: 0,
            lines,
            log: Vec::new(),
        };
        let serving = server.wait_for_line("serving `", Duration::from_secs(60));
        let address = serving.split("http://").nth(1).unwrap();
        let port = address
            .split([' ', ')'])
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap();
        server.port = port.parse().unwrap();
        // Ready (the start-up line may come before or after the bind's).
        if !server.log.iter().any(|l| l.contains("startup:")) {
            server.wait_for_line("startup:", Duration::from_secs(60));
        }
        server
    }

    /// The first stderr line (from now) containing `needle`.
    fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?} in:\n{}", self.log.join("\n")),
            }
        }
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the exit; its status and the whole stderr.
    fn exit(mut self) -> (Option<i32>, String) {
        let until = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            assert!(
                Instant::now() < until,
                "did not exit:\n{}",
                self.log.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(line);
        }
        (status, self.log.join("\n"))
    }

    /// Starts a streamed completion; returns the connection once the
    /// response's first data event arrived.
    fn stream_completion(&self, max_tokens: usize) -> BufReader<TcpStream> {
        let body = serde_json::json!({
            "prompt": "Once upon a time", "max_tokens": max_tokens,
            "ignore_eos": true, "stream": true,
        })
        .to_string();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        while !line.starts_with("data: ") {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "closed before any data"
            );
        }
        reader
    }
}

/// The `data:` payloads of the rest of an SSE response.
fn rest_of_events(mut reader: BufReader<TcpStream>) -> Vec<String> {
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_drain_cut_short_exits_1_and_tells_the_clients_the_server_shut_down() {
    let mut server = Server::start(&["--shutdown-timeout", "0"]);
    let stream = server.stream_completion(3000);
    server.sigterm();
    let events = rest_of_events(stream);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let error: Json = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "server_shutdown", "{error}");
    server.wait_for_line("cut off 1 requests", Duration::from_secs(30));
    let (status, log) = server.exit();
    assert_eq!(status, Some(1), "{log}");
    let last = log.lines().last().unwrap_or("");
    assert!(
        last.starts_with("gdn-server: the drain deadline") && last.contains("cut off 1 requests"),
        "{log}"
    );
}

#[test]
fn a_drain_that_finishes_every_request_exits_0() {
    let server = Server::start(&["--shutdown-timeout", "60"]);
    let stream = server.stream_completion(40);
    server.sigterm();
    let events = rest_of_events(stream);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(
        events.iter().all(|e| !e.contains("\"error\"")),
        "{events:?}"
    );
    let (status, log) = server.exit();
    assert_eq!(status, Some(0), "{log}");
}
