//! `POST /v1/chat/completions`: validate, render the chat template,
//! tokenize, submit one engine request per choice, then answer as one JSON
//! body or as vLLM's SSE stream.

use axum::body::Bytes;
use axum::response::Response;
use minijinja::value::Value;
use serde_json::Value as Json;

use super::constraint::{chat_client_constraint, chat_constraint};
use super::generate::{Finish, Generation, PromptSpec};
use super::logprobs::chat_logprobs;
use super::request_id::RequestId;
use super::respond::{respond, Endpoint, Gathered, ResponseHead, ResponseOptions, Update};
use super::state::{AppState, SharedState};
use super::timeline::Timeline;
use crate::openai::decode::decode_json;
use crate::openai::request::{ChatTemplateView, GenerationRequest};
use crate::openai::response::{
    random_id, ChatChoice, ChatLogprobs, ChunkChoice, Delta, FunctionOut, Message, ToolCallOut,
};
use crate::openai::validate::{resolve_max_tokens, validate_chat, ValidChat, ValidationError};
use crate::openai::ApiError;
use crate::text::outparse::{tool_schemas, ChatOutputParser, ToolSchemas};
use crate::text::preamble::preamble_end;
use crate::text::template::{decode_tool_call_arguments, RenderInput, TemplateError};

/// The rendered prompt of a chat request and how its output starts.
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
    /// The prompt ends inside `<think>`: the output starts as reasoning.
    pub opens_reasoning: bool,
    /// Where the system and tools preamble ends in `ids` (a snapshot point
    /// for the prefix cache, see [`crate::text::preamble`]).
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
    let template = state
        .model
        .template
        .as_ref()
        .ok_or_else(ApiError::no_chat_template)?;
    let mut view: ChatTemplateView = decode_json(body)?;
    decode_tool_call_arguments(&mut view.messages).map_err(|e| {
        ApiError::from(ValidationError::BadToolCallArguments {
            index: e.index,
            reason: e.reason,
        })
    })?;
    let kwargs: Vec<(String, Value)> = kwargs
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
        .collect();
    let text = template
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
                template,
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

/// A chat request submitted to the engine: what reads its output needs.
pub struct SubmittedChat {
    pub generation: Generation,
    pub valid: ValidChat,
    /// The prompt ends inside `<think>`: the output starts as reasoning.
    pub opens_reasoning: bool,
    /// Parameter types of the request's tools, when tool calls are parsed.
    pub tools: Option<ToolSchemas>,
}

/// Validates, renders and submits a decoded chat request (the route has
/// read the body, checked `model` and started the timeline). `/v1/responses`
/// submits through here too, with the chat body it translated.
pub async fn submit(
    state: &SharedState,
    request_id: &RequestId,
    req: &GenerationRequest,
    bytes: &[u8],
    mut timeline: Timeline,
) -> Result<SubmittedChat, ApiError> {
    let mut valid = validate_chat(req, &state.model.defaults, state.model.vocab_size)?;
    state.check_accepting()?;
    let client_constraint = chat_client_constraint(state, req, &valid)?;
    let rendered = render_chat(
        state,
        bytes,
        valid.add_generation_prompt,
        valid.continue_final_message,
        req.chat_template_kwargs.as_ref(),
        state.prefix_caching,
        &mut timeline,
    )?;
    let max_model_len = state.max_model_len()?;
    let max_tokens = resolve_max_tokens(&valid.generation, rendered.ids.len(), max_model_len)?;
    valid.generation.constraint = chat_constraint(
        state,
        req,
        &valid,
        client_constraint,
        rendered.opens_reasoning,
    )
    .await?;
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
    generation.log_submitted(request_id);
    Ok(SubmittedChat {
        generation,
        valid,
        opens_reasoning: rendered.opens_reasoning,
        tools,
    })
}

/// Answers a decoded chat request.
pub async fn run(
    state: SharedState,
    request_id: RequestId,
    req: GenerationRequest,
    bytes: Bytes,
    timeline: Timeline,
) -> Result<Response, ApiError> {
    let state = &state;
    let SubmittedChat {
        generation,
        valid,
        opens_reasoning,
        tools,
    } = submit(state, &request_id, &req, &bytes, timeline).await?;
    let parsers = (0..valid.generation.n)
        .map(|_| ChatOutputParser::new(opens_reasoning, valid.include_reasoning, tools.clone()))
        .collect();
    let endpoint = ChatEndpoint {
        parsers,
        tool_call_counts: vec![0; valid.generation.n],
        include_reasoning: valid.include_reasoning,
    };
    let head = ResponseHead::new("chatcmpl-", &request_id, state);
    respond(
        state,
        &request_id,
        head,
        endpoint,
        generation,
        &valid.generation,
    )
    .await
}

/// Chat's part of the response path: the output parsed into reasoning,
/// content and tool calls, a role chunk to open each streamed choice, and
/// `tool_calls` as the finish reason of a choice that called a tool.
struct ChatEndpoint {
    parsers: Vec<ChatOutputParser>,
    /// Tool calls so far per choice (a streamed call's `index`).
    tool_call_counts: Vec<usize>,
    include_reasoning: bool,
}

