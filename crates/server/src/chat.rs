//! `POST /v1/chat/completions`: validate, render the chat template,
//! tokenize, submit one engine request per choice, then answer as one JSON
//! body or as vLLM's SSE stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use minijinja::value::Value;
use serde_json::{json, Value as Json};

use crate::app::{decode_json, random_id, read_body, unix_now, AppState, SharedState};
use crate::error::ApiError;
use crate::generate::{chat_logprobs, Generation, Progress, PromptSpec};
use crate::openai::{ChatTemplateView, GenerationRequest};
use crate::outparse::{tool_schemas, ChatOutputParser, ParsedDelta};
use crate::template::{decode_tool_call_arguments, RenderInput, TemplateError};
use crate::validate::{resolve_max_tokens, validate_chat, ValidChat, ValidationError};

/// How often an SSE comment is sent while nothing else is (queued, long
/// prefill): it keeps proxies from timing out and lets a disconnect be seen.
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);

pub async fn handle(State(state): State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    match run(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => state.reject(e),
    }
}

/// The rendered prompt of a chat request and how its output starts.
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
    /// The prompt ends inside `<think>`: the output starts as reasoning.
    pub opens_reasoning: bool,
}

/// Renders `messages` (and `tools`) of the request body with the model's
/// template, as transformers' `apply_chat_template` would, and tokenizes.
pub fn render_chat(
    state: &AppState,
    body: &[u8],
    add_generation_prompt: bool,
    continue_final_message: bool,
    kwargs: Option<&serde_json::Map<String, Json>>,
) -> Result<RenderedChat, ApiError> {
    let mut view: ChatTemplateView = decode_json(body)?;
    decode_tool_call_arguments(&mut view.messages).map_err(|(index, reason)| {
        ApiError::from(ValidationError::BadToolCallArguments { index, reason })
    })?;
    let kwargs: Vec<(String, Value)> = kwargs
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
        .collect();
    let text = state
        .model
        .template
        .render(&RenderInput {
            messages: &view.messages,
            tools: view.tools.as_ref(),
            add_generation_prompt,
            continue_final_message,
            kwargs: &kwargs,
        })
        .map_err(|e: TemplateError| {
            ApiError::from(ValidationError::Template {
                message: e.to_string(),
            })
        })?;
    let ids = state
        .model
        .encode(&text, false)
        .map_err(ApiError::internal)?;
    let opens_reasoning = text.trim_end_matches('\n').ends_with("<think>");
    Ok(RenderedChat {
        text,
        ids,
        opens_reasoning,
    })
}

async fn run(state: &SharedState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(state, headers, body).await?;
    let req: GenerationRequest = decode_json(&bytes)?;
    state.check_model(req.model.as_deref())?;
    let valid = validate_chat(&req, &state.model.defaults, state.model.vocab_size)?;
    state.check_accepting()?;
    let rendered = render_chat(
        state,
        &bytes,
        valid.add_generation_prompt,
        valid.continue_final_message,
        req.chat_template_kwargs.as_ref(),
    )?;
    let max_model_len = state.max_model_len()?;
    let max_tokens = resolve_max_tokens(
        valid.generation.max_tokens,
        rendered.ids.len(),
        max_model_len,
    )?;
    let generation = Generation::submit(
        &state.engine,
        state.model.tokenizer.clone(),
        &state.model.eos_token_ids,
        vec![PromptSpec {
            ids: rendered.ids,
            max_tokens,
        }],
        &valid.generation,
    )?;
    let tools = req
        .tools
        .as_deref()
        .filter(|_| valid.tools_enabled)
        .map(tool_schemas);
    let parsers = (0..valid.generation.n)
        .map(|_| {
            ChatOutputParser::new(
                rendered.opens_reasoning,
                valid.include_reasoning,
                tools.clone(),
            )
        })
        .collect();
    let out = ChatOutput {
        id: random_id("chatcmpl-"),
        created: unix_now(),
        model: state.served_model_name.clone(),
        parsers,
        tool_call_counts: vec![0; valid.generation.n],
        valid,
    };
    let guard = DisconnectGuard::new(state.clone());
    if out.valid.generation.stream {
        Ok(Sse::new(stream(out, generation, guard))
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response())
    } else {
        collect(out, generation, guard).await
    }
}

/// Counts a client disconnect unless the response completed.
pub struct DisconnectGuard {
    state: SharedState,
    done: bool,
}

impl DisconnectGuard {
    pub fn new(state: SharedState) -> Self {
        DisconnectGuard { state, done: false }
    }
    pub fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if !self.done {
            self.state.metrics.disconnects.inc();
        }
    }
}

struct ChatOutput {
    id: String,
    created: u64,
    model: String,
    parsers: Vec<ChatOutputParser>,
    tool_call_counts: Vec<usize>,
    valid: ValidChat,
}

impl ChatOutput {
    /// Parses a progress into reasoning/content/tool calls (everything
    /// held back is released on the choice's last progress).
    fn parse(&mut self, p: &Progress) -> ParsedDelta {
        let parser = &mut self.parsers[p.index];
        let mut delta = parser.feed(&p.text);
        if p.finish.is_some() {
            let rest = parser.finish();
            delta.reasoning.push_str(&rest.reasoning);
            delta.content.push_str(&rest.content);
            delta.tool_calls.extend(rest.tool_calls);
        }
        // include_reasoning=false: reasoning is still split off, then dropped (vLLM).
        if !self.valid.include_reasoning {
            delta.reasoning.clear();
        }
        delta
    }

