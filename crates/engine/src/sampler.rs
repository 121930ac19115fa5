//! CPU sampler: one token from one row of logits, with vLLM's semantics.
//!
//! Order (vLLM v1 `Sampler`): banned ids and penalties on the raw logits,
//! then greedy argmax (temperature below 1e-5) or: temperature, min-p,
//! top-k, top-p, and a draw from what is left. Log-probabilities are the raw
//! model log-softmax (before all of that), as vLLM's default `raw_logprobs`.
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
//! sampler is its oracle. Randomness is a pure function of [`SampleSeed`],
//! so a request samples the same tokens whatever batch it runs in and after
//! a preemption (recomputed requests repeat their draws).

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::executor::{SampleSeed, SampleSpec, SampledToken};

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// SplitMix64's increment (the golden-ratio gamma of Steele et al.).
const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Steele, Lea, Flood 2014; the seeding function of
/// `java.util.SplittableRandom` and xoshiro): a bijective 64-bit mix whose
/// outputs for consecutive inputs pass BigCrush.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The race's per-row key from (`seed`, `draw`): two chained SplitMix64
/// mixes, the draw index mixed on its own first so that (s, d) and
/// (s ^ d, 0)-style collisions do not line up.
pub fn race_key(seed: SampleSeed) -> u64 {
    splitmix64(seed.seed ^ splitmix64(seed.draw))
}

