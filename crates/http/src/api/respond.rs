//! The one path from a submitted [`Generation`] to its response, shared by
//! chat and completions: a whole JSON body or vLLM's SSE stream, usage (on
//! the body; on a final chunk, and on every chunk, as `stream_options`
//! asks), finish and stop reasons, logprobs and token ids per choice, and
//! the disconnect guard. An [`Endpoint`] adds only what differs: how it
//! reads a choice's text (chat splits reasoning, content and tool calls;
//! completions repeat the prompt with `echo`) and the shapes of its
//! choices.

use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Serialize;
use serde_json::Value as Json;

use super::generate::{Finish, Generation, Progress, TokenLogprob};
use super::request_id::RequestId;
use super::sse::{closing, data, next_progress, sse_response, DisconnectGuard, SseItem};
use super::state::SharedState;
use crate::openai::response::{unix_now, Chunk, Completion, Usage};
use crate::openai::validate::ValidGeneration;
use crate::openai::ApiError;

/// What a response sends besides the choices' text, as the request asked.
#[derive(Clone, Copy, Debug)]
pub struct ResponseOptions {
    /// Choices per prompt.
    pub n: usize,
    pub stream: bool,
    /// A final usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Usage on every chunk too (`continuous_usage_stats`, with usage).
    pub continuous_usage: bool,
    pub logprobs: bool,
    /// vLLM's `return_token_ids`.
    pub token_ids: bool,
}

impl ResponseOptions {
    pub fn of(g: &ValidGeneration) -> Self {
        ResponseOptions {
            n: g.n,
            stream: g.stream,
            include_usage: g.include_usage,
            continuous_usage: g.include_usage && g.continuous_usage,
            logprobs: g.sampling.logprobs.is_some(),
            token_ids: g.return_token_ids,
        }
    }
}

/// The fields every body and chunk of one response repeat.
pub struct ResponseHead {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHead {
    /// `<prefix><request id>` (vLLM's `chatcmpl-`/`cmpl-` ids), created now.
    pub fn new(prefix: &str, request_id: &RequestId, state: &SharedState) -> Self {
        ResponseHead {
            id: format!("{prefix}{request_id}"),
            created: unix_now(),
            model: state.served_model_name.clone(),
        }
    }

    fn chunk_text<E: Endpoint>(
        &self,
        choices: Vec<E::ChunkChoice>,
        usage: Option<Usage>,
        prompt_token_ids: Option<Vec<u32>>,
    ) -> String {
        let chunk = Chunk {
            id: &self.id,
            object: E::CHUNK_OBJECT,
            created: self.created,
            model: &self.model,
            choices,
            usage,
            prompt_token_ids,
        };
        serde_json::to_string(&chunk).expect("serializable")
    }
}

/// One progress of a choice as an endpoint sees it: its text already read
/// by the endpoint, its finish reason resolved.
pub struct Update<T> {
    pub index: usize,
    /// The choice's first update (what goes out once per choice goes with it).
    pub first: bool,
    pub text: T,
    pub logprobs: Vec<TokenLogprob>,
    pub token_ids: Vec<u32>,
    /// On the choice's last update: its finish reason and vLLM's
    /// `stop_reason` (the stop string or token id, else null).
    pub finish: Option<(&'static str, Json)>,
}

/// Everything of one choice, for a whole response.
#[derive(Default)]
pub struct Gathered<T> {
    pub text: T,
    pub logprobs: Vec<TokenLogprob>,
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Json,
}

/// What an endpoint adds to the shared response path.
pub trait Endpoint: Send + 'static {
    /// `object` of a whole response.
    const OBJECT: &'static str;
    /// `object` of a stream chunk.
    const CHUNK_OBJECT: &'static str;
    /// A choice's text as the endpoint reads it; a whole response appends
    /// the pieces with [`Endpoint::append`].
    type Text: Default + Send;
    type Choice: Serialize;
    type ChunkChoice: Serialize + Send;

    /// Reads the text of one progress of choice `index` (`last`: its final
    /// one; `streaming`: for a stream chunk).
    fn read_text(
        &mut self,
        index: usize,
        first: bool,
        text: &str,
        last: bool,
        streaming: bool,
    ) -> Self::Text;

    fn append(whole: &mut Self::Text, more: Self::Text);

    /// The `finish_reason` of a choice that ended so (after its last text
    /// was read).
    fn finish_reason(&self, _index: usize, finish: &Finish) -> &'static str {
        finish.reason
    }

    /// Stream chunks before any output, each with the chunk's
    /// `prompt_token_ids`.
    fn opening(
        &self,
        _generation: &Generation,
        _opts: &ResponseOptions,
    ) -> Vec<(Self::ChunkChoice, Option<Vec<u32>>)> {
        Vec::new()
    }

