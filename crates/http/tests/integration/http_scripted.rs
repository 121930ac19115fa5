//! The HTTP layer over the real engine with a scripted executor (test-only):
//! every request's output is a fixed text (tokenized with the demo
//! tokenizer), so the output parsers, stop strings, failures and
//! disconnects can be checked exactly. The random demo model cannot be
//! made to emit a tool call; this executor can.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use engine::Executor;
use gdn_http::http::{router, ConnectionLimits};
use gdn_http::model::ModelFiles;
use gdn_http::serve::{engine_config, serve, start, ServeConfig, ServeEnd};
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use tower::ServiceExt;

const TOOL_OUTPUT: &str = "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

fn tool_request(stream: bool) -> Json {
    json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}],
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_and_reasoning_non_streaming() {
    let s = server(TOOL_OUTPUT, None);
    let (status, body) = post(&s, "/v1/chat/completions", tool_request(false)).await;
    assert_eq!(status, StatusCode::OK);
    let v: Json = serde_json::from_slice(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], "I will check.\n");
    assert_eq!(message["content"], Json::Null);
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-tool-"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    // Typed by the tool's schema: "3" is an integer parameter.
    assert_eq!(
        calls[0]["function"]["arguments"],
        r#"{"city": "Paris", "days": 3}"#
    );
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_streaming_matches_non_streaming() {
    let s = server(TOOL_OUTPUT, None);
    let (status, body) = post(&s, "/v1/chat/completions", tool_request(true)).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Json> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for c in &chunks[1..] {
        let delta = &c["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        assert!(
            delta
                .get("content")
                .is_none_or(|c| c.as_str().unwrap().trim().is_empty()),
            "{delta}"
        );
        calls.extend(delta["tool_calls"].as_array().cloned().unwrap_or_default());
    }
    assert_eq!(reasoning, "I will check.\n");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        calls[0]["function"]["arguments"],
        r#"{"city": "Paris", "days": 3}"#
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_string_across_tokens_ends_the_request_as_a_stop() {
    let s = server(
        "Hello world, this is a long scripted answer that goes on and on and on.",
        None,
    );
    let req = json!({"prompt": "x", "stop": ["o w"], "max_tokens": 60});
    let (status, body) = post(&s, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["text"], "Hell");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], "o w");
    // The engine request ended there, not run to max_tokens, and not as
    // an abort.
    wait_idle(&s).await;
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 10);
    assert_eq!(s.state.engine.stats().aborted, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_after_the_200_is_an_error_event_then_done() {
    let s = server("a b c d e f g h i j k l m n o p", Some(4));
    let req =
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 12});
    let (status, body) = post(&s, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Json = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "server_error", "{error}");
    assert!(error["error"]["message"].as_str().unwrap().len() > 3);
    // Non-streaming: a 500 with the same body shape.
    let s = server("a b c d e f g h i j k l m n o p", Some(3));
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12});
    let (status, body) = post(&s, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "engine_failure");
}

