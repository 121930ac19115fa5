//! Rows with allowed-token masks (structured outputs) on the device
//! sampler. A constrained row is sampled as its row with every disallowed
//! token at -inf, before penalties, bans, temperature and truncation; its
//! logprobs are that masked row's log-softmax (vLLM's), its top list the
//! finite entries only, and a row whose allowed tokens are all -inf takes
//! the lowest allowed id. Three checks:
//! - against the CPU sampler on the masked row ([`premasked`], with those
//!   two rules applied to its answer: [`answer`]), mixed with unconstrained
//!   rows in every call (needs nothing but today's sampler);
//! - independent of any sampler: every token is allowed, and a greedy row's
//!   token is the argmax over its allowed tokens computed here;
//! - against the engine's CPU sampler given the mask itself
//!   (`SampleSpec::allowed`): this one needs the engine's CPU masking (the
//!   structured-outputs engine change); before it, the CPU sampler ignores
//!   `allowed` and the test fails on the first masked row it disagrees on.

use super::*;

/// Mask layouts the random rows get, `random_mask`'s kinds.
const MASK_KINDS: u64 = 5;

/// The raw best token of a row (lowest id at the maximum, NaN as -inf).
fn best_raw(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if sanitized(x) > sanitized(row[best]) {
            best = i;
        }
    }
    best
}

