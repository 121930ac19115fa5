//! Raw request -> validated values. One error variant per rule, each naming
//! the field, the limit and the value, so the client learns what to change.
//! Ranges follow vLLM's `SamplingParams._verify_args` and OpenAI's limits.

use engine::{ConstraintSpec, SamplingParams};

use super::request::GenerationRequest;

mod chat;
mod constraint;
mod error;
mod generation;
pub use chat::{validate_chat, validate_messages, validate_tool_types};
pub use constraint::{
    check_length_controls, check_size, requested_constraint, RequestedConstraint,
    DEFAULT_MAX_CONSTRAINT_BYTES,
};
pub use error::ValidationError;
pub use generation::validate_generation;

/// Most top logprobs a request may ask for (vLLM's default max_logprobs).
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most choices per request.
pub const MAX_N: i64 = 128;
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;

/// Server-side sampling defaults (generation_config.json), used where the
/// client leaves a field out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_tokens: Option<usize>,
}

/// What both endpoints validate the same way.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidGeneration {
    pub sampling: SamplingParams,
    /// The client's limit; `None`: the server default if any, capped by
    /// the rest of the context (`max_model_len - prompt_len`).
    pub max_tokens: Option<usize>,
    /// generation_config.json's `max_new_tokens`.
    pub default_max_tokens: Option<usize>,
    pub min_tokens: usize,
    pub stop_strings: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str_in_output: bool,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    /// vLLM's `return_token_ids`: `prompt_token_ids` and per choice
    /// `token_ids` (the deltas when streaming).
    pub return_token_ids: bool,
    /// What the output must match (structured outputs, a forced tool
    /// call); set by the endpoint once the prompt is known.
    pub constraint: Option<ConstraintSpec>,
}

/// A chat request after validation (messages are rendered separately).
#[derive(Clone, Debug, PartialEq)]
pub struct ValidChat {
    pub generation: ValidGeneration,
    pub tools_enabled: bool,
    /// tool_choice 'required' or a named function: the output is a call.
    pub forced_tool_call: Option<ForcedToolCall>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub include_reasoning: bool,
}

/// What a forcing `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ForcedToolCall {
    /// 'required': one or more calls of any given tool (one when
    /// `parallel_tool_calls` is false).
    Required { parallel: bool },
    /// One call of this function.
    Named(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValidCompletion {
    pub generation: ValidGeneration,
    pub echo: bool,
    pub add_special_tokens: bool,
}

fn finite(field: &'static str, v: f64) -> Result<f64, ValidationError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ValidationError::NotFinite { field })
    }
}

fn in_range(
    field: &'static str,
    v: f64,
    range: &'static str,
    ok: impl Fn(f64) -> bool,
) -> Result<f32, ValidationError> {
    let v = finite(field, v)?;
    if ok(v) {
        // The smallest positive f64s round to 0 as f32, which ranges that
        // exclude 0 (top_p, repetition_penalty) would then refuse.
        let narrowed = v as f32;
        Ok(if v > 0.0 && narrowed == 0.0 {
            f32::MIN_POSITIVE
        } else {
            narrowed
        })
    } else {
        Err(ValidationError::OutOfRange {
            field,
            range,
            value: v.to_string(),
        })
    }
}

fn positive_count(
    field: &'static str,
    v: i64,
    range: &'static str,
    max: i64,
) -> Result<usize, ValidationError> {
    if v < 1 || v > max {
        return Err(ValidationError::OutOfRange {
            field,
            range,
            value: v.to_string(),
        });
    }
    Ok(v as usize)
}

/// Client token ids (`stop_token_ids`, the `prompt` of /v1/completions, the
/// `tokens` of /detokenize): each must be a vocabulary id; `field` names the
/// request field in the error.
pub fn token_ids(
    field: &'static str,
    ids: &[i64],
    vocab_size: usize,
) -> Result<Vec<u32>, ValidationError> {
    ids.iter()
        .map(|&id| {
            if id < 0 || id as u64 >= vocab_size as u64 {
                Err(ValidationError::TokenOutOfVocab {
                    field,
                    value: id,
                    vocab_size,
                })
            } else {
                Ok(id as u32)
            }
        })
        .collect()
}

