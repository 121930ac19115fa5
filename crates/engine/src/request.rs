//! The engine's request API: what the server submits and what it receives.
//! Every value here is already validated by the caller (the server turns
//! client JSON into these types); the engine checks only what depends on
//! its own limits (prompt length against `max_model_len`, queue size).

use std::time::Duration;

use thiserror::Error;

/// Engine-assigned request identity (unique for the engine's lifetime).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Sampling policy of one request. Ranges follow vLLM's
/// `SamplingParams._verify_args`; [`SamplingParams::check`] enforces them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 is off.
    pub top_p: f32,
    /// 0 is off.
    pub top_k: u32,
    /// In [0, 1]; 0 is off.
    pub min_p: f32,
    /// Positive; 1 is off. Divides positive logits / multiplies negative ones of
    /// every token seen (prompt and output).
    pub repetition_penalty: f32,
    /// In [-2, 2]; subtracted once from the logit of every output token seen.
    pub presence_penalty: f32,
    /// In [-2, 2]; subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// `None`: the engine draws a seed for the request.
    pub seed: Option<u64>,
    /// `Some(k)`: return the chosen token's logprob and the top `k`.
    pub logprobs: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logprobs: None,
        }
    }
}

/// The most top log-probabilities a request may ask for (OpenAI's
/// `top_logprobs` limit, vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: u32 = 20;

impl SamplingParams {
    /// vLLM's `SamplingParams._verify_args` ranges; the error names the field.
    pub fn check(&self) -> Result<(), InvalidParam> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(InvalidParam::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(InvalidParam::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(InvalidParam::MinP(self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(InvalidParam::RepetitionPenalty(self.repetition_penalty));
        }
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(InvalidParam::Penalty { name, value });
            }
        }
        if let Some(k) = self.logprobs {
            if k > MAX_LOGPROBS {
                return Err(InvalidParam::Logprobs(k));
            }
        }
        Ok(())
    }
}

/// When a request stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopParams {
    /// Output tokens at most (>= 1).
    pub max_tokens: usize,
    /// EOS and stop ids are banned until this many tokens were produced.
    pub min_tokens: usize,
    /// Extra token ids that end the request (the token is emitted).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's EOS ids.
    pub ignore_eos: bool,
}

impl StopParams {
    /// `max_tokens` >= 1 and `min_tokens` <= `max_tokens` (vLLM's ranges).
    pub fn check(&self) -> Result<(), InvalidParam> {
        if self.max_tokens < 1 {
            return Err(InvalidParam::MaxTokens(self.max_tokens));
        }
        if self.min_tokens > self.max_tokens {
            return Err(InvalidParam::MinTokens {
                min_tokens: self.min_tokens,
                max_tokens: self.max_tokens,
            });
        }
        Ok(())
    }
}

/// A sampling or stop parameter outside its range: the message starts with
/// the field's name and gives the value.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum InvalidParam {
    #[error("temperature must be finite and >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be finite and > 0, got {0}")]
    RepetitionPenalty(f32),
    /// `presence_penalty` or `frequency_penalty` (`name`).
    #[error("{name} must be in [-2, 2], got {value}")]
    Penalty { name: &'static str, value: f32 },
    #[error("logprobs must be at most {max}, got {0}", max = MAX_LOGPROBS)]
    Logprobs(u32),
    #[error("max_tokens must be at least 1, got {0}")]
    MaxTokens(usize),
    #[error("min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}")]
    MinTokens {
        min_tokens: usize,
        max_tokens: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
    /// Prompt positions after which the prefix cache should also keep the
    /// state, besides the engine's own points (the server passes where a
    /// chat's system preamble ends). Each must be in `1..prompt.len()`;
    /// without a cache they are ignored, and so are points shorter than a
    /// KV page (a snapshot would cost far more than the prefill it saves).
    pub snapshot_points: Vec<usize>,
    /// What the output must match (structured outputs); `None`: free text.
    pub constraint: Option<crate::ConstraintSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS or stop token id (given) was produced.
    Stop { token: u32 },
    /// `max_tokens` reached, or the sequence reached `max_model_len`.
    Length,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (resumed from a state
    /// snapshot at first admission; 0 with the cache off).
    pub cached_tokens: usize,
}

/// One token of output.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Present when the request asked for logprobs.
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(u32, f32)>,
    /// Prompt tokens served from the prefix cache (the same on every token
    /// of a request; `Usage::cached_tokens` at the end).
    pub cached_tokens: usize,
    /// On the first token only, when the request timeline is on: the
    /// engine's stamps up to this token ([`crate::timeline`]).
    pub timeline: Option<Box<crate::timeline::EngineTimeline>>,
}

/// What a request's stream yields, in order: tokens, then exactly one
/// `Finished` or `Failed`, then the stream ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    /// The request could not complete: why, in words safe to show a client.
    Failed(Failure),
}

/// Why a request could not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureCause {
    /// Its step failed on the device; the engine goes on (a retry may work).
    StepFailed,
    /// The engine stopped (the executor lost its device, a panic, or the
    /// engine thread is gone): nothing more can be served.
    EngineStopped,
    /// A shutdown's drain deadline passed before the request finished.
    ShutDown,
}

/// A request's failure: its cause and a message written for clients.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct Failure {
    pub cause: FailureCause,
    pub message: String,
}

impl Failure {
    pub fn new(cause: FailureCause, message: impl Into<String>) -> Self {
        Failure {
            cause,
            message: message.into(),
        }
    }
}

/// Why `submit` refused a request (nothing was queued).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The prompt alone is too long: `prompt_tokens` >= `max_model_len`
    /// (no room for one output token), or prompt + `max_tokens` exceeds it.
    TooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    /// A value outside its range (names the field).
    Invalid(String),
    /// `max_num_queued_reqs` requests already wait beyond those the
    /// running batch can hold.
    Overloaded { retry_after: Duration },
    /// The prompt would take the queued prompt tokens beyond
    /// `max_num_queued_tokens`.
    TooManyQueuedTokens {
        retry_after: Duration,
        queued_tokens: usize,
        prompt_tokens: usize,
        limit: usize,
    },
    /// Shutdown in progress: no new work.
    ShuttingDown,
    /// Still loading the model.
    Loading,
    /// The engine thread stopped (lost device, panic).
    Dead(String),
}

/// Engine lifecycle, as `/health` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineState {
    Loading,
    Ready,
    Draining,
    Dead(String),
}