/// Token `token`'s uniform number for the row keyed `key`: the
/// `token`-th output of a SplitMix64 stream started at `key` (a
/// counter-based generator: no state, any token in any order), as an odd
/// multiple of 2^-53, so strictly inside (0, 1) and exact in f64.
pub fn race_uniform(key: u64, token: u32) -> f64 {
    let bits = splitmix64(key.wrapping_add((token as u64).wrapping_mul(SPLITMIX_GAMMA)));
    ((bits >> 11) | 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A kept token's race score: its log-weight plus a Gumbel variable
/// `-ln(-ln u)`; the highest score wins the draw.
pub fn race_score(x: f32, max: f32, temperature: f32, u: f64) -> f64 {
    (x as f64 - max as f64) / temperature as f64 - (-u.ln()).ln()
}

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
    // A working copy only when penalties or bans change some logits; the
    // common case (no penalties, no bans) reads the row in place.
    let adjusted = adjusted_logits(logits, spec);
    let work = adjusted.as_deref().unwrap_or(logits);
    let token = if params.temperature < GREEDY_TEMPERATURE {
        argmax(work)
    } else {
        draw(work, spec)
    };
    let (logprob, top_logprobs) = match params.logprobs {
        None => (f32::NAN, Vec::new()),
        Some(k) => {
            let log_norm = log_sum_exp(logits);
            let top = if k > 0 {
                top_k_logprobs(logits, log_norm, k as usize)
            } else {
                Vec::new()
            };
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

/// One token's change before the draw, from the sequence's history and the
/// request's bans: the sparse form of penalties and bans (a few entries per
/// row, not a vocabulary-sized mask), applied in this order by both this
/// sampler and the GPU kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitAdjustment {
    pub token: u32,
    /// Divide the logit by the repetition penalty if positive, multiply it
    /// otherwise (the token is in the prompt or the output).
    pub repetition: bool,
    /// Then subtract this: `presence + frequency * count` for a token seen
    /// `count` times in the output, 0 otherwise.
    pub subtract: f32,
    /// Then -inf, unless every token ends up banned or -inf (then every ban
    /// of the row is lifted rather than inventing a token).
    pub ban: bool,
}

/// The adjustments of one row (`vocab` tokens), one per token that has any,
/// by ascending id (vLLM `apply_penalties`: repetition over prompt +
/// output, presence once and frequency per occurrence over the output
/// only; then the bans). Ids at or beyond `vocab` are dropped.
pub fn adjustments(spec: &SampleSpec<'_>, vocab: usize) -> Vec<LogitAdjustment> {
    let params = spec.params;
    let mut by_id: std::collections::BTreeMap<u32, LogitAdjustment> = Default::default();
    fn entry(
        by_id: &mut std::collections::BTreeMap<u32, LogitAdjustment>,
        vocab: usize,
        id: u32,
    ) -> Option<&mut LogitAdjustment> {
        ((id as usize) < vocab).then(|| {
            by_id.entry(id).or_insert(LogitAdjustment {
                token: id,
                repetition: false,
                subtract: 0.0,
                ban: false,
            })
        })
    }
    if params.repetition_penalty != 1.0 {
        for &id in spec.history {
            if let Some(e) = entry(&mut by_id, vocab, id) {
                e.repetition = true;
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
            if let Some(e) = entry(&mut by_id, vocab, id) {
                e.subtract = params.presence_penalty + params.frequency_penalty * count as f32;
            }
        }
    }
    for &id in spec.banned {
        if let Some(e) = entry(&mut by_id, vocab, id) {
            e.ban = true;
        }
    }
    by_id.into_values().collect()
}

/// `x` after a repetition penalty of `penalty` (the one formula, f32).
fn repetition(x: f32, penalty: f32) -> f32 {
    if x > 0.0 {
        x / penalty
    } else {
        x * penalty
    }
}

/// The row after penalties and bans (sanitised), or `None` when neither
/// changes anything, so that the row is read in place.
fn adjusted_logits(logits: &[f32], spec: &SampleSpec<'_>) -> Option<Vec<f32>> {
    let list = adjustments(spec, logits.len());
    if list.is_empty() {
        return None;
    }
    let mut work: Vec<f32> = logits.iter().map(|&x| sanitize(x)).collect();
    let mut saved = Vec::new();
    for a in &list {
        let x = &mut work[a.token as usize];
        if a.repetition {
            *x = repetition(*x, spec.params.repetition_penalty);
        }
        *x -= a.subtract;
        if a.ban {
            saved.push((a.token as usize, *x));
            *x = f32::NEG_INFINITY;
        }
    }
    if !saved.is_empty() && !work.iter().any(|x| x.is_finite()) {
        // Everything is banned or -inf: lift the ban.
        for (id, x) in saved {
            work[id] = x;
        }
    }
    Some(work)
}

/// NaN logits count as -inf.
fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The largest value; the lowest id among equal ones; NaN counts as -inf
/// (and id 0 when nothing is above -inf).
fn argmax(values: &[f32]) -> usize {
    let max = max_ignoring_nan(values);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    values
        .iter()
        .position(|&x| x == max)
        .expect("the maximum is in the row")
}

/// The maximum, NaN ignored (-inf for a row of NaN and -inf). Independent
/// lanes so that the loop vectorises: `if x > m { x } else { m }` is one
/// `max` instruction per lane and skips NaN like `sanitize` would.
fn max_ignoring_nan(values: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, &x) in lanes.iter_mut().zip(rest) {
        *m = if x > *m { x } else { *m };
    }
    lanes
        .into_iter()
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// The log-normaliser of the raw row (NaN as -inf).
fn log_sum_exp(values: &[f32]) -> f64 {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let sum: f64 = values
        .iter()
        .map(|&x| ((sanitize(x) - max) as f64).exp())
        .sum();
    max as f64 + sum.ln()
}

/// Descending probability, then ascending id: a total order, so truncation
/// and the draw do not depend on the sort algorithm.
fn by_prob_desc(a: &(usize, f64), b: &(usize, f64)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// Up to this `top_k`, [`weighted_candidates`] skips the `exp` of tokens
/// that cannot survive top-k.
const PREFILTER_MAX_TOP_K: usize = 256;

/// Unnormalised probabilities `(id, exp((x - max) / T))` of the finite
/// tokens, in id order, and `false`; with a small `top_k` and more than k
/// finite tokens, only those whose weight can reach the k-th largest, and
/// `true`. Those hold every token top-k keeps, and every min-p survivor
/// when min-p leaves no more than k (the weight is monotone in x and
/// min-p keeps the weights above a threshold).
fn weighted_candidates(
    work: &[f32],
    max: f64,
    temperature: f64,
    top_k: usize,
) -> (Vec<(usize, f64)>, bool) {
    let scaled = |x: f32| (x as f64 - max) / temperature;
    if (1..=PREFILTER_MAX_TOP_K).contains(&top_k) {
        if let Some(kth) = kth_largest_finite(work, top_k) {
            // The k-th largest weight is exp(scaled(kth)) (the weight is
            // monotone in x). A token more than 1e-9 below it in the
            // exponent weighs at least 1e-9 (relative) less: far beyond
            // exp's rounding (under one ulp), as long as the weight is a
            // normal number, so it cannot tie with or pass the k-th.
            let floor = scaled(kth);
            if floor.exp() >= 1e-290 {
                let floor = floor - 1e-9;
                let kept = work
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.is_finite() && scaled(**x) >= floor)
                    .map(|(i, &x)| (i, scaled(x).exp()))
                    .collect();
                return (kept, true);
            }
        }
    }
    let all = work
        .iter()
        .enumerate()
        .filter(|(_, x)| x.is_finite())
        .map(|(i, &x)| (i, scaled(x).exp()))
        .collect();
    (all, false)
}

/// The `k`-th largest finite value, `None` when there are no more than
/// `k` finite values (top-k then cuts nothing).
fn kth_largest_finite(values: &[f32], k: usize) -> Option<f32> {
    // The best k so far, descending, and one more to know that k+1 exist.
    let mut best: Vec<f32> = Vec::with_capacity(k + 2);
    for &x in values {
        if !x.is_finite() || (best.len() > k && x <= best[k]) {
            continue;
        }
        let at = best.partition_point(|&b| b >= x);
        best.insert(at, x);
        best.truncate(k + 1);
    }
    (best.len() > k).then(|| best[k - 1])
}

/// Temperature, min-p, top-k, top-p, then the race (module docs). NaN in
/// `work` counts as -inf (dropped with the non-finite ones). A row with
/// nothing finite, or with +inf (which holds all the mass), draws like
/// greedy: the lowest id at the maximum.
fn draw(work: &[f32], spec: &SampleSpec<'_>) -> usize {
    let params = spec.params;
    let temperature = params.temperature as f64;
    let max_f32 = work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max_f32.is_finite() {
        return argmax(work);
    }
    let max = max_f32 as f64;
    let top_k = params.top_k as usize;
    let min_p = |candidates: &mut Vec<(usize, f64)>| {
        if params.min_p > 0.0 {
            // The most likely token has weight exp(0) = 1, so the threshold
            // min_p * max_prob is min_p in these unnormalised units.
            let threshold = params.min_p as f64;
            candidates.retain(|&(_, w)| w >= threshold);
        }
    };
    let (mut candidates, prefiltered) = weighted_candidates(work, max, temperature, top_k);
    min_p(&mut candidates);
    // Whether top-k cuts what min-p left of every finite token.
    let truncate_k = if !prefiltered {
        top_k > 0 && top_k < candidates.len()
    } else if candidates.len() != top_k {
        // Prefiltered: more than k finite tokens exist, and fewer than k
        // left means min-p left no more anywhere.
        candidates.len() > top_k
    } else if params.min_p <= 0.0 {
        true
    } else {
        // Exactly k left: whether min-p kept tokens below the prefilter
        // is unknown; count them all (rare).
        candidates = weighted_candidates(work, max, temperature, 0).0;
        min_p(&mut candidates);
        top_k < candidates.len()
    };
    let truncate_p = params.top_p < 1.0;
    if truncate_k {
        // vLLM keeps every token whose logit equals the k-th (`logits <
        // kth` is masked), so ties at the boundary stay. `by_prob_desc` is
        // a total order, so the k-th by selection is the k-th of a sort.
        let (_, kth, _) = candidates.select_nth_unstable_by(top_k - 1, by_prob_desc);
        let kth = kth.1;
        candidates.retain(|&(_, w)| w >= kth);
    }
    if truncate_p {
        // `by_prob_desc` as integer keys: the weights are finite and not
        // negative (exp of a finite number), where the bits order as the
        // values. A total order, so the unstable sort gives the stable
        // one's result.
        candidates.sort_unstable_by_key(|&(id, w)| (std::cmp::Reverse(w.to_bits()), id));
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
    race(
        work,
        max_f32,
        params.temperature,
        spec.seed,
        candidates.iter().map(|c| c.0),
    )
}

/// The race's winner among `kept` (ids into `work`): the highest
/// [`race_score`], the lowest id on equal scores.
fn race(
    work: &[f32],
    max: f32,
    temperature: f32,
    seed: SampleSeed,
    kept: impl Iterator<Item = usize>,
) -> usize {
    let key = race_key(seed);
    let mut best = (f64::NEG_INFINITY, usize::MAX);
    for id in kept {
        let score = race_score(work[id], max, temperature, race_uniform(key, id as u32));
        if score > best.0 || (score == best.0 && id < best.1) {
            best = (score, id);
        }
    }
    assert!(best.1 != usize::MAX, "the race needs a kept token");
    best.1
}

/// The `k` best raw log-probabilities, best first (ties: lower id first).
fn top_k_logprobs(logits: &[f32], log_norm: f64, k: usize) -> Vec<(u32, f32)> {
    // One scan keeping the best `k` so far, best first (k is at most
    // `MAX_LOGPROBS`): ids come in ascending order, so a newcomer equal to
    // the k-th loses the tie, as in `by_prob_desc`.
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
    for (i, &x) in logits.iter().enumerate() {
        let x = sanitize(x);
        if best.len() == k && x <= best[k - 1].1 {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= x);
        best.insert(at, (i, x));
        best.truncate(k);
    }
    best.into_iter()
        .map(|(i, x)| (i as u32, (x as f64 - log_norm) as f32))
        .collect()
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sampler_fast_tests.rs"]
mod fast_tests;