pub fn validate_completion(
    req: &GenerationRequest,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<ValidCompletion, ValidationError> {
    if req.prompt.is_none() {
        return Err(ValidationError::MissingField { field: "prompt" });
    }
    let top = match &req.logprobs {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(k)) => match k.as_i64() {
            Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Some(k as u32),
            _ => {
                return Err(ValidationError::OutOfRange {
                    field: "logprobs",
                    range: "an integer in [0, 20]",
                    value: k.to_string(),
                })
            }
        },
        Some(other) => {
            return Err(ValidationError::OutOfRange {
                field: "logprobs",
                range: "an integer in [0, 20]",
                value: other.to_string(),
            })
        }
    };
    if let Some(suffix) = &req.suffix {
        return Err(ValidationError::Unsupported {
            field: "suffix",
            value: format!("{suffix:?}"),
        });
    }
    let generation = validate_generation(req, top, req.max_tokens, defaults, vocab_size)?;
    Ok(ValidCompletion {
        generation,
        echo: req.echo.unwrap_or(false),
        add_special_tokens: req.add_special_tokens.unwrap_or(true),
    })
}

/// Resolves `max_tokens` against the context once the prompt length is
/// known: unset means the server default capped by the rest of the context
/// (or the rest of the context); a client value too large is an error with
/// vLLM's message.
pub fn resolve_max_tokens(
    v: &ValidGeneration,
    prompt_tokens: usize,
    max_model_len: usize,
) -> Result<usize, ValidationError> {
    let room = check_context(prompt_tokens, max_model_len)?;
    match (v.max_tokens, v.default_max_tokens) {
        (Some(m), _) if m > room => Err(ValidationError::MaxTokensTooLarge {
            max_tokens: m,
            prompt_tokens,
            max_model_len,
        }),
        (Some(m), _) => Ok(m),
        (None, Some(default)) => Ok(default.min(room)),
        (None, None) => Ok(room),
    }
}

