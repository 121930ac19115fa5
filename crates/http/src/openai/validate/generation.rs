//! The fields both endpoints share, checked one group at a time in a fixed
//! order (sampling, choices, token limits, stops, streaming): a request
//! with several faults is told of the same one every time.

use engine::SamplingParams;

use super::{
    in_range, positive_count, token_ids, SamplingDefaults, ValidGeneration, ValidationError, MAX_N,
    MAX_STOP_STRINGS,
};
use crate::openai::request::{GenerationRequest, StopField};

/// Validates the fields both endpoints share. `top_logprobs`: how many
/// alternatives the endpoint-specific `logprobs` fields asked for.
pub fn validate_generation(
    req: &GenerationRequest,
    top_logprobs: Option<u32>,
    max_tokens: Option<i64>,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<ValidGeneration, ValidationError> {
    let sampling = sampling_params(req, top_logprobs, defaults)?;
    refuse_logit_bias(req)?;
    let n = choice_count(req)?;
    let (max_tokens, min_tokens) = token_limits(req, max_tokens)?;
    let stop_strings = stop_strings(req)?;
    let stop_token_ids = token_ids(
        "stop_token_ids",
        req.stop_token_ids.as_deref().unwrap_or(&[]),
        vocab_size,
    )?;
    let stream = req.stream.unwrap_or(false);
    let (include_usage, continuous_usage) = usage_options(req, stream)?;
    refuse_prompt_logprobs(req)?;
    Ok(ValidGeneration {
        sampling,
        max_tokens,
        default_max_tokens: defaults.max_tokens,
        min_tokens,
        stop_strings,
        stop_token_ids,
        include_stop_str_in_output: req.include_stop_str_in_output.unwrap_or(false),
        ignore_eos: req.ignore_eos.unwrap_or(false),
        skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
        n,
        stream,
        include_usage,
        continuous_usage,
        return_token_ids: req.return_token_ids.unwrap_or(false),
        constraint: None,
    })
}

/// The sampling parameters, each the client's value, else the server's
/// default, else the neutral one, checked against its range.
fn sampling_params(
    req: &GenerationRequest,
    top_logprobs: Option<u32>,
    defaults: &SamplingDefaults,
) -> Result<SamplingParams, ValidationError> {
    let temperature = req.temperature.or(defaults.temperature).unwrap_or(1.0);
    let temperature = in_range("temperature", temperature, "in [0, 2]", |t| {
        (0.0..=2.0).contains(&t)
    })?;
    let top_p = req.top_p.or(defaults.top_p).unwrap_or(1.0);
    let top_p = in_range("top_p", top_p, "in (0, 1]", |p| p > 0.0 && p <= 1.0)?;
    let top_k = req.top_k.or(defaults.top_k).unwrap_or(0);
    if top_k < -1 {
        return Err(ValidationError::OutOfRange {
            field: "top_k",
            range: "-1 or 0 (off) or at least 1",
            value: top_k.to_string(),
        });
    }
    let top_k = u32::try_from(top_k.max(0)).map_err(|_| ValidationError::OutOfRange {
        field: "top_k",
        range: "at most 4294967295",
        value: top_k.to_string(),
    })?;
    let min_p = req.min_p.or(defaults.min_p).unwrap_or(0.0);
    let min_p = in_range("min_p", min_p, "in [0, 1]", |p| (0.0..=1.0).contains(&p))?;
    let repetition = req
        .repetition_penalty
        .or(defaults.repetition_penalty)
        .unwrap_or(1.0);
    let repetition_penalty = in_range("repetition_penalty", repetition, "in (0, 2]", |r| {
        r > 0.0 && r <= 2.0
    })?;
    let presence_penalty = in_range(
        "presence_penalty",
        req.presence_penalty.unwrap_or(0.0),
        "in [-2, 2]",
        |p| (-2.0..=2.0).contains(&p),
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        req.frequency_penalty.unwrap_or(0.0),
        "in [-2, 2]",
        |p| (-2.0..=2.0).contains(&p),
    )?;
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        seed: req.seed.map(|s| s as u64),
        logprobs: top_logprobs,
    })
}

/// `logit_bias` is not implemented: only an empty mapping is accepted.
fn refuse_logit_bias(req: &GenerationRequest) -> Result<(), ValidationError> {
    if let Some(bias) = &req.logit_bias {
        if !bias.is_empty() {
            return Err(ValidationError::Unsupported {
                field: "logit_bias",
                value: "a non-empty mapping".into(),
            });
        }
    }
    Ok(())
}

/// `n`, the number of choices. `best_of`, if given, must equal it: extra
/// choices are not generated to be ranked.
fn choice_count(req: &GenerationRequest) -> Result<usize, ValidationError> {
    let n = positive_count("n", req.n.unwrap_or(1), "in [1, 128]", MAX_N)?;
    if let Some(best_of) = req.best_of {
        if best_of != n as i64 {
            return Err(ValidationError::Unsupported {
                field: "best_of",
                value: best_of.to_string(),
            });
        }
    }
    Ok(n)
}

/// The client's `(max_tokens, min_tokens)`, the minimum within the maximum.
fn token_limits(
    req: &GenerationRequest,
    max_tokens: Option<i64>,
) -> Result<(Option<usize>, usize), ValidationError> {
    let max_tokens = match max_tokens {
        Some(m) => Some(positive_count("max_tokens", m, "at least 1", i64::MAX)?),
        None => None,
    };
    let min_tokens = match req.min_tokens.unwrap_or(0) {
        m if m < 0 => {
            return Err(ValidationError::OutOfRange {
                field: "min_tokens",
                range: "at least 0",
                value: m.to_string(),
            })
        }
        m => m as usize,
    };
    if let Some(max) = max_tokens {
        if min_tokens > max {
            return Err(ValidationError::MinTokensOverMax {
                min_tokens,
                max_tokens: max,
            });
        }
    }
    Ok((max_tokens, min_tokens))
}

/// `stop` as a list: at most [`MAX_STOP_STRINGS`], none empty.
fn stop_strings(req: &GenerationRequest) -> Result<Vec<String>, ValidationError> {
    let stop_strings = match &req.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ValidationError::TooManyStops {
            max: MAX_STOP_STRINGS,
            got: stop_strings.len(),
        });
    }
    if let Some(index) = stop_strings.iter().position(|s| s.is_empty()) {
        return Err(ValidationError::EmptyStop { index });
    }
    Ok(stop_strings)
}

/// `(include_usage, continuous_usage_stats)` of `stream_options`, which
/// only a streamed request may give.
fn usage_options(req: &GenerationRequest, stream: bool) -> Result<(bool, bool), ValidationError> {
    match &req.stream_options {
        Some(_) if !stream => Err(ValidationError::StreamOptionsWithoutStream),
        Some(o) => Ok((
            o.include_usage.unwrap_or(false),
            o.continuous_usage_stats.unwrap_or(false),
        )),
        None => Ok((false, false)),
    }
}

/// Prompt logprobs are not computed: any `prompt_logprobs` is refused.
fn refuse_prompt_logprobs(req: &GenerationRequest) -> Result<(), ValidationError> {
    if let Some(k) = req.prompt_logprobs {
        return Err(ValidationError::Unsupported {
            field: "prompt_logprobs",
            value: k.to_string(),
        });
    }
    Ok(())
}
