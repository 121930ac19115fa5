//! The engine's limits and switches, checked once at start.

use thiserror::Error;

use crate::constraint::StructuredOutputs;
use crate::prefix_cache::PrefixCacheConfig;
use crate::scheduler::AdmissionPolicy;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Token budget per step (vLLM's default 8192).
    pub max_num_batched_tokens: usize,
    /// Running requests at most (also capped by the executor's slots).
    pub max_num_seqs: usize,
    /// Longest prompt + output (also capped by the executor).
    pub max_model_len: usize,
    /// Requests waiting for admission at most, beyond the `max_num_seqs`
    /// (capped by the executor's slots) the running batch holds; more get
    /// `SubmitError::Overloaded`. A burst within the free slots is never
    /// refused.
    pub max_num_queued_reqs: usize,
    /// Prompt tokens of the waiting requests at most before
    /// `SubmitError::TooManyQueuedTokens` (`usize::MAX`: no limit). An
    /// empty queue takes any prompt: the limit bounds the backlog, it does
    /// not refuse a long prompt outright.
    pub max_num_queued_tokens: usize,
    /// The model's EOS ids (generation_config / config).
    pub eos_token_ids: Vec<u32>,
    /// Cap per prefill chunk so one long prompt leaves room in a step for
    /// others (0: the budget only).
    pub long_prefill_token_threshold: usize,
    /// The prefix cache (off by default here; the server decides). Its
    /// snapshot budget is also capped by the executor's snapshot pool; an
    /// executor without one runs without a cache.
    pub prefix_cache: PrefixCacheConfig,
    /// The request timeline ([`crate::timeline`]): stamps per request up
    /// to its first token, handed out with it. Off by default.
    pub request_timeline: bool,
    /// Structured outputs: the compiler over the model's tokenizer
    /// (`None`: constrained requests are refused with
    /// [`crate::ConstraintError::Unsupported`]).
    pub structured_outputs: Option<StructuredOutputs>,
    /// Threads computing token masks while the executor runs a step (0:
    /// half the machine's cores, from 1 to 8: the other half serve the
    /// engine thread and the HTTP side;
    /// [`crate::ConstraintLimits::lexer_copies`] defaults to the same).
    pub mask_threads: usize,
    /// How admission leaves room for the running sequences' growth.
    pub admission: AdmissionPolicy,
}

impl EngineConfig {
    /// vLLM's defaults where it has one; lengths are then capped by the executor.
    pub fn new(eos_token_ids: Vec<u32>) -> Self {
        EngineConfig {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: usize::MAX,
            max_num_queued_reqs: 1024,
            max_num_queued_tokens: usize::MAX,
            eos_token_ids,
            long_prefill_token_threshold: 0,
            prefix_cache: PrefixCacheConfig::default(),
            request_timeline: false,
            structured_outputs: None,
            mask_threads: 0,
            admission: AdmissionPolicy::default(),
        }
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.max_num_seqs == 0 {
            return Err(ConfigError::NoSeqs);
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            // Decodes come first and take one token each: a budget below the
            // running count would leave some decode without a turn.
            return Err(ConfigError::BudgetBelowSeqs {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
            });
        }
        if self.max_model_len < 2 {
            return Err(ConfigError::ModelLenTooShort);
        }
        Ok(())
    }
}

/// A configuration value out of range (the message names it).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("max_num_seqs must be at least 1")]
    NoSeqs,
    #[error("max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs})")]
    BudgetBelowSeqs {
        max_num_batched_tokens: usize,
        max_num_seqs: usize,
    },
    #[error("max_model_len must be at least 2")]
    ModelLenTooShort,
}
