//! The tokens a constrained row may sample (structured outputs).
//!
//! Minimal stand-in for the engine's mask type so that the device sampler
//! can be built against it; the engine's own version (the grammar matchers
//! and their mask pool) replaces this file.

/// The tokens a constrained row may sample: bit `t % 32` of word `t / 32`
/// set means token `t` is allowed. Rows narrower than the executor's logits
/// width disallow the tokens beyond it.
#[derive(Debug)]
pub struct AllowedTokens {
    words: Vec<u32>,
}

impl AllowedTokens {
    /// A mask already computed.
    pub fn ready(words: Vec<u32>) -> Self {
        AllowedTokens { words }
    }

    /// The mask's words. Blocks until the engine's mask pool has computed
    /// them (this stand-in holds them already).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        self.words
            .get((token / 32) as usize)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }
}