/// A choice's output as chat reads it.
#[derive(Default)]
struct ChatText {
    reasoning: String,
    content: String,
    tool_calls: Vec<ToolCallOut>,
}

impl Endpoint for ChatEndpoint {
    const OBJECT: &'static str = "chat.completion";
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";
    type Text = ChatText;
    type Choice = ChatChoice;
    type ChunkChoice = ChunkChoice;

    /// Parses the text into reasoning/content/tool calls (everything held
    /// back is released on the choice's last progress).
    fn read_text(
        &mut self,
        index: usize,
        _first: bool,
        text: &str,
        last: bool,
        streaming: bool,
    ) -> ChatText {
        let parser = &mut self.parsers[index];
        let mut delta = parser.feed(text);
        if last {
            let rest = parser.finish();
            delta.reasoning.push_str(&rest.reasoning);
            delta.content.push_str(&rest.content);
            delta.tool_calls.extend(rest.tool_calls);
        }
        // include_reasoning=false: reasoning is still split off, then dropped (vLLM).
        if !self.include_reasoning {
            delta.reasoning.clear();
        }
        let tool_calls = delta
            .tool_calls
            .into_iter()
            .map(|call| {
                let k = self.tool_call_counts[index];
                self.tool_call_counts[index] += 1;
                ToolCallOut {
                    id: random_id("chatcmpl-tool-"),
                    kind: "function",
                    index: streaming.then_some(k),
                    function: FunctionOut {
                        name: call.name,
                        arguments: call.arguments,
                    },
                }
            })
            .collect();
        ChatText {
            reasoning: delta.reasoning,
            content: delta.content,
            tool_calls,
        }
    }

    fn append(whole: &mut ChatText, more: ChatText) {
        whole.reasoning.push_str(&more.reasoning);
        whole.content.push_str(&more.content);
        whole.tool_calls.extend(more.tool_calls);
    }

    fn finish_reason(&self, index: usize, finish: &Finish) -> &'static str {
        match finish.reason {
            "stop" if self.parsers[index].saw_tool_call() => "tool_calls",
            "stop" => "stop",
            _ => "length",
        }
    }

    /// Each choice opens with a role chunk; with `return_token_ids` it
    /// carries the prompt's ids (vLLM).
    fn opening(
        &self,
        generation: &Generation,
        opts: &ResponseOptions,
    ) -> Vec<(ChunkChoice, Option<Vec<u32>>)> {
        (0..opts.n)
            .map(|index| {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Default::default()
                };
                let choice = ChunkChoice {
                    index,
                    delta,
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: None,
                };
                let prompt_ids = opts.token_ids.then(|| generation.prompt_ids[index].clone());
                (choice, prompt_ids)
            })
            .collect()
    }

    fn chunk_choice(
        &mut self,
        update: Update<ChatText>,
        opts: &ResponseOptions,
        _generation: &Generation,
    ) -> Option<ChunkChoice> {
        let text = update.text;
        let delta = Delta {
            role: None,
            content: (!text.content.is_empty()).then_some(text.content),
            reasoning_content: (!text.reasoning.is_empty()).then_some(text.reasoning),
            tool_calls: text.tool_calls,
        };
        let logprobs = (opts.logprobs && !update.logprobs.is_empty()).then(|| ChatLogprobs {
            content: chat_logprobs(&update.logprobs),
        });
        // With return_token_ids (the only way token_ids are filled)
        // every token is reported, even one whose text is held back (vLLM).
        if delta.is_empty()
            && logprobs.is_none()
            && update.finish.is_none()
            && update.token_ids.is_empty()
        {
            return None;
        }
        let (finish_reason, stop_reason) = update.finish.unzip();
        Some(ChunkChoice {
            index: update.index,
            delta,
            logprobs,
            finish_reason,
            stop_reason,
            token_ids: opts.token_ids.then_some(update.token_ids),
        })
    }

    fn choice(
        &self,
        index: usize,
        gathered: Gathered<ChatText>,
        opts: &ResponseOptions,
        _generation: &Generation,
    ) -> ChatChoice {
        let Gathered {
            text,
            logprobs,
            token_ids,
            finish_reason,
            stop_reason,
        } = gathered;
        // With tool calls, whitespace-only content is no content (vLLM).
        let content = if text.content.is_empty()
            || (!text.tool_calls.is_empty() && text.content.trim().is_empty())
        {
            None
        } else {
            Some(text.content)
        };
        let reasoning = Some(text.reasoning).filter(|r| !r.is_empty());
        ChatChoice {
            index,
            message: Message {
                role: "assistant",
                content,
                tool_calls: text.tool_calls,
                reasoning_content: reasoning,
            },
            logprobs: opts.logprobs.then(|| ChatLogprobs {
                content: chat_logprobs(&logprobs),
            }),
            finish_reason,
            stop_reason,
            token_ids: opts.token_ids.then_some(token_ids),
        }
    }

    /// Chat puts the prompt's ids on the response, not on each choice.
    fn prompt_token_ids(
        &self,
        generation: &Generation,
        opts: &ResponseOptions,
    ) -> Option<Vec<u32>> {
        opts.token_ids.then(|| generation.prompt_ids[0].clone())
    }
}
