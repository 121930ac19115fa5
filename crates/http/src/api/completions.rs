//! `POST /v1/completions`: a text prompt, a token-id prompt, or a list of
//! either (one choice group per prompt, `n` choices each, as in vLLM).

use axum::body::Bytes;
use axum::response::Response;
use serde_json::Value as Json;

use super::constraint::completion_constraint;
use super::generate::{Generation, PromptSpec};
use super::logprobs::completion_logprobs;
use super::request_id::RequestId;
use super::respond::{respond, Endpoint, Gathered, ResponseHead, ResponseOptions, Update};
use super::state::{AppState, SharedState};
use super::timeline::Timeline;
use crate::openai::request::{GenerationRequest, Prompt};
use crate::openai::response::{CompletionChoice, CompletionChunkChoice};
use crate::openai::validate::{
    resolve_max_tokens, token_ids, validate_completion, ValidationError, MAX_N,
};
use crate::openai::ApiError;

/// Prompt ids and the text `echo` repeats.
fn prompts(
    state: &AppState,
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

/// Answers a decoded completions request (the route has read the body,
/// checked `model` and started the timeline).
pub async fn run(
    state: SharedState,
    request_id: RequestId,
    req: GenerationRequest,
    _body: Bytes,
    mut timeline: Timeline,
) -> Result<Response, ApiError> {
    let state = &state;
    let mut valid = validate_completion(&req, &state.model.defaults, state.model.vocab_size)?;
    state.check_accepting()?;
    valid.generation.constraint = completion_constraint(state, &req).await?;
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
    generation.log_submitted(&request_id);
    let endpoint = CompletionsEndpoint {
        n,
        offsets: vec![0; generation.choices.len()],
        echoes,
    };
    let head = ResponseHead::new("cmpl-", &request_id, state);
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

/// Completions' part of the response path: the prompt repeated before a
/// choice's first text (`echo`), logprobs with text offsets, and the
/// prompt's ids on each choice.
struct CompletionsEndpoint {
    /// Choices per prompt.
    n: usize,
    /// Per choice, the text streamed so far (where the next chunk's
    /// logprob offsets start).
    offsets: Vec<usize>,
    /// Per prompt, the text to repeat before the output (`echo`).
    echoes: Vec<String>,
}

impl CompletionsEndpoint {
    fn echo(&self, choice: usize) -> &str {
        self.echoes
            .get(choice / self.n)
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// A choice's text, with how much of it is the repeated prompt.
#[derive(Default)]
struct CompletionText {
    text: String,
    echo_len: usize,
}

impl Endpoint for CompletionsEndpoint {
    const OBJECT: &'static str = "text_completion";
    const CHUNK_OBJECT: &'static str = "text_completion";
    type Text = CompletionText;
    type Choice = CompletionChoice;
    type ChunkChoice = CompletionChunkChoice;

    fn read_text(
        &mut self,
        index: usize,
        first: bool,
        text: &str,
        _last: bool,
        _streaming: bool,
    ) -> CompletionText {
        let echo = if first { self.echo(index) } else { "" };
        CompletionText {
            text: format!("{echo}{text}"),
            echo_len: echo.len(),
        }
    }

    fn append(whole: &mut CompletionText, more: CompletionText) {
        whole.text.push_str(&more.text);
        whole.echo_len += more.echo_len;
    }

    fn chunk_choice(
        &mut self,
        update: Update<CompletionText>,
        opts: &ResponseOptions,
        generation: &Generation,
    ) -> Option<CompletionChunkChoice> {
        let index = update.index;
        let CompletionText { text, echo_len } = update.text;
        let logprobs = if opts.logprobs {
            completion_logprobs(&update.logprobs, self.offsets[index] + echo_len)
        } else {
            Json::Null
        };
        self.offsets[index] += text.len();
        let (finish_reason, stop_reason) = update.finish.unzip();
        Some(CompletionChunkChoice {
            index,
            text,
            logprobs,
            finish_reason,
            stop_reason,
            // vLLM: the prompt's ids ride on each choice's first chunk.
            prompt_token_ids: (opts.token_ids && update.first)
                .then(|| generation.prompt_ids[index].clone()),
            token_ids: opts.token_ids.then_some(update.token_ids),
        })
    }

    fn choice(
        &self,
        index: usize,
        gathered: Gathered<CompletionText>,
        opts: &ResponseOptions,
        generation: &Generation,
    ) -> CompletionChoice {
        let logprobs = if opts.logprobs {
            completion_logprobs(&gathered.logprobs, gathered.text.echo_len)
        } else {
            Json::Null
        };
        CompletionChoice {
            index,
            text: gathered.text.text,
            logprobs,
            finish_reason: gathered.finish_reason,
            stop_reason: Some(gathered.stop_reason),
            token_ids: opts.token_ids.then_some(gathered.token_ids),
            prompt_token_ids: opts.token_ids.then(|| generation.prompt_ids[index].clone()),
        }
    }
}
