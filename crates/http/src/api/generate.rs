//! Drives the engine requests of one HTTP request (one per choice) and turns
//! their token events into text: incremental detokenization, stop strings
//! (a hit ends that choice's engine request as finished by `stop`), finish
//! reasons and logprobs. Chat and completions both build on this.
//!
//! Dropping a [`Generation`] drops every engine stream still open, so a
//! client that goes away (axum drops the handler or the body stream) aborts
//! its requests in the engine.

use std::sync::Arc;

use engine::{
    EngineHandle, Event, Failure, FailureCause, FinishReason, GenerateRequest, RequestStream,
    StopParams,
};
use futures_util::future::select_all;
use serde_json::{json, Value as Json};
use tokenizers::Tokenizer;

use super::request_id::RequestId;
use super::timeline::Timeline;
use crate::openai::response::Usage;
use crate::openai::validate::ValidGeneration;
use crate::openai::ApiError;
use crate::text::detok::{IncrementalDetokenizer, StopStrings};

/// One token's logprob and its top alternatives, with their text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(u32, String, f32)>,
}

/// Why a choice ended, in OpenAI/vLLM terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    /// "stop" or "length".
    pub reason: &'static str,
    /// vLLM's `stop_reason`: the stop string or stop token id, else null.
    pub stop_reason: Json,
}

/// An engine request that could not complete: the engine's cause and
/// message (written for clients).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct EngineFailure(pub Failure);

impl From<EngineFailure> for ApiError {
    fn from(EngineFailure(failure): EngineFailure) -> Self {
        match failure.cause {
            FailureCause::ShutDown => ApiError::server_shutdown(failure.message),
            FailureCause::StepFailed | FailureCause::EngineStopped => {
                ApiError::engine_failure(failure.message)
            }
        }
    }
}

/// What one engine event changed for a choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub index: usize,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// The tokens this progress covers (only with `return_token_ids`).
    pub token_ids: Vec<u32>,
    /// Set on the choice's last progress.
    pub finish: Option<Finish>,
}

pub struct Choice {
    detok: IncrementalDetokenizer,
    stops: StopStrings,
    /// Ids whose emission ends the request (EOS unless ignored, stop ids):
    /// their text is not part of the output, as in vLLM.
    stop_ids: Vec<u32>,
    request_stop_ids: Vec<u32>,
    include_stop_str: bool,
    text: String,
    sent: usize,
    pending_logprobs: Vec<TokenLogprob>,
    pending_token_ids: Vec<u32>,
    pub completion_tokens: usize,
    /// Prompt tokens the engine served from its prefix cache.
    pub cached_tokens: usize,
    pub finish: Option<Finish>,
}

pub struct Generation {
    streams: Vec<Option<RequestStream>>,
    pub choices: Vec<Choice>,
    /// Prompt length of each choice's request.
    pub prompt_tokens: Vec<usize>,
    /// Prompt ids of each choice's request (empty unless `return_token_ids`).
    pub prompt_ids: Vec<Vec<u32>>,
    /// Choices per prompt (`n`).
    n: usize,
    tokenizer: Arc<Tokenizer>,
    want_logprobs: bool,
    want_token_ids: bool,
    /// The request timeline (off: empty) and the HTTP request's id for its
    /// line, logged when the first text goes out.
    timeline: Timeline,
    request_id: String,
}

/// The per-prompt inputs of a submission.
pub struct PromptSpec {
    pub ids: Vec<u32>,
    pub max_tokens: usize,
    /// Extra prefix-cache snapshot points (`GenerateRequest::snapshot_points`).
    pub snapshot_points: Vec<usize>,
}

impl Generation {
    /// The engine's ids of the choices' requests still open (for logs).
    pub fn engine_ids(&self) -> Vec<u64> {
        self.streams.iter().flatten().map(|s| s.id().0).collect()
    }