/// Room left for output, or why there is none.
fn check_context(prompt_tokens: usize, max_model_len: usize) -> Result<usize, ValidationError> {
    if prompt_tokens == 0 {
        return Err(ValidationError::EmptyPrompt);
    }
    if prompt_tokens >= max_model_len {
        return Err(ValidationError::PromptTooLong {
            prompt_tokens,
            max_model_len,
        });
    }
    Ok(max_model_len - prompt_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> GenerationRequest {
        serde_json::from_str(json).unwrap()
    }

    fn chat(json: &str) -> Result<ValidChat, ValidationError> {
        validate_chat(&req(json), &SamplingDefaults::default(), 1000)
    }

    const MSG: &str = r#""messages": [{"role": "user", "content": "hi"}]"#;

    #[test]
    fn ranges_name_field_limit_and_value() {
        let e = chat(&format!(r#"{{{MSG}, "temperature": 2.5}}"#)).unwrap_err();
        assert_eq!(
            e,
            ValidationError::OutOfRange {
                field: "temperature",
                range: "in [0, 2]",
                value: "2.5".into()
            }
        );
        assert_eq!(e.param().as_deref(), Some("temperature"));
        assert!(e.to_string().contains("2.5"), "{e}");
        let e = chat(&format!(r#"{{{MSG}, "top_p": 0}}"#)).unwrap_err();
        assert!(matches!(
            e,
            ValidationError::OutOfRange { field: "top_p", .. }
        ));
        let e = chat(&format!(r#"{{{MSG}, "n": 0}}"#)).unwrap_err();
        assert!(matches!(e, ValidationError::OutOfRange { field: "n", .. }));
        let e = chat(&format!(r#"{{{MSG}, "stop_token_ids": [1000]}}"#)).unwrap_err();
        assert!(matches!(
            e,
            ValidationError::TokenOutOfVocab { value: 1000, .. }
        ));
        let e = chat(&format!(r#"{{{MSG}, "top_logprobs": 3}}"#)).unwrap_err();
        assert_eq!(e, ValidationError::TopLogprobsWithoutLogprobs);
        let e = chat(&format!(
            r#"{{{MSG}, "stream_options": {{"include_usage": true}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e, ValidationError::StreamOptionsWithoutStream);
    }

    #[test]
    fn both_output_limits_of_chat_are_checked_and_named() {
        let e = chat(&format!(
            r#"{{{MSG}, "max_completion_tokens": 5, "max_tokens": 0}}"#
        ))
        .unwrap_err();
        assert_eq!(e.param().as_deref(), Some("max_tokens"));
        let e = chat(&format!(r#"{{{MSG}, "max_completion_tokens": 0}}"#)).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("max_completion_tokens"));
        let v = chat(&format!(
            r#"{{{MSG}, "max_completion_tokens": 5, "max_tokens": 9}}"#
        ))
        .unwrap();
        assert_eq!(v.generation.max_tokens, Some(5));
    }

    #[test]
    fn the_smallest_positive_values_stay_positive_as_f32() {
        let v = chat(&format!(
            r#"{{{MSG}, "top_p": 5e-324, "repetition_penalty": 1e-300}}"#
        ))
        .unwrap();
        let sampling = &v.generation.sampling;
        assert!(sampling.top_p > 0.0 && sampling.repetition_penalty > 0.0);
        assert!(sampling.check().is_ok());
    }

    #[test]
    fn messages_rules() {
        assert_eq!(
            chat(r#"{"messages": []}"#).unwrap_err(),
            ValidationError::EmptyMessages
        );
        let e = chat(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("messages[0].role"));
        let e = chat(r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#)
            .unwrap_err();
        assert!(matches!(
            e,
            ValidationError::BadContentPart {
                index: 0,
                part: 0,
                ..
            }
        ));
        let e = chat(
            r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]}"#,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            ValidationError::BadToolCallArguments { index: 0, .. }
        ));
        // A tool result names the call it answers, as OpenAI requires.
        let tool = |extra: &str| {
            chat(&format!(
                r#"{{"messages": [{{"role": "user", "content": "x"}}, {{"role": "tool", "content": "42"{extra}}}]}}"#
            ))
        };
        let e = tool("").unwrap_err();
        assert_eq!(e, ValidationError::MissingToolCallId { index: 1 });
        assert_eq!(e.param().as_deref(), Some("messages[1].tool_call_id"));
        assert_eq!(e.code(), "missing_required_parameter");
        assert!(e.to_string().contains("'messages[1].tool_call_id'"), "{e}");
        assert!(tool(r#", "tool_call_id": "call_1""#).is_ok());
    }

    #[test]
    fn defaults_and_precedence() {
        let defaults = SamplingDefaults {
            temperature: Some(0.6),
            top_k: Some(20),
            ..Default::default()
        };
        let v = validate_chat(
            &req(&format!(
                r#"{{{MSG}, "max_tokens": 5, "max_completion_tokens": 7, "top_k": -1}}"#
            )),
            &defaults,
            1000,
        )
        .unwrap();
        assert_eq!(v.generation.max_tokens, Some(7));
        assert_eq!(v.generation.sampling.temperature, 0.6);
        assert_eq!(v.generation.sampling.top_k, 0);
        assert!(v.add_generation_prompt);
    }

    #[test]
    fn max_tokens_against_context() {
        let mut v = chat(&format!("{{{MSG}}}")).unwrap().generation;
        assert_eq!(resolve_max_tokens(&v, 10, 64), Ok(54));
        v.default_max_tokens = Some(100);
        assert_eq!(
            resolve_max_tokens(&v, 10, 64),
            Ok(54),
            "a server default is capped, not refused"
        );
        v.default_max_tokens = Some(20);
        assert_eq!(resolve_max_tokens(&v, 10, 64), Ok(20));
        v.max_tokens = Some(54);
        assert_eq!(resolve_max_tokens(&v, 10, 64), Ok(54));
        v.max_tokens = Some(55);
        let e = resolve_max_tokens(&v, 10, 64).unwrap_err();
        assert!(e.to_string().contains("55 > 64 - 10"), "{e}");
        assert_eq!(
            resolve_max_tokens(&v, 64, 64),
            Err(ValidationError::PromptTooLong {
                prompt_tokens: 64,
                max_model_len: 64
            })
        );
    }
}
