//! A constrained row's logits: the tokens its [`AllowedTokens`] disallows
//! set to -inf before anything else reads the row.

use super::logits::sanitize;
use crate::executor::AllowedTokens;

/// The row with every disallowed token (and every token beyond the mask's
/// words) at -inf; NaN counts as -inf.
pub(super) fn masked_logits(logits: &[f32], allowed: &AllowedTokens) -> Vec<f32> {
    let words = allowed.words();
    let mut out = vec![f32::NEG_INFINITY; logits.len()];
    for ((word, chunk), dst) in words.iter().zip(logits.chunks(32)).zip(out.chunks_mut(32)) {
        if *word == 0 {
            continue;
        }
        for (bit, (x, d)) in chunk.iter().zip(dst.iter_mut()).enumerate() {
            if word >> bit & 1 == 1 {
                *d = sanitize(*x);
            }
        }
    }
    out
}

/// The lowest allowed id within `width` tokens, for a row whose allowed
/// tokens all have -inf logits (the sampler must still pick an allowed one).
pub(super) fn first_allowed(allowed: &AllowedTokens, width: usize) -> Option<usize> {
    allowed
        .words()
        .iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i * 32 + w.trailing_zeros() as usize)
        .filter(|&t| t < width)
}
