//! Penalties and bans: the few logits of a row that change before the
//! draw, as a sparse list ([`LogitAdjustment`]) shared with the GPU
//! kernel, and the row they give on the CPU.

use std::collections::HashMap;

use super::logits::sanitize;
use crate::executor::SampleSpec;

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
pub(super) fn adjusted_logits(logits: &[f32], spec: &SampleSpec<'_>) -> Option<Vec<f32>> {
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
