//! The engine's request API: what the server submits and what it receives.
//! Every value here is already validated by the caller (the server turns
//! client JSON into these types); the engine checks only what depends on
//! its own limits (prompt length against `max_model_len`, queue size).

use std::time::Duration;

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
    /// > 0; 1 is off. Divides positive logits / multiplies negative ones of
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

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
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
    /// Prompt tokens served from the prefix cache (0 until it exists).
    pub cached_tokens: usize,
}

/// One token of output.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Present when the request asked for logprobs.
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(u32, f32)>,
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
    /// The request could not complete (device failure in its step, engine
    /// stopped); the text is safe to show a client.
    Failed(String),
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
    /// `max_num_queued_reqs` reached.
    Overloaded { retry_after: Duration },
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
