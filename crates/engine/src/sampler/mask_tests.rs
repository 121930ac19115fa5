//! The constrained row: only allowed tokens are drawn, greedy takes the
//! best allowed one, logprobs are renormalised over the allowed tokens,
//! and `min_tokens` bans give way when they would leave nothing allowed.

use super::*;
use crate::executor::{AllowedTokens, SampleSeed};
use crate::request::SamplingParams;

fn mask_of(tokens: &[u32], width: usize) -> AllowedTokens {
    let mut words = vec![0u32; width.div_ceil(32)];
    for &t in tokens {
        words[t as usize / 32] |= 1 << (t % 32);
    }
    AllowedTokens::ready(words)
}

fn spec<'a>(
    params: &'a SamplingParams,
    allowed: &'a AllowedTokens,
    banned: &'a [u32],
    draw: u64,
) -> SampleSpec<'a> {
    SampleSpec {
        params,
        history: &[],
        prompt_len: 0,
        seed: SampleSeed { seed: 11, draw },
        banned,
        allowed: Some(allowed),
    }
}

/// Logits with distinct values, the largest at token 0.
fn logits(n: usize) -> Vec<f32> {
    (0..n).map(|i| 3.0 - (i as f32) * 0.05).collect()
}

#[test]
fn only_allowed_tokens_are_drawn_in_proportion() {
    let row = logits(100);
    let allowed_ids = [5u32, 40, 41, 97];
    let allowed = mask_of(&allowed_ids, 100);
    let params = SamplingParams::default();
    let n = 20_000;
    let mut counts = [0u64; 4];
    for draw in 0..n {
        let t = sample(&row, &spec(&params, &allowed, &[], draw)).token;
        let at = allowed_ids.iter().position(|&a| a == t);
        counts[at.unwrap_or_else(|| panic!("drew disallowed token {t}"))] += 1;
    }
    // The allowed tokens' probabilities renormalised among themselves.
    let weights: Vec<f64> = allowed_ids
        .iter()
        .map(|&t| (row[t as usize] as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let chi2: f64 = weights
        .iter()
        .zip(counts)
        .map(|(w, c)| {
            let e = w / total * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    // 0.1 % critical value of chi-square with 3 degrees of freedom.
    assert!(chi2 < 16.266, "chi2 {chi2}, counts {counts:?}");
}

#[test]
fn greedy_takes_the_best_allowed_token() {
    let row = logits(70);
    let allowed = mask_of(&[12, 33, 64], 70);
    let params = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    assert_eq!(sample(&row, &spec(&params, &allowed, &[], 0)).token, 12);
}

#[test]
fn logprobs_are_renormalised_over_the_allowed_tokens() {
    let row = logits(50);
    let allowed = mask_of(&[3, 7, 20], 50);
    let params = SamplingParams {
        logprobs: Some(5),
        ..Default::default()
    };
    let got = sample(&row, &spec(&params, &allowed, &[], 1));
    let norm = [3usize, 7, 20]
        .iter()
        .map(|&t| (row[t] as f64).exp())
        .sum::<f64>()
        .ln();
    let expect = (row[got.token as usize] as f64 - norm) as f32;
    assert!((got.logprob - expect).abs() < 1e-6, "{got:?} vs {expect}");
    let ids: Vec<u32> = got.top_logprobs.iter().map(|e| e.0).collect();
    assert_eq!(ids, [3, 7, 20], "only allowed tokens, best first");
    let mass: f64 = got.top_logprobs.iter().map(|e| (e.1 as f64).exp()).sum();
    assert!((mass - 1.0).abs() < 1e-5, "mass {mass}");
}

#[test]
fn bans_apply_among_allowed_tokens_and_give_way_to_the_grammar() {
    let row = logits(40);
    let params = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let allowed = mask_of(&[2, 9], 40);
    assert_eq!(sample(&row, &spec(&params, &allowed, &[2], 0)).token, 9);
    // Banning every allowed token would leave nothing: the grammar wins.
    let only_eos = mask_of(&[9], 40);
    assert_eq!(sample(&row, &spec(&params, &only_eos, &[9], 0)).token, 9);
}

#[test]
fn tokens_beyond_a_narrow_mask_and_all_minus_infinity_rows_stay_allowed_only() {
    // The mask covers 32 of 40 tokens: 32..40 (the best after 0..) are out.
    let mut row = vec![-1.0f32; 40];
    row[35] = 10.0;
    row[4] = 0.5;
    let allowed = AllowedTokens::ready(vec![1 << 4 | 1 << 6]);
    for temperature in [0.0, 1.0] {
        let params = SamplingParams {
            temperature,
            ..Default::default()
        };
        let t = sample(&row, &spec(&params, &allowed, &[], 3)).token;
        assert!(t == 4 || t == 6, "drew {t}");
    }
    // Every allowed token at -inf: still an allowed one (the lowest).
    let mut dead = row.clone();
    dead[4] = f32::NEG_INFINITY;
    dead[6] = f32::NAN;
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    assert_eq!(sample(&dead, &spec(&greedy, &allowed, &[], 0)).token, 4);
}
