//! `POST /v1/chat/completions`: validate, render the chat template,
//! tokenize, submit one engine request per choice, then answer as one JSON
//! body or as vLLM's SSE stream.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use minijinja::value::Value;
use serde_json::Value as Json;

use crate::app::{answer, decode_json, random_id, unix_now, AppState, RequestId, SharedState};
use crate::error::ApiError;
use crate::generate::{Generation, Progress, PromptSpec};
use crate::openai::{ChatTemplateView, GenerationRequest};
use crate::outparse::{tool_schemas, ChatOutputParser, ParsedDelta};
use crate::preamble::preamble_end;
use crate::responses::{
    chat_logprobs, ChatChoice, ChatLogprobs, Chunk, ChunkChoice, Completion, Delta, FunctionOut,
    LogprobOut, Message, ToolCallOut, Usage,
};
use crate::sse::{
    closing, data, next_progress, sse_response, DisconnectGuard, SseItem, StreamOptions,
};
use crate::template::{decode_tool_call_arguments, RenderInput, TemplateError};
use crate::timeline::Timeline;
use crate::validate::{resolve_max_tokens, validate_chat, ValidChat, ValidationError};

pub async fn handle(State(state): State<SharedState>, req: Request) -> Response {
    answer(state, req, run).await
}

/// The rendered prompt of a chat request and how its output starts.
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
    /// The prompt ends inside `<think>`: the output starts as reasoning.
    pub opens_reasoning: bool,
    /// Where the system and tools preamble ends in `ids` (a snapshot point
    /// for the prefix cache, see [`crate::preamble`]).
    pub preamble_end: Option<usize>,
}

/// Renders `messages` (and `tools`) of the request body with the model's
/// template, as transformers' `apply_chat_template` would, and tokenizes;
/// with `find_preamble`, also finds where the preamble ends (only a prompt
/// the prefix cache will see needs it).
pub fn render_chat(
    state: &AppState,
    body: &[u8],
    add_generation_prompt: bool,
    continue_final_message: bool,
    kwargs: Option<&serde_json::Map<String, Json>>,
    find_preamble: bool,
    timeline: &mut Timeline,
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
    timeline.mark("templated");
    let ids = state
        .model
        .encode(&text, false)
        .map_err(ApiError::internal)?;
    timeline.mark("tokenized");
    let opens_reasoning = text.trim_end_matches('\n').ends_with("<think>");
    let preamble_end = find_preamble
        .then(|| {
            preamble_end(
                &state.model.template,
                |text| state.model.encode(text, false),
                &view.messages,
                view.tools.as_ref(),
                &kwargs,
                &text,
                &ids,
            )
        })
        .flatten();
    Ok(RenderedChat {
        text,
        ids,
        opens_reasoning,
        preamble_end,
    })
}

async fn run(
    state: SharedState,
    request_id: RequestId,
    req: GenerationRequest,
    bytes: Bytes,
    mut timeline: Timeline,
) -> Result<Response, ApiError> {
    let state = &state;
    let valid = validate_chat(&req, &state.model.defaults, state.model.vocab_size)?;
    state.check_accepting()?;
    let rendered = render_chat(
        state,
        &bytes,
        valid.add_generation_prompt,
        valid.continue_final_message,
        req.chat_template_kwargs.as_ref(),
        state.prefix_caching,
        &mut timeline,
    )?;
    let max_model_len = state.max_model_len()?;
    let max_tokens = resolve_max_tokens(&valid.generation, rendered.ids.len(), max_model_len)?;
    let mut generation = Generation::submit(
        &state.engine,
        state.model.tokenizer.clone(),
        &state.model.eos_token_ids,
        vec![PromptSpec {
            ids: rendered.ids,
            max_tokens,
            snapshot_points: rendered.preamble_end.into_iter().collect(),
        }],
        &valid.generation,
    )?;
    timeline.mark("submitted");
    generation.set_timeline(timeline, &request_id.0);
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
    request_id.log_submitted(&generation);
    let out = ChatOutput {
        id: format!("chatcmpl-{request_id}"),
        created: unix_now(),
        model: state.served_model_name.clone(),
        parsers,
        tool_call_counts: vec![0; valid.generation.n],
        valid,
    };
    let guard = DisconnectGuard::new(state.clone(), &request_id.0);
    if out.valid.generation.stream {
        Ok(sse_response(state, stream(out, generation, guard)))
    } else {
        collect(out, generation, guard).await
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

    fn tool_calls(
        &mut self,
        index: usize,
        delta: &ParsedDelta,
        streaming: bool,
    ) -> Vec<ToolCallOut> {
        delta
            .tool_calls
            .iter()
            .map(|call| {
                let k = self.tool_call_counts[index];
                self.tool_call_counts[index] += 1;
                ToolCallOut {
                    id: random_id("chatcmpl-tool-"),
                    kind: "function",
                    index: streaming.then_some(k),
                    function: FunctionOut {
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                    },
                }
            })
            .collect()
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Chunk<'_, ChunkChoice> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices,
            usage,
            prompt_token_ids: None,
        }
    }

    fn chunk_text(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
        serde_json::to_string(&self.chunk(choices, usage)).expect("serializable")
    }
}

