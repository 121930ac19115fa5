//! `POST /v1/completions`: a text prompt, a token-id prompt, or a list of
//! either (one choice group per prompt, `n` choices each, as in vLLM).

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::Response;
use futures_util::Stream;
use serde_json::Value as Json;

use crate::app::{answer, unix_now, RequestId, SharedState};
use crate::chat::json_response;
use crate::error::ApiError;
use crate::generate::{completion_logprobs, Generation, PromptSpec};
use crate::openai::{GenerationRequest, Prompt};
use crate::responses::{Chunk, Completion, CompletionChoice, CompletionChunkChoice, Usage};
use crate::sse::{
    closing, data, next_progress, sse_response, DisconnectGuard, SseItem, StreamOptions,
};
use crate::timeline::Timeline;
use crate::validate::{
    resolve_max_tokens, token_ids, validate_completion, ValidCompletion, ValidationError, MAX_N,
};

pub async fn handle(State(state): State<SharedState>, req: Request) -> Response {
    answer(state, req, run).await
}

/// Prompt ids and the text `echo` repeats.
fn prompts(
    state: &SharedState,
    prompt: &Prompt,
    add_special_tokens: bool,
) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let vocab_size = state.model.vocab_size;
    let from_ids = |ids: &[i64]| -> Result<(Vec<u32>, String), ApiError> {
        let ids = token_ids("prompt", ids, vocab_size)?;
        let text = state
            .model
            .tokenizer
            .decode(&ids, false)
            .unwrap_or_default();
        Ok((ids, text))
    };
    let from_text = |text: &str| -> Result<(Vec<u32>, String), ApiError> {
        let ids = state
            .model
            .encode(text, add_special_tokens)
            .map_err(ApiError::internal)?;
        Ok((ids, text.to_string()))
    };
    let list = match prompt {
        Prompt::Text(t) => vec![from_text(t)?],
        Prompt::Tokens(ids) => vec![from_ids(ids)?],
        Prompt::Texts(ts) => ts.iter().map(|t| from_text(t)).collect::<Result<_, _>>()?,
        Prompt::TokenLists(ls) => ls.iter().map(|l| from_ids(l)).collect::<Result<_, _>>()?,
    };
    if list.is_empty() {
        return Err(ValidationError::EmptyPrompt.into());
    }
    Ok(list)
}

async fn run(
    state: SharedState,
    request_id: RequestId,
    req: GenerationRequest,
    _body: Bytes,
    mut timeline: Timeline,
) -> Result<Response, ApiError> {
    let state = &state;
    let valid = validate_completion(&req, &state.model.defaults, state.model.vocab_size)?;
    state.check_accepting()?;
    let prompt = req.prompt.as_ref().expect("validated");
    let prompts = prompts(state, prompt, valid.add_special_tokens)?;
    timeline.mark("tokenized");
    // A batch of prompts multiplies n: bound the engine requests one HTTP
    // request may create, as n alone is bounded.
    let n = valid.generation.n;
    if prompts.len() * n > MAX_N as usize {
        return Err(ValidationError::TooManyChoices {
            prompts: prompts.len(),
            n,
            max: MAX_N as usize,
        }
        .into());
    }
    let max_model_len = state.max_model_len()?;
    let mut specs = Vec::new();
    for (ids, _) in &prompts {
        let max_tokens = resolve_max_tokens(&valid.generation, ids.len(), max_model_len)
            .map_err(|e| ApiError::from(e).with_param("prompt"))?;
        specs.push(PromptSpec {
            ids: ids.clone(),
            max_tokens,
            snapshot_points: Vec::new(),
        });
    }
    let echoes: Vec<String> = if valid.echo {
        prompts.into_iter().map(|(_, text)| text).collect()
    } else {
        Vec::new()
    };
    let mut generation = Generation::submit(
        &state.engine,
        state.model.tokenizer.clone(),
        &state.model.eos_token_ids,
        specs,
        &valid.generation,
    )?;
    timeline.mark("submitted");
    generation.set_timeline(timeline, &request_id.0);
    request_id.log_submitted(&generation);
    let out = CompletionOutput {
        id: format!("cmpl-{request_id}"),
        created: unix_now(),
        model: state.served_model_name.clone(),
        echoes,
        valid,
    };
    let guard = DisconnectGuard::new(state.clone(), &request_id.0);
    if out.valid.generation.stream {
        Ok(sse_response(state, stream(out, generation, guard)))
    } else {
        collect(out, generation, guard).await
    }
}

struct CompletionOutput {
    id: String,
    created: u64,
    model: String,
    /// Per prompt, the text to repeat before the output (`echo`).
    echoes: Vec<String>,
    valid: ValidCompletion,
}