    fn finish_reason(&self, index: usize, reason: &str) -> &'static str {
        match reason {
            "stop" if self.parsers[index].saw_tool_call() => "tool_calls",
            "stop" => "stop",
            _ => "length",
        }
    }

    fn tool_calls_json(&mut self, index: usize, delta: &ParsedDelta, streaming: bool) -> Vec<Json> {
        delta
            .tool_calls
            .iter()
            .map(|call| {
                let k = self.tool_call_counts[index];
                self.tool_call_counts[index] += 1;
                let mut v = json!({
                    "id": random_id("chatcmpl-tool-"),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                });
                if streaming {
                    v["index"] = json!(k);
                }
                v
            })
            .collect()
    }

    fn chunk(&self, choices: Json, usage: Option<Json>) -> Json {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }
}

fn usage_json(generation: &Generation) -> Json {
    // n choices share one prompt: it counts once, as in vLLM.
    let prompt = generation.prompt_tokens.first().copied().unwrap_or(0);
    let completion = generation.completion_tokens();
    json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion})
}

fn data(v: &Json) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}

fn stream(
    mut out: ChatOutput,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    async_stream::stream! {
        let n = out.valid.generation.n;
        let include_usage = out.valid.generation.include_usage;
        let continuous = include_usage && out.valid.generation.continuous_usage;
        for index in 0..n {
            let choice = json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
            yield data(&out.chunk(json!([choice]), continuous.then(|| usage_json(&generation))));
        }
        while let Some(next) = generation.next().await {
            let p = match next {
                Ok(p) => p,
                Err(message) => {
                    let e = ApiError::engine_failure(message);
                    yield data(&e.body());
                    yield Ok(SseEvent::default().data("[DONE]"));
                    guard.done();
                    return;
                }
            };
            let parsed = out.parse(&p);
            let mut delta = serde_json::Map::new();
            if !parsed.reasoning.is_empty() {
                delta.insert("reasoning_content".into(), json!(parsed.reasoning));
            }
            if !parsed.content.is_empty() {
                delta.insert("content".into(), json!(parsed.content));
            }
            let calls = out.tool_calls_json(p.index, &parsed, true);
            if !calls.is_empty() {
                delta.insert("tool_calls".into(), json!(calls));
            }
            let logprobs = if out.valid.generation.sampling.logprobs.is_some() && !p.logprobs.is_empty() {
                json!({"content": chat_logprobs(&p.logprobs)})
            } else {
                Json::Null
            };
            if delta.is_empty() && logprobs.is_null() && p.finish.is_none() {
                continue;
            }
            let mut choice = json!({"index": p.index, "delta": delta, "logprobs": logprobs, "finish_reason": null});
            if let Some(finish) = &p.finish {
                choice["finish_reason"] = json!(out.finish_reason(p.index, finish.reason));
                choice["stop_reason"] = finish.stop_reason.clone();
            }
            yield data(&out.chunk(json!([choice]), continuous.then(|| usage_json(&generation))));
        }
        if include_usage {
            yield data(&out.chunk(json!([]), Some(usage_json(&generation))));
        }
        yield Ok(SseEvent::default().data("[DONE]"));
        guard.done();
    }
}

async fn collect(
    mut out: ChatOutput,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> Result<Response, ApiError> {
    let n = out.valid.generation.n;
    let mut reasoning = vec![String::new(); n];
    let mut content = vec![String::new(); n];
    let mut calls: Vec<Vec<Json>> = vec![Vec::new(); n];
    let mut logprobs: Vec<Vec<Json>> = vec![Vec::new(); n];
    let mut finish: Vec<(Json, Json)> = vec![(Json::Null, Json::Null); n];
    while let Some(next) = generation.next().await {
        let p = next.map_err(ApiError::engine_failure)?;
        let parsed = out.parse(&p);
        reasoning[p.index].push_str(&parsed.reasoning);
        content[p.index].push_str(&parsed.content);
        let new_calls = out.tool_calls_json(p.index, &parsed, false);
        calls[p.index].extend(new_calls);
        logprobs[p.index].extend(chat_logprobs(&p.logprobs));
        if let Some(f) = &p.finish {
            finish[p.index] = (
                json!(out.finish_reason(p.index, f.reason)),
                f.stop_reason.clone(),
            );
        }
    }
    guard.done();
    let want_logprobs = out.valid.generation.sampling.logprobs.is_some();
    let choices: Vec<Json> = (0..n)
        .map(|i| {
            let text = std::mem::take(&mut content[i]);
            // With tool calls, whitespace-only content is no content (vLLM).
            let content = if text.is_empty() || (!calls[i].is_empty() && text.trim().is_empty()) {
                Json::Null
            } else {
                json!(text)
            };
            let reasoning = if reasoning[i].is_empty() { Json::Null } else { json!(reasoning[i]) };
            json!({
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "reasoning_content": reasoning,
                    "tool_calls": calls[i],
                },
                "logprobs": if want_logprobs { json!({"content": logprobs[i]}) } else { Json::Null },
                "finish_reason": finish[i].0,
                "stop_reason": finish[i].1,
            })
        })
        .collect();
    let body = json!({
        "id": out.id,
        "object": "chat.completion",
        "created": out.created,
        "model": out.model,
        "choices": choices,
        "usage": usage_json(&generation),
    });
    Ok(axum::Json(body).into_response())
}
