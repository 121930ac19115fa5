//! Structured outputs: a request's constraint (a JSON schema, a regex, a
//! choice of strings or a Lark grammar) compiled by llguidance against the
//! model's tokenizer, and the per-request matcher that says, step by step,
//! which tokens may come next.
//!
//! - `compile.rs`: [`StructuredOutputs`], the tokenizer's trie and the
//!   compiler with its limits (text size, grammar size, compile time,
//!   llguidance's parser limits) and a bounded cache of compiled grammars
//!   keyed by their text.
//! - `first_step.rs`: a compiled grammar's first step, taken at compile
//!   time, so that one no output can follow (an empty language, a grammar
//!   past llguidance's limits) is refused before any token is generated.
//! - `matcher.rs`: a running request's matcher: its mask at the logits'
//!   width, advanced with each sampled token.
//! - `pool.rs`: the mask pool: threads that compute the step's masks while
//!   the executor runs the forward ([`crate::AllowedTokens`] blocks a
//!   sampler only if its mask is late).
//! - `cost.rs`: what a constraint costs per token (masks and advances
//!   timed on random walks), for `examples/constraint_cost.rs`.
//! - `step.rs`: the engine thread's side: masks handed out for a step, the
//!   matchers advanced with what was sampled, and the counts `/metrics`
//!   shows.
//!
//! A matcher belongs to its request, not to its slot: a preempted request
//! keeps it, and its recompute samples at the state it left (the same draw
//! with the same mask), so preemption and prefix-cache hits need nothing
//! more. A matcher that falls behind its output replays the missing tokens
//! before its next mask.

mod ascii_classes;
mod compile;
mod cost;
mod first_step;
mod matcher;
mod pool;
mod step;

#[cfg(test)]
mod refusal_tests;

use std::time::Duration;

use thiserror::Error;

pub(crate) use compile::Compiled;
pub use compile::{ConstraintLimits, StructuredOutputs, StructuredOutputsError};
pub use cost::WalkCost;
pub(crate) use step::StepConstraints;

/// The mask pool's threads when the engine's configuration leaves it to
/// the machine: half its cores, from 1 to 8 (the other half serve the
/// engine thread and the HTTP side).
pub(crate) fn default_mask_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() / 2)
        .clamp(1, 8)
}

/// What a request's output must match (the HTTP layer builds it from
/// `response_format`, `structured_outputs`, `guided_*` or a forced tool call).
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON schema (an object, or `true` / `false`).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (may embed `%json {...}`).
    Lark(String),
}

impl ConstraintSpec {
    /// The kind in words, as error messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema(_) => "JSON schema",
            ConstraintSpec::JsonObject => "JSON object",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Choice(_) => "choice",
            ConstraintSpec::Lark(_) => "grammar",
        }
    }
}

/// Why a constraint cannot be used; the HTTP layer answers 400 with the
/// message, naming the field the constraint came from.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConstraintError {
    /// The engine was started without a tokenizer for structured outputs
    /// ([`crate::EngineConfig::structured_outputs`]).
    #[error("structured outputs are not available on this server")]
    Unsupported,
    /// The compiler refused it (its message: a bad schema or regex, an
    /// unsupported keyword, a grammar over the compiler's size limit).
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    /// Its text is longer than the engine compiles.
    #[error("{kind} is too large: {bytes} bytes (at most {limit})")]
    TooLarge {
        kind: &'static str,
        bytes: usize,
        limit: usize,
    },
    /// It compiles, but no output can follow it: no token, not even EOS,
    /// may come first (llguidance's `NoExtensionBias`: a regex or grammar
    /// with an empty language, a schema whose `$ref`s only loop).
    #[error("{kind} matches no output at all: nothing, not even the end of the output, may come first (llguidance: {message})")]
    Empty { kind: &'static str, message: String },
    /// It compiles, but its first step is past llguidance's limits (the
    /// lexer's fuel or states, the parser's items per row): it would fail
    /// on that step while generating.
    #[error("{kind} is past the constraint compiler's limits at {step}: {message}")]
    TooComplex {
        kind: &'static str,
        step: &'static str,
        message: String,
    },
    /// Compiling took longer than the limit.
    #[error("{kind} took longer than {limit:?} to compile")]
    CompileTimeout { kind: &'static str, limit: Duration },
}