fn usage(generation: &Generation) -> Usage {
    // n choices share one prompt: it counts once, as in vLLM.
    Usage::new(
        generation.prompt_tokens.first().copied().unwrap_or(0),
        generation.completion_tokens(),
        generation.choices.first().map_or(0, |c| c.cached_tokens),
    )
}

fn stream(
    mut out: ChatOutput,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> impl Stream<Item = SseItem> {
    async_stream::stream! {
        let StreamOptions { n, include_usage, continuous_usage: continuous, logprobs: want_logprobs, token_ids: want_token_ids } =
            StreamOptions::of(&out.valid.generation);
        for index in 0..n {
            let delta = Delta { role: Some("assistant"), content: Some(String::new()), ..Default::default() };
            let choice = ChunkChoice { index, delta, logprobs: None, finish_reason: None, stop_reason: None, token_ids: None };
            let mut chunk = out.chunk(vec![choice], continuous.then(|| usage(&generation)));
            // vLLM: the prompt's ids ride on each choice's first (role) chunk.
            if want_token_ids {
                chunk.prompt_token_ids = Some(generation.prompt_ids[index].clone());
            }
            yield data(serde_json::to_string(&chunk).expect("serializable"));
        }
        while let Some(next) = next_progress(&mut generation, &mut guard).await {
            let p = match next {
                Ok(p) => p,
                Err(end) => {
                    for event in end {
                        yield event;
                    }
                    return;
                }
            };
            let parsed = out.parse(&p);
            let delta = Delta {
                role: None,
                content: (!parsed.content.is_empty()).then(|| parsed.content.clone()),
                reasoning_content: (!parsed.reasoning.is_empty()).then(|| parsed.reasoning.clone()),
                tool_calls: out.tool_calls(p.index, &parsed, true),
            };
            let logprobs = (want_logprobs && !p.logprobs.is_empty()).then(|| ChatLogprobs { content: chat_logprobs(&p.logprobs) });
            // With return_token_ids (the only way token_ids are filled)
            // every token is reported, even one whose text is held back (vLLM).
            if delta.is_empty() && logprobs.is_none() && p.finish.is_none() && p.token_ids.is_empty() {
                continue;
            }
            let choice = ChunkChoice {
                index: p.index,
                delta,
                logprobs,
                finish_reason: p.finish.as_ref().map(|f| out.finish_reason(p.index, f.reason)),
                stop_reason: p.finish.as_ref().map(|f| f.stop_reason.clone()),
                token_ids: want_token_ids.then(|| p.token_ids.clone()),
            };
            yield data(out.chunk_text(vec![choice], continuous.then(|| usage(&generation))));
        }
        let usage_chunk = include_usage.then(|| out.chunk_text(vec![], Some(usage(&generation))));
        for event in closing(usage_chunk, &mut guard) {
            yield event;
        }
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
    let mut calls: Vec<Vec<ToolCallOut>> = vec![Vec::new(); n];
    let mut logprobs: Vec<Vec<LogprobOut>> = vec![Vec::new(); n];
    let mut token_ids: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut finish: Vec<(Option<&'static str>, Json)> = vec![(None, Json::Null); n];
    while let Some(next) = generation.next().await {
        let p = next.map_err(ApiError::engine_failure)?;
        let parsed = out.parse(&p);
        reasoning[p.index].push_str(&parsed.reasoning);
        content[p.index].push_str(&parsed.content);
        let new_calls = out.tool_calls(p.index, &parsed, false);
        calls[p.index].extend(new_calls);
        logprobs[p.index].extend(chat_logprobs(&p.logprobs));
        token_ids[p.index].extend_from_slice(&p.token_ids);
        if let Some(f) = &p.finish {
            finish[p.index] = (
                Some(out.finish_reason(p.index, f.reason)),
                f.stop_reason.clone(),
            );
        }
    }
    guard.done();
    let want_logprobs = out.valid.generation.sampling.logprobs.is_some();
    let want_token_ids = out.valid.generation.return_token_ids;
    let choices: Vec<ChatChoice> = (0..n)
        .map(|i| {
            let text = std::mem::take(&mut content[i]);
            let tool_calls = std::mem::take(&mut calls[i]);
            // With tool calls, whitespace-only content is no content (vLLM).
            let content = if text.is_empty() || (!tool_calls.is_empty() && text.trim().is_empty()) {
                None
            } else {
                Some(text)
            };
            let reasoning = Some(std::mem::take(&mut reasoning[i])).filter(|r| !r.is_empty());
            ChatChoice {
                index: i,
                message: Message {
                    role: "assistant",
                    content,
                    tool_calls,
                    reasoning_content: reasoning,
                },
                logprobs: want_logprobs.then(|| ChatLogprobs {
                    content: std::mem::take(&mut logprobs[i]),
                }),
                finish_reason: finish[i].0,
                stop_reason: finish[i].1.clone(),
                token_ids: want_token_ids.then(|| std::mem::take(&mut token_ids[i])),
            }
        })
        .collect();
    let body = Completion {
        id: &out.id,
        object: "chat.completion",
        created: out.created,
        model: &out.model,
        choices,
        usage: usage(&generation),
        prompt_token_ids: want_token_ids.then(|| generation.prompt_ids[0].clone()),
    };
    Ok(json_response(&body))
}

/// A JSON body serialized straight from the struct (field order kept).
pub fn json_response<T: serde::Serialize>(body: &T) -> Response {
    let text = serde_json::to_string(body).expect("serializable");
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}
