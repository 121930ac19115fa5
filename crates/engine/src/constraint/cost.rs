//! What a constraint costs the engine per generated token: its masks (on
//! the mask pool) and its matcher's advance (on the engine thread), timed
//! on random walks through the grammar. The numbers size the mask pool and
//! show where a step can wait; `examples/constraint_cost.rs` prints them.

use std::time::{Duration, Instant};

use super::matcher::RequestMatcher;
use super::{ConstraintError, ConstraintSpec, StructuredOutputs};

/// Per-token timings of [`StructuredOutputs::walk_cost`].
#[derive(Clone, Debug, Default)]
pub struct WalkCost {
    /// One entry per mask computed (the words at the logits' width included).
    pub masks: Vec<Duration>,
    /// One entry per token the matcher consumed.
    pub advances: Vec<Duration>,
    /// Walks that reached a state where the grammar stopped.
    pub finished: usize,
}

impl StructuredOutputs {
    /// Walks `walks` random outputs of at most `tokens` tokens through
    /// `spec`'s grammar, spread over `threads` threads as the mask pool
    /// spreads requests (each walk's matcher from the grammar cache, as a
    /// request's is): at each token the mask at `width`, then a token drawn
    /// uniformly among the allowed ones (seeded by `seed` and the walk),
    /// then the matcher's advance. A random model at temperature 1 behaves
    /// alike (any allowed token is as likely as another).
    pub fn walk_cost(
        &self,
        spec: &ConstraintSpec,
        walks: usize,
        tokens: usize,
        width: usize,
        seed: u64,
        threads: usize,
    ) -> Result<WalkCost, ConstraintError> {
        // Compiled once up front: the walks take it from the cache.
        self.compile(spec)?;
        let threads = threads.clamp(1, walks.max(1));
        let parts: Vec<Result<WalkCost, ConstraintError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let mine: Vec<usize> = (t..walks).step_by(threads).collect();
                    scope.spawn(move || {
                        let mut cost = WalkCost::default();
                        for walk in mine {
                            let seed = seed.wrapping_add(walk as u64);
                            self.walk(spec, tokens, width, seed, &mut cost)?;
                        }
                        Ok(cost)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a walk panicked"))
                .collect()
        });
        let mut cost = WalkCost::default();
        for part in parts {
            let part = part?;
            cost.masks.extend(part.masks);
            cost.advances.extend(part.advances);
            cost.finished += part.finished;
        }
        Ok(cost)
    }

    fn walk(
        &self,
        spec: &ConstraintSpec,
        tokens: usize,
        width: usize,
        seed: u64,
        cost: &mut WalkCost,
    ) -> Result<(), ConstraintError> {
        let mut matcher = RequestMatcher::new(self.compile(spec)?);
        let mut state = seed;
        for _ in 0..tokens {
            let started = Instant::now();
            let Ok(words) = matcher.mask(width) else {
                break;
            };
            cost.masks.push(started.elapsed());
            let allowed: Vec<u32> = (0..width as u32)
                .filter(|&t| words[t as usize / 32] >> (t % 32) & 1 == 1)
                .collect();
            if allowed.is_empty() {
                break;
            }
            // A 64-bit LCG (Knuth's constants): reproducible draws.
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let token = allowed[(state >> 33) as usize % allowed.len()];
            let started = Instant::now();
            let stopped = matcher.advance(token);
            cost.advances.push(started.elapsed());
            if stopped.unwrap_or(true) {
                cost.finished += 1;
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::ConstraintLimits;

    const DEMO_TOKENIZER: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");

    #[test]
    fn walks_finish_a_short_choice_and_time_every_token() {
        let compiler = StructuredOutputs::from_tokenizer_file(
            DEMO_TOKENIZER.as_ref(),
            &[604, 602],
            ConstraintLimits::default(),
        )
        .unwrap();
        let spec = ConstraintSpec::Choice(vec!["yes".into(), "no".into()]);
        let cost = compiler.walk_cost(&spec, 5, 50, 640, 7, 2).unwrap();
        // Each walk spells a choice and then may only end: every walk
        // finishes well inside 50 tokens, with a mask before each advance.
        assert_eq!(cost.finished, 5);
        assert_eq!(cost.masks.len(), cost.advances.len());
        assert!(cost.advances.len() >= 5 && cost.advances.len() < 5 * 50);
    }
}
