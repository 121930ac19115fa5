//! Truncation before the draw: temperature, min-p, top-k and top-p (vLLM's
//! order), then the race among the tokens left.

use std::cmp::Ordering;

use super::logits::argmax;
use super::race::race;
use crate::executor::SampleSpec;

/// Descending probability, then ascending id: a total order, so truncation
/// and the draw do not depend on the sort algorithm.
pub(super) fn by_prob_desc(a: &(usize, f64), b: &(usize, f64)) -> Ordering {
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
pub(super) fn draw(work: &[f32], spec: &SampleSpec<'_>) -> usize {
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
