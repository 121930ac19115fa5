//! Reductions over one row of logits: NaN handling, the argmax, the
//! log-normaliser and the top log-probabilities (the raw model
//! log-softmax, before any adjustment).

/// NaN logits count as -inf.
pub(super) fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The largest value; the lowest id among equal ones; NaN counts as -inf
/// (and id 0 when nothing is above -inf).
pub(super) fn argmax(values: &[f32]) -> usize {
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
pub(super) fn log_sum_exp(values: &[f32]) -> f64 {
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

/// The `k` best raw log-probabilities, best first (ties: lower id first).
pub(super) fn top_k_logprobs(logits: &[f32], log_norm: f64, k: usize) -> Vec<(u32, f32)> {
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