    /// An update as a stream chunk's choice (`None`: nothing to send).
    fn chunk_choice(
        &mut self,
        update: Update<Self::Text>,
        opts: &ResponseOptions,
        generation: &Generation,
    ) -> Option<Self::ChunkChoice>;

    /// A whole response's choice `index`.
    fn choice(
        &self,
        index: usize,
        gathered: Gathered<Self::Text>,
        opts: &ResponseOptions,
        generation: &Generation,
    ) -> Self::Choice;

    /// The whole response's `prompt_token_ids`, when the endpoint puts it
    /// there rather than on its choices.
    fn prompt_token_ids(
        &self,
        _generation: &Generation,
        _opts: &ResponseOptions,
    ) -> Option<Vec<u32>> {
        None
    }
}

/// Answers with the generation's output: streamed when the request asked,
/// else one JSON body once every choice finished.
pub async fn respond<E: Endpoint>(
    state: &SharedState,
    request_id: &RequestId,
    head: ResponseHead,
    endpoint: E,
    generation: Generation,
    valid: &ValidGeneration,
) -> Result<Response, ApiError> {
    let guard = DisconnectGuard::new(state.clone(), &request_id.0);
    let opts = ResponseOptions::of(valid);
    if opts.stream {
        Ok(sse_response(
            state,
            stream(head, endpoint, generation, guard, opts),
        ))
    } else {
        collect(head, endpoint, generation, guard, opts).await
    }
}

/// Reads a progress through the endpoint: its text first (chat's finish
/// reason depends on what the text held), then its finish.
fn read<E: Endpoint>(
    endpoint: &mut E,
    started: &mut [bool],
    p: Progress,
    streaming: bool,
) -> Update<E::Text> {
    let first = !std::mem::replace(&mut started[p.index], true);
    let last = p.finish.is_some();
    let text = endpoint.read_text(p.index, first, &p.text, last, streaming);
    let finish = p
        .finish
        .map(|f| (endpoint.finish_reason(p.index, &f), f.stop_reason));
    Update {
        index: p.index,
        first,
        text,
        logprobs: p.logprobs,
        token_ids: p.token_ids,
        finish,
    }
}

fn stream<E: Endpoint>(
    head: ResponseHead,
    mut endpoint: E,
    mut generation: Generation,
    mut guard: DisconnectGuard,
    opts: ResponseOptions,
) -> impl Stream<Item = SseItem> {
    async_stream::stream! {
        let usage = |g: &Generation| opts.continuous_usage.then(|| g.usage());
        for (choice, prompt_token_ids) in endpoint.opening(&generation, &opts) {
            yield data(head.chunk_text::<E>(vec![choice], usage(&generation), prompt_token_ids));
        }
        let mut started = vec![false; generation.choices.len()];
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
            let update = read(&mut endpoint, &mut started, p, true);
            if let Some(choice) = endpoint.chunk_choice(update, &opts, &generation) {
                yield data(head.chunk_text::<E>(vec![choice], usage(&generation), None));
            }
        }
        let usage_chunk = opts
            .include_usage
            .then(|| head.chunk_text::<E>(vec![], Some(generation.usage()), None));
        for event in closing(usage_chunk, &mut guard) {
            yield event;
        }
    }
}

async fn collect<E: Endpoint>(
    head: ResponseHead,
    mut endpoint: E,
    mut generation: Generation,
    mut guard: DisconnectGuard,
    opts: ResponseOptions,
) -> Result<Response, ApiError> {
    let count = generation.choices.len();
    let mut gathered: Vec<Gathered<E::Text>> = (0..count).map(|_| Gathered::default()).collect();
    let mut started = vec![false; count];
    while let Some(next) = generation.next().await {
        let p = next?;
        let update = read(&mut endpoint, &mut started, p, false);
        let choice = &mut gathered[update.index];
        E::append(&mut choice.text, update.text);
        choice.logprobs.extend(update.logprobs);
        choice.token_ids.extend(update.token_ids);
        if let Some((reason, stop_reason)) = update.finish {
            choice.finish_reason = Some(reason);
            choice.stop_reason = stop_reason;
        }
    }
    guard.done();
    let choices: Vec<E::Choice> = gathered
        .into_iter()
        .enumerate()
        .map(|(index, g)| endpoint.choice(index, g, &opts, &generation))
        .collect();
    let body = Completion {
        id: &head.id,
        object: E::OBJECT,
        created: head.created,
        model: &head.model,
        choices,
        usage: generation.usage(),
        prompt_token_ids: endpoint.prompt_token_ids(&generation, &opts),
    };
    Ok(json_response(&body))
}

/// A JSON body serialized straight from the struct (field order kept).
pub fn json_response<T: Serialize>(body: &T) -> Response {
    let text = serde_json::to_string(body).expect("serializable");
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}
