//! A running request's matcher: llguidance's [`Matcher`] over its output,
//! its mask as words at the logits' width, advanced token by token.

use llguidance::Matcher;
use thiserror::Error;

use super::Compiled;

/// The matcher refused a token or failed (llguidance's message).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{0}")]
pub(crate) struct MatcherError(pub(crate) String);

pub(crate) struct RequestMatcher {
    matcher: Matcher,
}

impl RequestMatcher {
    pub(crate) fn new(compiled: Compiled) -> Self {
        RequestMatcher {
            matcher: Matcher::new(Ok(compiled.0)),
        }
    }

    /// Consumes output tokens it was not given one by one (a replay).
    pub(crate) fn replay(&mut self, missed: &[u32]) -> Result<(), MatcherError> {
        if !missed.is_empty() {
            self.matcher
                .consume_tokens(missed)
                .map_err(|e| MatcherError(e.to_string()))?;
        }
        Ok(())
    }

    /// Consumes a sampled token; `true` when the grammar is then complete
    /// (nothing may follow: the request stops here).
    pub(crate) fn advance(&mut self, token: u32) -> Result<bool, MatcherError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| MatcherError(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }

    /// Whether the grammar has ended (only EOS may follow).
    pub(crate) fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The tokens allowed next, as words covering `width` tokens (EOS
    /// only where the grammar accepts; tokens beyond the tokenizer never).
    pub(crate) fn mask(&mut self, width: usize) -> Result<Vec<u32>, MatcherError> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| MatcherError(e.to_string()))?;
        Ok(words_at_width(vob.as_slice(), vob.len(), width))
    }
}

/// `bits` (the first `len` bits of `data` meaningful) as words covering
/// `width` tokens: bits at or beyond `min(len, width)` cleared.
fn words_at_width(data: &[u32], len: usize, width: usize) -> Vec<u32> {
    let mut words = vec![0u32; width.div_ceil(32)];
    let valid = len.min(width);
    let full = valid / 32;
    words[..full].copy_from_slice(&data[..full]);
    let rest = valid % 32;
    if rest > 0 {
        words[full] = data[full] & ((1u32 << rest) - 1);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::{ConstraintLimits, ConstraintSpec, StructuredOutputs};

    const DEMO_TOKENIZER: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");
    const EOS: [u32; 2] = [604, 602];

    fn allowed(words: &[u32]) -> Vec<u32> {
        (0..words.len() as u32 * 32)
            .filter(|&t| words[t as usize / 32] >> (t % 32) & 1 == 1)
            .collect()
    }

    #[test]
    fn eos_is_allowed_only_where_the_grammar_accepts() {
        let compiler = StructuredOutputs::from_tokenizer_file(
            DEMO_TOKENIZER.as_ref(),
            &EOS,
            ConstraintLimits::default(),
        )
        .unwrap();
        assert_eq!(compiler.vocab_size(), 635);
        let spec = ConstraintSpec::Regex("ab+".into());
        let mut matcher = RequestMatcher::new(compiler.compile(&spec).unwrap());
        let first = allowed(&matcher.mask(640).unwrap());
        // Byte-level BPE: the single byte `a` is token 64 ('!' is 0).
        let a = (b'a' - b'!') as u32;
        let b = a + 1;
        assert!(first.contains(&a), "{first:?}");
        assert!(!first.contains(&b) && !first.contains(&EOS[0]));
        assert!(first.iter().all(|&t| t < 635));
        assert!(!matcher.advance(a).unwrap());
        assert!(!allowed(&matcher.mask(640).unwrap()).contains(&EOS[0]));
        assert!(!matcher.advance(b).unwrap(), "`ab` may go on with more b");
        let accepting = allowed(&matcher.mask(640).unwrap());
        assert!(accepting.contains(&EOS[0]) && accepting.contains(&EOS[1]));
        assert!(accepting.contains(&b) && !accepting.contains(&a));
        // A matcher that fell behind replays the output it missed.
        let mut late = RequestMatcher::new(compiler.compile(&spec).unwrap());
        late.replay(&[a, b]).unwrap();
        assert_eq!(allowed(&late.mask(640).unwrap()), accepting);
        // A token the grammar refuses is an error, not a silent skip.
        assert!(late.advance(a).is_err());
    }

    #[test]
    fn words_are_cut_to_the_tokenizer_and_padded_to_the_width() {
        // 40 valid bits of an all-ones vob, a 100-token row.
        let words = words_at_width(&[u32::MAX, u32::MAX], 40, 100);
        assert_eq!(words, [u32::MAX, 0xff, 0, 0]);
        // A row narrower than the tokenizer.
        assert_eq!(words_at_width(&[u32::MAX, u32::MAX], 64, 33), [u32::MAX, 1]);
    }
}
