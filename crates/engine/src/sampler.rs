//! CPU sampler: one token from one row of logits, with vLLM's semantics.
//!
//! Order (vLLM v1 `Sampler`): banned ids and penalties on the raw logits,
//! then greedy argmax (temperature below 1e-5) or: temperature, min-p,
//! top-k, top-p, and a draw from what is left. Log-probabilities are the raw
//! model log-softmax (before all of that), as vLLM's default `raw_logprobs`.
//!
//! Randomness is a pure function of [`SampleSeed`] (`seed`, `draw`), so a
//! request samples the same tokens whatever batch it runs in and after a
//! preemption (recomputed requests repeat their draws).

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::executor::{SampleSeed, SampleSpec, SampledToken};

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
const GREEDY_TEMPERATURE: f32 = 1e-5;

/// SplitMix64's finaliser (Steele, Lea, Flood 2014; the seeding function of
/// `java.util.SplittableRandom` and xoshiro): a bijective 64-bit mix whose
/// outputs for consecutive inputs pass BigCrush.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from (`seed`, `draw`) with no state: a
/// counter-based generator (two chained SplitMix64 mixes; the draw index
/// is mixed on its own first so that (s, d) and (s ^ d, 0)-style collisions
/// do not line up), 53 bits of mantissa.
pub fn uniform(seed: SampleSeed) -> f64 {
    let bits = splitmix64(seed.seed ^ splitmix64(seed.draw));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Samples one token from `logits` (one row, vocabulary-sized).
///
/// Banned ids are never chosen unless every token is banned or non-finite
/// (then the ban is ignored rather than inventing a token). NaN logits
/// count as -inf.
pub fn sample(logits: &[f32], spec: &SampleSpec<'_>) -> SampledToken {
    assert!(!logits.is_empty(), "sample: empty logits row");
    let params = spec.params;
    // One working copy of the row (vocabulary-sized: up to ~250k floats).
    let mut work: Vec<f32> = logits.iter().map(|&x| sanitize(x)).collect();
    let log_norm = log_sum_exp(&work);

    apply_penalties(&mut work, spec);
    let mut saved = Vec::with_capacity(spec.banned.len());
    for &id in spec.banned {
        if let Some(x) = work.get_mut(id as usize) {
            saved.push((id as usize, *x));
            *x = f32::NEG_INFINITY;
        }
    }
    if !work.iter().any(|x| x.is_finite()) {
        // Everything is banned or -inf: lift the ban.
        for (id, x) in saved.into_iter().rev() {
            work[id] = x;
        }
    }

    let token = if params.temperature < GREEDY_TEMPERATURE {
        argmax(&work)
    } else {
        draw(&work, spec)
    };
    let top_logprobs = match params.logprobs {
        Some(k) if k > 0 => top_k_logprobs(logits, log_norm, k as usize),
        _ => Vec::new(),
    };
    SampledToken {
        token: token as u32,
        logprob: (sanitize(logits[token]) as f64 - log_norm) as f32,
        top_logprobs,
    }
}

/// NaN logits count as -inf.
fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// vLLM `apply_penalties`: repetition over prompt + output (divide positive
/// logits, multiply negative ones), presence once and frequency per
/// occurrence over the output only.
fn apply_penalties(work: &mut [f32], spec: &SampleSpec<'_>) {
    let params = spec.params;
    if params.repetition_penalty != 1.0 {
        let mut seen = vec![false; work.len()];
        for &id in spec.history {
            if let Some(flag) = seen.get_mut(id as usize) {
                *flag = true;
            }
        }
        for (x, seen) in work.iter_mut().zip(seen) {
            if seen {
                *x = if *x > 0.0 {
                    *x / params.repetition_penalty
                } else {
                    *x * params.repetition_penalty
                };
            }
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        let output = &spec.history[spec.prompt_len.min(spec.history.len())..];
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in output {
            *counts.entry(id).or_default() += 1;
        }
        for (id, count) in counts {
            if let Some(x) = work.get_mut(id as usize) {
                *x -= params.presence_penalty + params.frequency_penalty * count as f32;
            }
        }
    }
}

/// The largest value; the lowest id among equal ones.
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in values.iter().enumerate() {
        if x > values[best] {
            best = i;
        }
    }
    best
}

fn log_sum_exp(values: &[f32]) -> f64 {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let sum: f64 = values.iter().map(|&x| ((x - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

/// Descending probability, then ascending id: a total order, so truncation
/// and the draw do not depend on the sort algorithm.
fn by_prob_desc(a: &(usize, f64), b: &(usize, f64)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// Temperature, min-p, top-k, top-p, then one draw by inverse CDF.
fn draw(work: &[f32], spec: &SampleSpec<'_>) -> usize {
    let params = spec.params;
    let temperature = params.temperature as f64;
    let max = work.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    // Unnormalised probabilities of the finite tokens.
    let mut candidates: Vec<(usize, f64)> = work
        .iter()
        .enumerate()
        .filter(|(_, x)| x.is_finite())
        .map(|(i, &x)| (i, ((x as f64 - max) / temperature).exp()))
        .collect();
    if params.min_p > 0.0 {
        // The most likely token has weight exp(0) = 1, so the threshold
        // min_p * max_prob is min_p in these unnormalised units.
        let threshold = params.min_p as f64;
        candidates.retain(|&(_, w)| w >= threshold);
    }
    let top_k = params.top_k as usize;
    let truncate_k = top_k > 0 && top_k < candidates.len();
    let truncate_p = params.top_p < 1.0;
    if truncate_k || truncate_p {
        candidates.sort_by(by_prob_desc);
    }
    if truncate_k {
        // vLLM keeps every token whose logit equals the k-th (`logits <
        // kth` is masked), so ties at the boundary stay.
        let kth = candidates[top_k - 1].1;
        candidates.retain(|&(_, w)| w >= kth);
    }
    if truncate_p {
        // Keep the shortest prefix whose mass reaches top_p: a token stays
        // when the mass before it is below top_p (vLLM masks the ascending
        // prefix whose cumulative sum is <= 1 - top_p).
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        let limit = params.top_p as f64 * total;
        let mut before = 0.0;
        let mut keep = 0;
        for &(_, w) in &candidates {
            if before >= limit && keep > 0 {
                break;
            }
            before += w;
            keep += 1;
        }
        candidates.truncate(keep);
    }
    let total: f64 = candidates.iter().map(|c| c.1).sum();
    let target = uniform(spec.seed) * total;
    let mut acc = 0.0;
    for &(id, w) in &candidates {
        acc += w;
        if target < acc {
            return id;
        }
    }
    candidates.last().expect("at least one finite token").0
}

/// The `k` best raw log-probabilities, best first (ties: lower id first).
fn top_k_logprobs(logits: &[f32], log_norm: f64, k: usize) -> Vec<(u32, f32)> {
    let mut all: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i, sanitize(x) as f64))
        .collect();
    let k = k.min(all.len());
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, by_prob_desc);
        all.truncate(k);
    }
    all.sort_by(by_prob_desc);
    all.into_iter()
        .map(|(i, x)| (i as u32, (x - log_norm) as f32))
        .collect()
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
