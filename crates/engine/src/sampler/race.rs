//! The draw: an exponential race over the kept tokens, from a
//! counter-based generator keyed by the row's [`SampleSeed`] (the formula
//! is in the [`crate::sampler`] module doc; the GPU kernel computes the
//! same one).

use crate::executor::SampleSeed;

/// SplitMix64's increment (the golden-ratio gamma of Steele et al.).
const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Steele, Lea, Flood 2014; the seeding function of
/// `java.util.SplittableRandom` and xoshiro): a bijective 64-bit mix whose
/// outputs for consecutive inputs pass BigCrush.
pub(super) fn splitmix64(x: u64) -> u64 {
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

/// The race's winner among `kept` (ids into `work`): the highest
/// [`race_score`], the lowest id on equal scores.
pub(super) fn race(
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