impl CompletionOutput {
    fn echo(&self, choice: usize) -> &str {
        self.echoes
            .get(choice / self.valid.generation.n)
            .map(String::as_str)
            .unwrap_or("")
    }
}

fn usage(generation: &Generation, n: usize) -> Usage {
    // Each prompt counts once however many choices it has.
    let prompt: usize = generation.prompt_tokens.iter().step_by(n).sum();
    // Like the prompt, the first choice of each prompt counts.
    let cached: usize = generation
        .choices
        .iter()
        .step_by(n)
        .map(|c| c.cached_tokens)
        .sum();
    Usage::new(prompt, generation.completion_tokens(), cached)
}

impl CompletionOutput {
    fn chunk(&self, choices: Vec<CompletionChunkChoice>, usage: Option<Usage>) -> String {
        let chunk = Chunk {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices,
            usage,
            prompt_token_ids: None,
        };
        serde_json::to_string(&chunk).expect("serializable")
    }
}

fn stream(
    out: CompletionOutput,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> impl Stream<Item = SseItem> {
    async_stream::stream! {
        let StreamOptions { n, include_usage, continuous_usage: continuous, logprobs: want_logprobs, token_ids: want_token_ids } =
            StreamOptions::of(&out.valid.generation);
        let mut offsets = vec![0usize; generation.choices.len()];
        let mut echoed = vec![false; generation.choices.len()];
        let mut prompt_ids_sent = vec![false; generation.choices.len()];
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
            let mut text = String::new();
            if !echoed[p.index] {
                echoed[p.index] = true;
                text.push_str(out.echo(p.index));
            }
            let echo_len = text.len();
            text.push_str(&p.text);
            let logprobs = if want_logprobs { completion_logprobs(&p.logprobs, offsets[p.index] + echo_len) } else { Json::Null };
            offsets[p.index] += text.len();
            let prompt_token_ids = (want_token_ids && !prompt_ids_sent[p.index]).then(|| {
                prompt_ids_sent[p.index] = true;
                generation.prompt_ids[p.index].clone()
            });
            let choice = CompletionChunkChoice {
                index: p.index,
                text,
                logprobs,
                finish_reason: p.finish.as_ref().map(|f| f.reason),
                stop_reason: p.finish.as_ref().map(|f| f.stop_reason.clone()),
                prompt_token_ids,
                token_ids: want_token_ids.then_some(p.token_ids),
            };
            yield data(out.chunk(vec![choice], continuous.then(|| usage(&generation, n))));
        }
        let usage_chunk = include_usage.then(|| out.chunk(vec![], Some(usage(&generation, n))));
        for event in closing(usage_chunk, &mut guard) {
            yield event;
        }
    }
}

async fn collect(
    out: CompletionOutput,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> Result<Response, ApiError> {
    let count = generation.choices.len();
    let mut texts: Vec<String> = (0..count).map(|i| out.echo(i).to_string()).collect();
    let mut logprobs: Vec<Vec<crate::generate::TokenLogprob>> = vec![Vec::new(); count];
    let mut token_ids: Vec<Vec<u32>> = vec![Vec::new(); count];
    let mut finish: Vec<(Option<&'static str>, Json)> = vec![(None, Json::Null); count];
    while let Some(next) = generation.next().await {
        let p = next.map_err(ApiError::engine_failure)?;
        texts[p.index].push_str(&p.text);
        logprobs[p.index].extend(p.logprobs);
        token_ids[p.index].extend(p.token_ids);
        if let Some(f) = p.finish {
            finish[p.index] = (Some(f.reason), f.stop_reason);
        }
    }
    guard.done();
    let want_logprobs = out.valid.generation.sampling.logprobs.is_some();
    let want_token_ids = out.valid.generation.return_token_ids;
    let choices: Vec<CompletionChoice> = (0..count)
        .map(|i| CompletionChoice {
            index: i,
            text: std::mem::take(&mut texts[i]),
            logprobs: if want_logprobs {
                completion_logprobs(&logprobs[i], out.echo(i).len())
            } else {
                Json::Null
            },
            finish_reason: finish[i].0,
            stop_reason: Some(finish[i].1.clone()),
            token_ids: want_token_ids.then(|| std::mem::take(&mut token_ids[i])),
            prompt_token_ids: want_token_ids.then(|| generation.prompt_ids[i].clone()),
        })
        .collect();
    let body = Completion {
        id: &out.id,
        object: "text_completion",
        created: out.created,
        model: &out.model,
        choices,
        usage: usage(&generation, out.valid.generation.n),
        prompt_token_ids: None,
    };
    Ok(json_response(&body))
}
