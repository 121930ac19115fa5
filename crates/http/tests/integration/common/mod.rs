//! The HTTP layer over the real engine with a scripted executor (test-only):
//! every request's output is a fixed text (tokenized with the demo
//! tokenizer), so outputs, failures and disconnects can be checked exactly.
#![allow(dead_code)] // each test file uses a different subset

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::{CacheGeometry, ExecError, Executor, SampledToken, StepRow};
use gdn_http::api::AppState;
use gdn_http::http::router;
use gdn_http::model::ModelFiles;
use gdn_http::serve::{engine_config, start, ServeConfig};
use http_body_util::BodyExt;
use serde_json::Value as Json;
use tower::ServiceExt;

pub const EOS: u32 = 604; // <|im_end|> in the demo tokenizer

/// The demo checkpoint gdn-server embeds: Qwen3.5's tokenizer and chat
/// template (qwen35's tests read it from there too).
pub fn demo_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/demo")
}

/// The server's configuration for the tests: the demo served as "demo"
/// with gdn-server's defaults and a 2048-token context.
pub fn test_config() -> ServeConfig {
    ServeConfig {
        max_model_len: Some(2048),
        ..ServeConfig::new(demo_dir(), "demo".into())
    }
}

pub struct Script {
    pub tokens: Vec<u32>,
    /// Extra time every step takes (a slow first token).
    pub step_delay: Duration,
    /// Fail the step with this index (0-based, counted over all steps).
    pub fail_step: Option<usize>,
    /// Lose the device at the step with this index (the engine stops).
    pub fatal_step: Option<usize>,
    /// Steps run so far.
    pub steps: usize,
}

pub struct ScriptedExecutor {
    pub script: Arc<Mutex<Script>>,
}

impl Executor for ScriptedExecutor {
    fn geometry(&self) -> CacheGeometry {
        CacheGeometry {
            num_slots: 8,
            num_pages: 512,
            page_size: 16,
            vocab_size: 640,
            max_model_len: 2048,
        }
    }

    fn step(&mut self, rows: &[StepRow<'_>]) -> Result<Vec<SampledToken>, ExecError> {
        let mut script = self.script.lock().unwrap();
        let step = script.steps;
        script.steps += 1;
        if script.fail_step == Some(step) {
            return Err(ExecError::StepFailed("scripted device failure".into()));
        }
        if script.fatal_step == Some(step) {
            return Err(ExecError::Fatal("scripted device loss".into()));
        }
        // Pace the steps so a client can go away mid-stream.
        std::thread::sleep(Duration::from_millis(2) + script.step_delay);
        Ok(rows
            .iter()
            .filter_map(|r| r.sample)
            .map(|s| {
                let token = script
                    .tokens
                    .get(s.seed.draw as usize)
                    .copied()
                    .unwrap_or(EOS);
                SampledToken {
                    token,
                    logprob: -0.5,
                    top_logprobs: vec![(token, -0.5)],
                }
            })
            .collect())
    }
}

pub struct TestServer {
    pub state: Arc<AppState>,
    pub script: Arc<Mutex<Script>>,
}

impl TestServer {
    /// Steps the executor has run so far.
    pub fn steps(&self) -> usize {
        self.script.lock().unwrap().steps
    }
}

pub fn server(output: &str, fail_step: Option<usize>) -> TestServer {
    server_with(output, fail_step, Duration::ZERO, |_| {})
}

/// A server whose [`test_config`] `configure` changes.
pub fn server_with(
    output: &str,
    fail_step: Option<usize>,
    step_delay: Duration,
    configure: impl FnOnce(&mut ServeConfig),
) -> TestServer {
    let mut config = test_config();
    configure(&mut config);
    let model = ModelFiles::load(&config.model_dir, config.chat_template.as_deref()).unwrap();
    let tokens = model.encode(output, false).unwrap();
    let script = Arc::new(Mutex::new(Script {
        tokens,
        step_delay,
        fail_step,
        fatal_step: None,
        steps: 0,
    }));
    let engine_config = engine_config(&config, &model, None);
    let executor_script = script.clone();
    let factory = Box::new(move || {
        Ok(Box::new(ScriptedExecutor {
            script: executor_script,
        }) as Box<dyn Executor>)
    });
    let state = start(&config, model, engine_config, factory).unwrap();
    for _ in 0..500 {
        if state.engine.max_model_len().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    TestServer { state, script }
}

pub async fn post(s: &TestServer, path: &str, body: Json) -> (StatusCode, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(s.state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

pub fn sse_data(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
        .collect()
}

pub async fn wait_idle(s: &TestServer) {
    for _ in 0..400 {
        let st = s.state.engine.stats();
        if st.slots_used == 0 && st.pages_used == 0 && st.running == 0 && st.waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("engine not idle: {:?}", s.state.engine.stats());
}

/// `data:` events of an SSE body as JSON, `[DONE]` checked and dropped.
pub fn sse_json(bytes: &[u8]) -> Vec<Json> {
    let data = sse_data(bytes);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}
