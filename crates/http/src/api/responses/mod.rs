//! `POST /v1/responses` (OpenAI's Responses API as vLLM serves it): the
//! request is translated into a chat request ([`crate::openai::responses`])
//! and submitted through chat's path ([`super::chat::submit`]: template,
//! tools, reasoning, structured outputs, sampling); its output is read by
//! chat's parser into output items ([`output`]) and answered as one
//! `response` object or as the typed event stream ([`stream`]). With
//! `store` the conversation is kept for `previous_response_id`
//! ([`super::response_store`]).

pub mod output;
pub mod stream;

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{json, Map, Value as Json};

use super::chat::{submit, SubmittedChat};
use super::generate::Generation;
use super::request_id::RequestId;
use super::respond::json_response;
use super::sse::DisconnectGuard;
use super::state::{AppState, SharedState};
use super::timeline::Timeline;
use crate::openai::decode::decode_json;
use crate::openai::request::GenerationRequest;
use crate::openai::response::{random_id, unix_now};
use crate::openai::responses::{responses_param, to_chat, ResponsesRequest};
use crate::openai::ApiError;
use crate::text::outparse::ChatOutputParser;
use output::{as_messages, Output};

/// What every response object of one request repeats.
pub struct Head {
    pub id: String,
    created_at: u64,
    /// The request's echoed fields (instructions, tools, sampling, ...).
    echo: Map<String, Json>,
    /// The conversation to store with the output (`None`: `store: false`).
    store: Option<Vec<Json>>,
}

impl Head {
    /// The `response` object in `status` with `output` (and `usage` once
    /// known).
    pub fn response(&self, status: &str, output: &[Json], usage: Option<Json>) -> Json {
        let mut r = self.echo.clone();
        r.insert("id".into(), self.id.clone().into());
        r.insert("object".into(), "response".into());
        r.insert("created_at".into(), self.created_at.into());
        r.insert("status".into(), status.into());
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        r.insert("incomplete_details".into(), incomplete.into());
        r.insert("error".into(), Json::Null);
        r.insert("output".into(), output.to_vec().into());
        r.insert("usage".into(), usage.into());
        Json::Object(r)
    }
}

/// The fields of the request a response object repeats (OpenAI's
/// `Response` carries them back), with their defaults.
fn echo(req: &ResponsesRequest, raw: &Map<String, Json>, model: &str) -> Map<String, Json> {
    let get = |k: &str, default: Json| raw.get(k).cloned().unwrap_or(default);
    let mut m = Map::new();
    m.insert("model".into(), model.into());
    m.insert("instructions".into(), req.instructions.clone().into());
    m.insert("max_output_tokens".into(), req.max_output_tokens.into());
    m.insert(
        "previous_response_id".into(),
        req.previous_response_id.clone().into(),
    );
    m.insert("temperature".into(), get("temperature", Json::Null));
    m.insert("top_p".into(), get("top_p", Json::Null));
    m.insert("tools".into(), get("tools", json!([])));
    m.insert("tool_choice".into(), get("tool_choice", "auto".into()));
    m.insert(
        "parallel_tool_calls".into(),
        req.parallel_tool_calls.unwrap_or(true).into(),
    );
    m.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    m.insert("reasoning".into(), get("reasoning", Json::Null));
    m.insert("metadata".into(), get("metadata", Json::Null));
    m.insert("user".into(), req.user.clone().into());
    m.insert("store".into(), req.store.unwrap_or(true).into());
    m.insert("background".into(), false.into());
    m.insert(
        "truncation".into(),
        req.truncation.as_deref().unwrap_or("disabled").into(),
    );
    m.insert("service_tier".into(), "auto".into());
    m
}

/// Answers a Responses request (the route has read the body and started
/// the timeline).
pub async fn run(
    state: SharedState,
    request_id: RequestId,
    bytes: Bytes,
    timeline: Timeline,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = decode_json(&bytes)?;
    let raw: Map<String, Json> = decode_json(&bytes)?;
    state.check_model(req.model.as_deref())?;
    let history = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => state
            .responses
            .get(id)
            .ok_or_else(|| ApiError::previous_response_not_found(id))?,
    };
    let translated = to_chat(&req, &raw, history)?;
    let chat_bytes = serde_json::to_vec(&translated.body).map_err(ApiError::internal)?;
    let submitted = async {
        let chat_req: GenerationRequest = decode_json(&chat_bytes)?;
        submit(&state, &request_id, &chat_req, &chat_bytes, timeline).await
    }
    .await
    .map_err(|mut e| {
        e.param = e.param.as_deref().map(responses_param);
        e
    })?;
    let head = Head {
        id: random_id("resp_"),
        created_at: unix_now(),
        echo: echo(&req, &raw, &state.served_model_name),
        store: req.store.unwrap_or(true).then_some(translated.conversation),
    };
    let reader = Reader::new(&submitted);
    let guard = DisconnectGuard::new(state.clone(), &request_id.0);
    if req.stream.unwrap_or(false) {
        Ok(stream::respond(
            state.clone(),
            head,
            reader,
            submitted.generation,
            guard,
        ))
    } else {
        collect(&state, head, reader, submitted.generation, guard).await
    }
}

/// Reads the generation's text into output items.
pub struct Reader {
    parser: ChatOutputParser,
    pub output: Output,
}

impl Reader {
    fn new(submitted: &SubmittedChat) -> Self {
        Reader {
            parser: ChatOutputParser::new(
                submitted.opens_reasoning,
                submitted.valid.include_reasoning,
                submitted.tools.clone(),
            ),
            output: Output::default(),
        }
    }

    /// Reads one progress's text (`last`: the final one, whose `reason`
    /// is "stop" or "length"); returns the response's status once done.
    pub fn read(&mut self, text: &str, finish: Option<&str>) -> Option<&'static str> {
        let delta = self.parser.feed(text);
        self.output.add(delta);
        let reason = finish?;
        let rest = self.parser.finish();
        self.output.add(rest);
        let status = if reason == "length" {
            "incomplete"
        } else {
            "completed"
        };
        self.output.finish(status);
        Some(status)
    }
}

/// `usage` in the Responses shape.
pub fn usage(state: &AppState, generation: &Generation, reasoning: &str) -> Json {
    let u = generation.usage();
    let reasoning_tokens = if reasoning.is_empty() {
        0
    } else {
        state
            .model
            .encode(reasoning, false)
            .map(|ids| ids.len())
            .unwrap_or(0)
            .min(u.completion_tokens)
    };
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": u.total_tokens,
    })
}

/// Keeps the finished response's conversation, when it is to be stored.
pub fn keep(state: &AppState, head: &mut Head, output: &[Json]) {
    if let Some(mut conversation) = head.store.take() {
        conversation.extend(as_messages(output));
        state.responses.put(head.id.clone(), conversation);
    }
}

async fn collect(
    state: &SharedState,
    mut head: Head,
    mut reader: Reader,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> Result<Response, ApiError> {
    let mut status = "completed";
    while let Some(next) = generation.next().await {
        let p = next?;
        let finish = p.finish.as_ref().map(|f| f.reason);
        if let Some(s) = reader.read(&p.text, finish) {
            status = s;
        }
    }
    guard.done();
    let output = &reader.output.items;
    let usage = usage(state, &generation, &reader.output.reasoning);
    keep(state, &mut head, output);
    Ok(json_response(&head.response(status, output, Some(usage))))
}