    /// Submits `n` engine requests per prompt (choice index = prompt * n + i;
    /// seeds `seed + i` so choices differ but stay reproducible). If any
    /// submit fails, the ones already queued are dropped (aborted).
    pub fn submit(
        engine: &EngineHandle,
        tokenizer: Arc<Tokenizer>,
        eos_token_ids: &[u32],
        prompts: Vec<PromptSpec>,
        v: &ValidGeneration,
    ) -> Result<Generation, ApiError> {
        let mut streams = Vec::new();
        let mut choices = Vec::new();
        let mut prompt_tokens = Vec::new();
        let mut prompt_ids = Vec::new();
        let mut stop_ids: Vec<u32> = v.stop_token_ids.clone();
        if !v.ignore_eos {
            stop_ids.extend_from_slice(eos_token_ids);
        }
        for prompt in prompts {
            for i in 0..v.n {
                let mut sampling = v.sampling.clone();
                sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
                let request = GenerateRequest {
                    prompt: prompt.ids.clone(),
                    sampling,
                    stop: StopParams {
                        max_tokens: prompt.max_tokens,
                        min_tokens: v.min_tokens,
                        stop_token_ids: v.stop_token_ids.clone(),
                        ignore_eos: v.ignore_eos,
                    },
                    snapshot_points: prompt.snapshot_points.clone(),
                    constraint: v.constraint.clone(),
                };
                streams.push(Some(engine.submit(request)?));
                prompt_tokens.push(prompt.ids.len());
                prompt_ids.push(if v.return_token_ids {
                    prompt.ids.clone()
                } else {
                    Vec::new()
                });
                choices.push(Choice {
                    detok: IncrementalDetokenizer::new(tokenizer.clone(), v.skip_special_tokens),
                    stops: StopStrings::new(v.stop_strings.clone(), v.include_stop_str_in_output),
                    stop_ids: stop_ids.clone(),
                    request_stop_ids: v.stop_token_ids.clone(),
                    include_stop_str: v.include_stop_str_in_output,
                    text: String::new(),
                    sent: 0,
                    pending_logprobs: Vec::new(),
                    pending_token_ids: Vec::new(),
                    completion_tokens: 0,
                    cached_tokens: 0,
                    finish: None,
                });
            }
        }
        Ok(Generation {
            streams,
            choices,
            prompt_tokens,
            prompt_ids,
            n: v.n,
            tokenizer,
            want_logprobs: v.sampling.logprobs.is_some(),
            want_token_ids: v.return_token_ids,
            timeline: Timeline::off(),
            request_id: String::new(),
        })
    }