/// Serves `s` on a loopback listener and posts one completion request;
/// returns the serving task and the request's status and body.
async fn serve_one_completion(
    s: &TestServer,
) -> (tokio::task::JoinHandle<ServeEnd>, StatusCode, Vec<u8>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let serving = tokio::spawn(serve(
        listener,
        s.state.clone(),
        ConnectionLimits::default(),
        Duration::from_secs(5),
    ));
    let request = json!({"prompt": "x", "max_tokens": 4});
    let (status, body) = post(s, "/v1/completions", request).await;
    (serving, status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_closes_the_server_with_its_reason() {
    // A lost device stops the engine: nothing more can be served, so the
    // server must close (the program then exits 1) instead of answering 503
    // "retry" forever. The request in flight gets its error first.
    let s = server("a b c d e f g h", None);
    s.script.lock().unwrap().fatal_step = Some(0);
    let (serving, status, body) = serve_one_completion(&s).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "engine_failure", "{v}");
    let end = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the server still runs with a dead engine")
        .unwrap();
    match end {
        ServeEnd::EngineStopped(why) => assert!(why.contains("scripted device loss"), "{why}"),
        other => panic!("ended by {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_engine_keeps_the_server_serving() {
    // The same server with a healthy engine does not close by itself.
    let s = server("a b c d e f g h", None);
    let (serving, status, _) = serve_one_completion(&s).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !serving.is_finished(),
        "the server closed with a live engine"
    );
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_and_is_counted() {
    let long: String = "word ".repeat(400);
    let s = server(&long, None);
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": "x", "max_tokens": 1000, "stream": true}).to_string(),
        ))
        .unwrap();
    let resp = router(s.state.clone()).oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    // Read two frames, then go away.
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    wait_idle(&s).await;
    assert_eq!(s.state.metrics.disconnects.get(), 1);
    assert_eq!(s.state.engine.stats().aborted, 1);
    assert!(s.steps() < 400, "the request ran on after the disconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_loading() {
    let model = ModelFiles::load(&demo_dir(), None).unwrap();
    let config = ServeConfig::new(demo_dir(), "demo".into());
    let engine_config = engine_config(&config, &model, Some(2048));
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let script = Arc::new(Mutex::new(Script {
        tokens: vec![],
        step_delay: Duration::ZERO,
        fail_step: None,
        fatal_step: None,
        steps: 0,
    }));
    let executor_script = script.clone();
    let factory = Box::new(move || {
        wait.recv().unwrap();
        Ok(Box::new(ScriptedExecutor {
            script: executor_script,
        }) as Box<dyn Executor>)
    });
    let state = start(&config, model, engine_config, factory).unwrap();
    let s = TestServer { state, script };
    let get = |path: &'static str| {
        let app = router(s.state.clone());
        async move {
            app.oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(get("/health").await, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = post(&s, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    release.send(()).unwrap();
    for _ in 0..400 {
        if get("/health").await == StatusCode::OK {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never became healthy");
}

fn id_list(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_token_ids_on_completions() {
    const TEXT: &str = "Hello world, one two three.";
    let s = server(TEXT, None);
    // The scripted output's ids, then the EOS that ends the request: vLLM
    // reports the stop token's id although its text is not output.
    let mut want = s.state.model.encode(TEXT, false).unwrap();
    want.push(EOS);
    let prompt = [5u32, 6, 7];
    let req = json!({"prompt": prompt, "max_tokens": 60, "return_token_ids": true});
    let (status, body) = post(&s, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Json = serde_json::from_slice(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], TEXT);
    assert_eq!(id_list(&choice["token_ids"]), want);
    assert_eq!(id_list(&choice["prompt_token_ids"]), prompt);
    assert!(v.get("prompt_token_ids").is_none(), "on the choice: {v}");
    // Not asked for: not there.
    let (_, body) = post(&s, "/v1/completions", json!({"prompt": prompt})).await;
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert!(v["choices"][0].get("token_ids").is_none(), "{v}");
    assert!(v["choices"][0].get("prompt_token_ids").is_none(), "{v}");
    // Streamed, two prompts: each choice's prompt ids on its first chunk
    // only, and its chunks' token ids add up to the whole list.
    let req = json!({"prompt": [[5, 6, 7], [8]], "max_tokens": 60, "stream": true, "return_token_ids": true});
    let (status, body) = post(&s, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK);
    let mut tokens = [vec![], vec![]];
    let mut prompts = [vec![], vec![]];
    let mut text = [String::new(), String::new()];
    for chunk in sse_json(&body) {
        let c = &chunk["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        if let Some(p) = c.get("prompt_token_ids") {
            assert!(tokens[i].is_empty() && prompts[i].is_empty(), "{chunk}");
            prompts[i] = id_list(p);
        }
        tokens[i].extend(id_list(&c["token_ids"]));
        text[i].push_str(c["text"].as_str().unwrap());
    }
    assert_eq!(prompts, [vec![5, 6, 7], vec![8]]);
    assert_eq!(tokens, [want.clone(), want]);
    assert_eq!(text, [TEXT, TEXT]);
    wait_idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_token_ids_on_chat() {
    const TEXT: &str = "Sure, here it is.";
    let s = server(TEXT, None);
    let mut want = s.state.model.encode(TEXT, false).unwrap();
    want.push(EOS);
    let messages = json!([{"role": "user", "content": "Say it"}]);
    let req = json!({"messages": messages, "return_token_ids": true});
    let (status, body) = post(&s, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Json = serde_json::from_slice(&body).unwrap();
    assert_eq!(id_list(&v["choices"][0]["token_ids"]), want);
    // On the response (not the choice): the rendered prompt's ids, which
    // decode to the conversation ending in the assistant's turn.
    let prompt = id_list(&v["prompt_token_ids"]);
    let decoded = s.state.model.tokenizer.decode(&prompt, false).unwrap();
    assert!(decoded.contains("Say it"), "{decoded:?}");
    assert!(
        decoded.trim_end().ends_with("<|im_start|>assistant")
            || decoded.contains("<|im_start|>assistant\n"),
        "{decoded:?}"
    );
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        prompt.len()
    );
    // Streamed with n = 2: the prompt ids on each choice's role chunk (and
    // no other chunk), the token ids of each choice add up to the list,
    // the EOS included.
    let req = json!({"messages": messages, "n": 2, "stream": true, "return_token_ids": true});
    let (status, body) = post(&s, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK);
    let mut tokens = [vec![], vec![]];
    let mut role_chunks = 0;
    for chunk in sse_json(&body) {
        let c = &chunk["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        if c["delta"].get("role").is_some() {
            role_chunks += 1;
            assert_eq!(id_list(&chunk["prompt_token_ids"]), prompt, "{chunk}");
            assert!(c.get("token_ids").is_none(), "{chunk}");
            continue;
        }
        assert!(chunk.get("prompt_token_ids").is_none(), "{chunk}");
        tokens[i].extend(id_list(&c["token_ids"]));
    }
    assert_eq!(role_chunks, 2);
    assert_eq!(tokens, [want.clone(), want]);
    // Not asked for: not there.
    let req = json!({"messages": messages, "stream": true});
    let (_, body) = post(&s, "/v1/chat/completions", req).await;
    for chunk in sse_json(&body) {
        assert!(chunk.get("prompt_token_ids").is_none(), "{chunk}");
        assert!(chunk["choices"][0].get("token_ids").is_none(), "{chunk}");
    }
    wait_idle(&s).await;
}

/// A comment line (`:`) is an SSE keep-alive; vLLM sends none.
fn keepalive_comments(bytes: &[u8]) -> usize {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|event| event.starts_with(':'))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_keepalive_comments_follow_the_flag() {
    // Each step takes 1.2 s: a 1 s keep-alive fires before the first token.
    let body = json!({"prompt": "hi", "max_tokens": 2, "stream": true, "ignore_eos": true});
    let slow = Duration::from_millis(1200);
    let on = server_with("ab", None, slow, |c| {
        c.sse_keepalive = Some(Duration::from_secs(1))
    });
    let (status, bytes) = post(&on, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        keepalive_comments(&bytes) >= 1,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(sse_data(&bytes).last().map(String::as_str), Some("[DONE]"));
    let off = server_with("ab", None, slow, |c| c.sse_keepalive = None);
    let (status, bytes) = post(&off, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        keepalive_comments(&bytes),
        0,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(sse_data(&bytes).last().map(String::as_str), Some("[DONE]"));
}