fn sanitized(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

fn set(words: &mut [u32], token: usize) {
    words[token / 32] |= 1 << (token % 32);
}

fn clear(words: &mut [u32], token: usize) {
    words[token / 32] &= !(1 << (token % 32));
}

/// A random mask of `vocab` tokens, each allowed with a random density
/// (at least one allowed).
pub(super) fn random_density_mask(rng: &mut Rng, vocab: usize) -> Vec<u32> {
    let density = 0.02 + 0.9 * rng.unit();
    let mut words = vec![0u32; gdn_kernels::mask_words(vocab)];
    for t in 0..vocab {
        if rng.unit() < density {
            set(&mut words, t);
        }
    }
    set(&mut words, rng.below(vocab as u64) as usize);
    words
}

/// A random mask for `row`: exactly one allowed token; the row's best raw
/// token disallowed (others at a random density); a few allowed tokens; most
/// allowed; or a mask narrower than the row (the tokens beyond it
/// disallowed). At least one token is allowed.
pub(super) fn random_mask(rng: &mut Rng, row: &[f32]) -> Vec<u32> {
    let vocab = row.len();
    let w = gdn_kernels::mask_words(vocab);
    match rng.below(MASK_KINDS) {
        0 => {
            let mut words = vec![0u32; w];
            set(&mut words, rng.below(vocab as u64) as usize);
            words
        }
        1 => {
            let mut words = random_density_mask(rng, vocab);
            let best = best_raw(row);
            clear(&mut words, best);
            if words.iter().all(|&x| x == 0) {
                // A one-token row keeps its token: nothing else exists.
                set(&mut words, (best + 1) % vocab);
            }
            words
        }
        2 => {
            let mut words = vec![0u32; w];
            for _ in 0..1 + rng.below(64) {
                set(&mut words, rng.below(vocab as u64) as usize);
            }
            words
        }
        3 => {
            let mut words = vec![u32::MAX; w];
            for t in 0..vocab {
                if rng.below(10) == 0 {
                    clear(&mut words, t);
                }
            }
            set(&mut words, rng.below(vocab as u64) as usize);
            words
        }
        _ => {
            let narrow = 1 + rng.below(w as u64) as usize;
            let mut words = random_density_mask(rng, vocab);
            words.truncate(narrow);
            set(
                &mut words,
                rng.below((narrow * 32).min(vocab) as u64) as usize,
            );
            words
        }
    }
}

/// A copy of a mask (the engine's type is not `Clone`: its words may be
/// pending).
pub(super) fn copy(a: &Option<AllowedTokens>) -> Option<AllowedTokens> {
    a.as_ref().map(|a| AllowedTokens::ready(a.words().to_vec()))
}

/// The lowest token below `vocab` that `a` allows.
fn lowest_allowed(a: &AllowedTokens, vocab: usize) -> Option<u32> {
    (0..vocab as u32).find(|&t| a.is_allowed(t))
}

/// The answer for `c` by the definition: the CPU sampler on the masked row,
/// then, for a constrained row, only the finite top entries and the lowest
/// allowed id where the sampler's token is not allowed (every allowed token
/// is -inf: the sampler fell back to id 0).
pub(super) fn answer(c: &Case) -> SampledToken {
    let masked = premasked(c);
    let mut want = sampler::sample(&masked.row, &masked.spec());
    if let Some(a) = &c.allowed {
        want.top_logprobs.retain(|e| e.1.is_finite());
        if !a.is_allowed(want.token) {
            if let Some(t) = lowest_allowed(a, c.row.len()) {
                want.token = t;
            }
        }
    }
    want
}

/// `c` as an unconstrained case: its row with every disallowed token at
/// -inf (the definition of a constrained row).
pub(super) fn premasked(c: &Case) -> Case {
    let mut masked = clone_case(c);
    if let Some(a) = masked.allowed.take() {
        for (t, x) in masked.row.iter_mut().enumerate() {
            if !a.is_allowed(t as u32) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    masked
}

/// The greedy token of a constrained case, worked out here: the allowed
/// tokens' logits after penalties and bans (a row left with nothing finite
/// gets its bans back), the lowest id at the maximum; the lowest allowed id
/// when no allowed token is finite.
fn allowed_argmax(c: &Case) -> u32 {
    let a = c.allowed.as_ref().expect("a constrained case");
    let mut work: Vec<f32> = c
        .row
        .iter()
        .enumerate()
        .map(|(t, &x)| {
            if a.is_allowed(t as u32) {
                sanitized(x)
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    if !work.iter().any(|x| x.is_finite()) {
        return lowest_allowed(a, work.len()).expect("a mask allows a token");
    }
    let mut banned = Vec::new();
    for adj in sampler::adjustments(&c.spec(), work.len()) {
        let x = &mut work[adj.token as usize];
        if adj.repetition {
            let r = c.params.repetition_penalty;
            *x = if *x > 0.0 { *x / r } else { *x * r };
        }
        *x -= adj.subtract;
        if adj.ban {
            banned.push((adj.token as usize, *x));
            *x = f32::NEG_INFINITY;
        }
    }
    if !work.iter().any(|x| x.is_finite()) {
        for (t, x) in banned {
            work[t] = x;
        }
    }
    let max = work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    work.iter().position(|&x| x == max).expect("a maximum") as u32
}

/// What every masked call of the random tests holds: (vocab, rows per call,
/// calls), at least 10,000 rows, about half of them constrained.
const MASKED_TEST_PLAN: [(usize, usize, usize); 6] = [
    (QWEN35_VOCAB, 64, 8),
    (7, 1000, 3),
    (40, 1000, 3),
    (300, 1000, 1),
    (1025, 500, 4),
    (5000, 250, 4),
];
const MASKED_TEST_SEED: u64 = 0x3a5c;

/// Random cases of one call, about half with a random mask.
fn masked_call(rng: &mut Rng, vocab: usize, per_call: usize) -> Vec<Case> {
    (0..per_call)
        .map(|_| {
            let mut c = Case::random(rng, vocab);
            if rng.below(2) == 0 {
                c.allowed = Some(AllowedTokens::ready(random_mask(rng, &c.row)));
            }
            c
        })
        .collect()
}

/// Checks what holds whatever the oracle: a constrained row's token is
/// allowed, a greedy one is the argmax over its allowed tokens, and its top
/// list holds allowed tokens only. Returns whether `c` is constrained.
fn check_allowed(c: &Case, got: &SampledRow, what: &str) -> bool {
    let Some(a) = &c.allowed else {
        return false;
    };
    assert!(
        a.is_allowed(got.token),
        "{what}: token {} is not allowed",
        got.token
    );
    if c.params.temperature < GREEDY_TEMPERATURE {
        assert_eq!(
            got.token,
            allowed_argmax(c),
            "{what}: not the best allowed token"
        );
    }
    for &(t, _) in &got.top_logprobs {
        assert!(a.is_allowed(t), "{what}: top entry {t} is not allowed");
    }
    true
}

#[test]
fn masked_rows_sample_what_the_cpu_sampler_samples_from_the_masked_row() {
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let mut rng = Rng(MASKED_TEST_SEED);
    let mut tally = Tally::default();
    let mut constrained = 0;
    for (vocab, per_call, calls) in MASKED_TEST_PLAN {
        for call in 0..calls {
            let cases = masked_call(&mut rng, vocab, per_call);
            let got = sample_on_device(&mut sampler, &s, &cases, vocab, &mut rng);
            assert_eq!(got.len(), cases.len());
            for (i, (c, g)) in cases.iter().zip(&got).enumerate() {
                let what = format!("vocab {vocab} call {call} row {i}");
                constrained += usize::from(check_allowed(c, g, &what));
                compare(&premasked(c), g, &answer(c), &what, &mut tally);
            }
        }
    }
    println!(
        "{} rows ({constrained} constrained, {} sampled), {} rounding-boundary differences",
        tally.rows, tally.sampled, tally.boundary
    );
    assert!(tally.rows >= 10_000 && constrained * 3 >= tally.rows);
    assert!(
        tally.boundary * 10_000 <= tally.rows,
        "{} boundary differences in {} rows",
        tally.boundary,
        tally.rows
    );
}

/// Needs the engine's CPU masking (see the module doc): the CPU sampler
/// given `allowed` itself, through `sample_rows` as the CPU executor calls it.
#[test]
fn masked_rows_sample_what_the_engine_cpu_sampler_samples_given_the_mask() {
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let mut rng = Rng(MASKED_TEST_SEED ^ 1);
    let mut tally = Tally::default();
    for (vocab, per_call, calls) in MASKED_TEST_PLAN {
        for call in 0..calls {
            let cases = masked_call(&mut rng, vocab, per_call);
            let got = sample_on_device(&mut sampler, &s, &cases, vocab, &mut rng);
            let rows: Vec<&[f32]> = cases.iter().map(|c| c.row.as_slice()).collect();
            let specs: Vec<SampleSpec> = cases.iter().map(Case::spec).collect();
            let spec_refs: Vec<&SampleSpec> = specs.iter().collect();
            let want = sampler::sample_rows(&rows, &spec_refs, 2);
            for (i, ((c, g), w)) in cases.iter().zip(&got).zip(&want).enumerate() {
                let what = format!("vocab {vocab} call {call} row {i}");
                // A boundary is shown on the masked row (the same row).
                compare(&premasked(c), g, w, &what, &mut tally);
            }
        }
    }
    assert!(
        tally.boundary * 10_000 <= tally.rows,
        "{} boundary differences in {} rows",
        tally.boundary,
        tally.rows
    );
}

#[test]
fn hand_made_masked_rows_with_known_answers() {
    // Independent of the oracle: answers worked out by hand.
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let vocab = 6;
    let row = RowSampling {
        logits_row: 0,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        logprobs: Some(4),
        seed: 7,
        draw: 3,
        adjustments: &[],
        mask_row: None,
    };
    let logits_rows: [f32; 6] = [0.0, 3.0, 2.0, 1.0, 2.5, -1.0];
    let ninf = f32::NEG_INFINITY;
    let mut host: Vec<f32> = (0..5).flat_map(|_| logits_rows).collect();
    host.extend([1.0, 2.0, ninf, f32::NAN, 0.0, ninf]);
    let mut logits = s.clone_htod(&host).unwrap();
    let ban4 = [TokenAdjustment {
        token: 4,
        repetition: false,
        subtract: 0.0,
        ban: true,
    }];
    let mut rows = vec![row; 6];
    for (i, r) in rows.iter_mut().enumerate() {
        r.logits_row = i;
    }
    // Row 0: unconstrained, greedy: 1.
    // Row 1: {2, 4, 5} allowed (the best, 1, is not), greedy: 4.
    rows[1].mask_row = Some(0);
    // Row 2: only 5 allowed, drawn at temperature 1 with top-k 1: 5.
    rows[2].mask_row = Some(1);
    rows[2].temperature = 1.0;
    rows[2].top_k = 1;
    // Row 3: {2, 4, 5} allowed, 4 banned: 2.
    rows[3].mask_row = Some(0);
    rows[3].adjustments = &ban4;
    // Row 4: {4} allowed and banned: the ban is lifted, 4.
    rows[4].mask_row = Some(2);
    rows[4].adjustments = &ban4;
    // Row 5: {3, 5} allowed, both -inf (NaN counts as -inf), drawn: the
    // lowest allowed id, 3, with no alternatives to list.
    rows[5].mask_row = Some(3);
    rows[5].temperature = 0.8;
    let masks: Vec<u32> = vec![0b110100, 0b100000, 0b010000, 0b101000];
    let words = s.clone_htod(&masks).unwrap();
    let masks = gdn_kernels::TokenMasks {
        words: words.as_view(),
        words_per_row: 1,
    };
    let got = sampler
        .sample(&mut logits, vocab, &rows, Some(&masks))
        .unwrap();
    let tokens: Vec<u32> = got.iter().map(|r| r.token).collect();
    assert_eq!(tokens, vec![1, 4, 5, 2, 4, 3]);
    // Row 1's logprobs: the log-softmax of the allowed tokens only; the top
    // list (4 asked) holds the 3 allowed tokens, best first.
    let z: f64 = [2.0f64, 2.5, -1.0].iter().map(|x| x.exp()).sum();
    let lp = |x: f64| (x - z.ln()) as f32;
    assert!((got[1].logprob - lp(2.5)).abs() < 1e-6);
    let top: Vec<u32> = got[1].top_logprobs.iter().map(|t| t.0).collect();
    assert_eq!(top, vec![4, 2, 5]);
    assert!((got[1].top_logprobs[1].1 - lp(2.0)).abs() < 1e-6);
    assert!((got[1].top_logprobs[2].1 - lp(-1.0)).abs() < 1e-6);
    // Row 5: nothing finite to normalise: NaN, and no alternatives.
    assert!(got[5].logprob.is_nan());
    assert!(got[5].top_logprobs.is_empty());
    // Row 2: the only allowed token holds all the mass.
    assert_eq!(got[2].logprob, 0.0);
    // Unconstrained row 0 is the full row's log-softmax.
    let z0: f64 = logits_rows.iter().map(|&x| (x as f64).exp()).sum();
    assert!((got[0].logprob - (3.0 - z0.ln()) as f32).abs() < 1e-6);
    // A mask row narrower than the vocabulary, or past the masks, is refused.
    let short = gdn_kernels::TokenMasks {
        words: words.as_view(),
        words_per_row: 0,
    };
    assert!(sampler
        .sample(&mut logits, vocab, &rows, Some(&short))
        .is_err());
    rows[1].mask_row = Some(4);
    let why = sampler
        .sample(&mut logits, vocab, &rows, Some(&masks))
        .unwrap_err()
        .to_string();
    assert!(why.contains("mask row 4 of 4"), "{why}");
}