    /// Hands the request's timeline to the generation: it stamps the
    /// first token's arrival and logs the line when the first text goes
    /// out (`first_text`), or when the request ends without any.
    pub fn set_timeline(&mut self, timeline: Timeline, request_id: &str) {
        if timeline.is_on() {
            self.request_id = request_id.to_string();
        }
        self.timeline = timeline;
    }

    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.completion_tokens).sum()
    }

    /// The usage so far. Each prompt counts once however many choices it
    /// has (as in vLLM), and so do its cached tokens (its first choice's).
    pub fn usage(&self) -> Usage {
        let prompt: usize = self.prompt_tokens.iter().step_by(self.n).sum();
        let cached: usize = self
            .choices
            .iter()
            .step_by(self.n)
            .map(|c| c.cached_tokens)
            .sum();
        Usage::new(prompt, self.completion_tokens(), cached)
    }

    /// Logs which engine requests serve the HTTP request `request_id`.
    pub fn log_submitted(&self, request_id: &RequestId) {
        log::debug!(
            "request {request_id}: engine requests {:?}, {} prompt tokens",
            self.engine_ids(),
            self.prompt_tokens.iter().sum::<usize>()
        );
    }

    fn token_text(&self, token: u32) -> String {
        self.tokenizer.decode(&[token], false).unwrap_or_default()
    }

    /// The next change of any choice; `None` when every choice finished.
    /// `Err`: an engine failure (its message is client-safe).
    pub async fn next(&mut self) -> Option<Result<Progress, EngineFailure>> {
        loop {
            let open: Vec<_> = self
                .streams
                .iter_mut()
                .enumerate()
                .filter_map(|(i, s)| {
                    s.as_mut()
                        .map(|s| Box::pin(async move { (i, s.next().await) }))
                })
                .collect();
            if open.is_empty() {
                return None;
            }
            // RequestStream::next is a channel receive: dropping the futures
            // that lost the race loses no event.
            let ((index, event), _, _) = select_all(open).await;
            if let Some(progress) = self.apply(index, event) {
                if self.timeline.is_on() {
                    match &progress {
                        Ok(p) if !p.text.is_empty() => {
                            self.timeline.first_text(&self.request_id, "first_text")
                        }
                        Ok(p) if p.finish.is_some() => self
                            .timeline
                            .first_text(&self.request_id, "finished_without_text"),
                        _ => {}
                    }
                }
                return Some(progress);
            }
        }
    }

    fn apply(
        &mut self,
        index: usize,
        event: Option<Event>,
    ) -> Option<Result<Progress, EngineFailure>> {
        match event {
            Some(Event::Token(t)) => {
                self.timeline.token(t.timeline.as_deref());
                let logprob = (self.want_logprobs).then(|| TokenLogprob {
                    token: t.token,
                    text: self.token_text(t.token),
                    logprob: t.logprob.unwrap_or(f32::NAN),
                    top: t
                        .top_logprobs
                        .iter()
                        .map(|&(id, lp)| (id, self.token_text(id), lp))
                        .collect(),
                });
                let choice = &mut self.choices[index];
                choice.completion_tokens += 1;
                choice.cached_tokens = t.cached_tokens;
                if let Some(lp) = logprob {
                    choice.pending_logprobs.push(lp);
                }
                // Every sampled token, the one that ends the request too (vLLM).
                if self.want_token_ids {
                    choice.pending_token_ids.push(t.token);
                }
                // The token that ends the request adds no text (vLLM), unless
                // the client asked to see stop strings/tokens.
                let ends = choice.stop_ids.contains(&t.token);
                let piece = if ends && !choice.include_stop_str {
                    String::new()
                } else {
                    choice.detok.push(t.token)
                };
                choice.text.push_str(&piece);
                if let Some((cut, stop)) = choice.stops.check(&choice.text, piece.len()) {
                    choice.text.truncate(cut);
                    choice.finish = Some(Finish {
                        reason: "stop",
                        stop_reason: Json::String(stop),
                    });
                    // Ends the engine request now, counted as a stop.
                    if let Some(stream) = self.streams[index].take() {
                        stream.stop();
                    }
                    return Some(Ok(self.take(index, true)));
                }
                let progress = self.take(index, false);
                (!progress.text.is_empty()
                    || !progress.logprobs.is_empty()
                    || !progress.token_ids.is_empty())
                .then_some(Ok(progress))
            }
            Some(Event::Finished { reason, usage }) => {
                self.streams[index] = None;
                let choice = &mut self.choices[index];
                choice.completion_tokens = usage.completion_tokens;
                choice.cached_tokens = usage.cached_tokens;
                let tail = choice.detok.flush();
                choice.text.push_str(&tail);
                if let Some((cut, stop)) = choice.stops.check(&choice.text, tail.len()) {
                    choice.text.truncate(cut);
                    choice.finish = Some(Finish {
                        reason: "stop",
                        stop_reason: Json::String(stop),
                    });
                } else {
                    choice.finish = Some(match reason {
                        FinishReason::Stop { token }
                            if choice.request_stop_ids.contains(&token) =>
                        {
                            Finish {
                                reason: "stop",
                                stop_reason: json!(token),
                            }
                        }
                        FinishReason::Stop { .. } => Finish {
                            reason: "stop",
                            stop_reason: Json::Null,
                        },
                        FinishReason::Length => Finish {
                            reason: "length",
                            stop_reason: Json::Null,
                        },
                    });
                }
                Some(Ok(self.take(index, true)))
            }
            Some(Event::Failed(failure)) => {
                self.streams[index] = None;
                Some(Err(EngineFailure(failure)))
            }
            None => {
                self.streams[index] = None;
                Some(Err(EngineFailure(Failure::new(
                    FailureCause::EngineStopped,
                    "the engine stopped before the request finished",
                ))))
            }
        }
    }

    /// The text not yet handed out (all of it when `done`; otherwise less
    /// what may still turn out to be the start of a stop string).
    fn take(&mut self, index: usize, done: bool) -> Progress {
        let choice = &mut self.choices[index];
        let mut end = if done {
            choice.text.len()
        } else {
            choice.text.len() - choice.stops.holdback(&choice.text)
        };
        end = end.max(choice.sent);
        while !choice.text.is_char_boundary(end) {
            end -= 1;
        }
        let text = choice.text[choice.sent..end].to_string();
        choice.sent = end;
        Progress {
            index,
            text,
            logprobs: std::mem::take(&mut choice.pending_logprobs),
            token_ids: std::mem::take(&mut choice.pending_token_ids),
            finish: if done { choice.finish.clone() } else { None },
        }
    }
}
