//! CPU sampler: one token from one row of logits, with vLLM's semantics.
//!
//! Order (vLLM v1 `Sampler`): banned ids and penalties on the raw logits,
//! then greedy argmax (temperature below 1e-5) or: temperature, min-p,
//! top-k, top-p, and a draw from what is left. Log-probabilities are the raw
//! model log-softmax (before all of that), as vLLM's default `raw_logprobs`.
//! A constrained row ([`SampleSpec::allowed`]) first has every token its
//! mask disallows set to -inf: the bans, penalties, the draw and the
//! logprobs all see the masked row (its logprobs are the log-softmax over
//! the allowed tokens, as vLLM reports them for structured outputs). When
//! the bans would leave no allowed token they are lifted (the grammar wins).
//!
//! The draw is an exponential race (vLLM's `random_sample`: argmax of
//! `p_i / E_i` with `E_i ~ Exp(1)`), in logs: each kept token `i` scores
//!
//! ```text
//! key     = splitmix64(seed ^ splitmix64(draw))                 (per row)
//! bits_i  = splitmix64(key + i * 0x9E3779B97F4A7C15)             (wrapping)
//! U_i     = ((bits_i >> 11) | 1) * 2^-53                         in (0, 1)
//! score_i = (x_i - max) / T - ln(-ln U_i)                        (f64)
//! ```
//!
//! (`x_i` the adjusted logit, `max` the row's largest, both f32 widened to
//! f64, `T` the temperature) and the highest score wins, the lowest id on
//! equal scores. `-ln U_i` is Exp(1), so the winner is token `i` with
//! probability `p_i` exactly. Every `U_i` depends only on (seed, draw,
//! token id), never on which tokens are kept or in what order they are
//! visited, so the GPU kernel (`gdn-kernels/cuda/sampling.cu`, which
//! computes the same formula in [`race_key`], [`race_uniform`] and
//! [`race_score`]'s CUDA twins) draws the same token as this sampler: this
//! sampler is its oracle. Randomness is a pure function of
//! [`SampleSeed`](crate::SampleSeed),
//! so a request samples the same tokens whatever batch it runs in and after
//! a preemption (recomputed requests repeat their draws).

mod logits;
mod mask;
mod penalties;
mod race;
mod truncation;

pub use penalties::{adjustments, LogitAdjustment};
pub use race::{race_key, race_score, race_uniform};

use crate::executor::{SampleSpec, SampledToken};
use logits::{argmax, log_sum_exp, sanitize, top_k_logprobs};
use penalties::adjusted_logits;
use truncation::draw;

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// Samples one token from `logits` (one row, vocabulary-sized).
///
/// Banned ids are never chosen unless every token is banned or non-finite
/// (then the ban is ignored rather than inventing a token). NaN logits
/// count as -inf. The chosen token's log-probability and the top list are
/// computed only when `params.logprobs` asks (a pass of `exp` over the
/// vocabulary); otherwise `logprob` is NaN.
pub fn sample(logits: &[f32], spec: &SampleSpec<'_>) -> SampledToken {
    assert!(!logits.is_empty(), "sample: empty logits row");
    let params = spec.params;
    // A constrained row: everything below reads the masked row.
    let masked = spec
        .allowed
        .map(|allowed| mask::masked_logits(logits, allowed));
    let logits = masked.as_deref().unwrap_or(logits);
    // A working copy only when penalties or bans change some logits; the
    // common case (no penalties, no bans) reads the row in place.
    let adjusted = adjusted_logits(logits, spec);
    let work = adjusted.as_deref().unwrap_or(logits);
    let mut token = if params.temperature < GREEDY_TEMPERATURE {
        argmax(work)
    } else {
        draw(work, spec)
    };
    if let Some(allowed) = spec.allowed {
        if !allowed.is_allowed(token as u32) {
            // Every allowed token's logit is -inf (argmax fell back to id
            // 0): still pick one the constraint allows.
            token = mask::first_allowed(allowed, logits.len()).unwrap_or(token);
        }
    }
    let (logprob, top_logprobs) = match params.logprobs {
        None => (f32::NAN, Vec::new()),
        Some(k) => {
            let log_norm = log_sum_exp(logits);
            let mut top = if k > 0 {
                top_k_logprobs(logits, log_norm, k as usize)
            } else {
                Vec::new()
            };
            if spec.allowed.is_some() {
                // Disallowed tokens are not alternatives (-inf).
                top.retain(|&(_, logprob)| logprob.is_finite());
            }
            ((sanitize(logits[token]) as f64 - log_norm) as f32, top)
        }
    };
    SampledToken {
        token: token as u32,
        logprob,
        top_logprobs,
    }
}

/// Samples every row (`rows[i]` with `specs[i]`) on up to `max_threads`
/// threads (rows are independent), results in row order. Each row costs a
/// pass or two over the vocabulary, so a large decode batch sampled on one
/// thread would dominate the step.
pub fn sample_rows<L: AsRef<[f32]> + Sync>(
    rows: &[L],
    specs: &[&SampleSpec<'_>],
    max_threads: usize,
) -> Vec<SampledToken> {
    assert_eq!(rows.len(), specs.len(), "sample_rows: one spec per row");
    let threads = max_threads.min(rows.len()).max(1);
    if threads == 1 {
        return rows
            .iter()
            .zip(specs)
            .map(|(l, spec)| sample(l.as_ref(), spec))
            .collect();
    }
    let chunk = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = rows
            .chunks(chunk)
            .zip(specs.chunks(chunk))
            .map(|(rows, specs)| {
                scope.spawn(move || {
                    rows.iter()
                        .zip(specs)
                        .map(|(l, spec)| sample(l.as_ref(), spec))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fast_path_tests;

#[cfg(test)]
mod mask_tests;
