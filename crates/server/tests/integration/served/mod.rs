//! The server app started in-process on a fixture model the way
//! `gdn-server` starts it (`serve::prepare` with the binary's executor
//! picker), and requests sent to its router: shared by the served gates.

// Each test binary that includes this module uses part of it (the MoE
// one serves on the CPU only).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use clap::Parser;
use engine::EngineState;
use gdn_http::api::AppState;
use gdn_http::http::router;
use gdn_server::cli::Args;
use gdn_server::executor;
use gdn_server::{prepare, Prepared};
use http_body_util::BodyExt;
use tower::ServiceExt;

#[derive(Clone, Copy, Debug)]
pub enum Device {
    Gpu,
    Cpu,
}

impl Device {
    fn flag(self) -> &'static str {
        match self {
            Device::Gpu => "gpu",
            Device::Cpu => "cpu",
        }
    }
}

/// The server on `dir` with `pages` KV pages of 16 positions (admitted
/// under the watermark), contexts of
/// up to `max_model_len` and steps of `step_tokens`, once its model has
/// loaded. The fixtures have no chat template, so the demo's is passed
/// (embedded: the GPU machine runs the test binary away from the build's
/// source tree).
pub async fn start(
    device: Device,
    dir: &Path,
    pages: usize,
    max_model_len: usize,
    step_tokens: usize,
) -> Prepared {
    let template = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        template.path(),
        include_str!("../../../demo/chat_template.jinja"),
    )
    .unwrap();
    let (pages, max_model_len, step_tokens) = (
        pages.to_string(),
        max_model_len.to_string(),
        step_tokens.to_string(),
    );
    let args = Args::parse_from([
        "gdn-server",
        "--model",
        dir.to_str().unwrap(),
        "--chat-template",
        template.path().to_str().unwrap(),
        "--device",
        device.flag(),
        "--max-model-len",
        &max_model_len,
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        &step_tokens,
        "--block-size",
        "16",
        "--num-gpu-blocks-override",
        &pages,
        // The tests assert preemption and resumption on their tiny pools:
        // the watermark is the policy that admits into them and preempts.
        "--admission-policy",
        "watermark",
    ]);
    let prepared = prepare(&args, executor::pick).expect("the server starts");
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        match prepared.state.engine.state() {
            EngineState::Ready => break,
            EngineState::Dead(why) => panic!("the engine failed to load: {why}"),
            state => assert!(
                Instant::now() < until,
                "the engine did not finish loading: {state:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    prepared
}

pub async fn send(state: &Arc<AppState>, req: HttpRequest<Body>) -> (StatusCode, Vec<u8>) {
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

/// A sample of the server's `/metrics` (unlabelled series).
pub async fn metric(state: &Arc<AppState>, name: &str) -> f64 {
    let req = HttpRequest::get("/metrics").body(Body::empty()).unwrap();
    let (status, bytes) = send(state, req).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}
