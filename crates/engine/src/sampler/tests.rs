//! Sampler tests against hand-computed distributions and, for the random
//! paths, chi-square bounds declared up front: each check uses the 0.1 %
//! critical value of its degrees of freedom, so a correct sampler fails one
//! with probability 1e-3 per seed (and the seeds are fixed, so a pass is
//! reproducible); a wrong distribution of the sizes used here lands far
//! above the bound.

use super::*;
use crate::executor::SampleSeed;
use crate::request::SamplingParams;

/// Chi-square 0.1 % critical values by degrees of freedom (standard tables).
fn chi2_critical_0_001(dof: usize) -> f64 {
    match dof {
        1 => 10.828,
        2 => 13.816,
        3 => 16.266,
        5 => 20.515,
        7 => 24.322,
        9 => 27.877,
        15 => 37.697,
        _ => panic!("no table entry for {dof} degrees of freedom"),
    }
}

fn spec<'a>(params: &'a SamplingParams, history: &'a [u32], prompt_len: usize) -> SampleSpec<'a> {
    SampleSpec {
        params,
        history,
        prompt_len,
        seed: SampleSeed { seed: 7, draw: 0 },
        banned: &[],
        allowed: None,
    }
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

/// Logits whose softmax is exactly `probs`.
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

/// Counts of `n` draws (draw indices 0..n of one seed).
fn histogram(logits: &[f32], params: &SamplingParams, n: u64) -> Vec<u64> {
    let mut counts = vec![0; logits.len()];
    for draw in 0..n {
        let mut s = spec(params, &[], 0);
        s.seed = SampleSeed { seed: 0x5eed, draw };
        counts[sample(logits, &s).token as usize] += 1;
    }
    counts
}

/// Asserts counts fit `expected` (probabilities; zeros must get no draw).
fn assert_fits(counts: &[u64], expected: &[f64]) {
    let n: u64 = counts.iter().sum();
    let mut chi2 = 0.0;
    let mut dof = 0;
    for (&c, &p) in counts.iter().zip(expected) {
        if p == 0.0 {
            assert_eq!(c, 0, "a token of probability 0 was drawn: {counts:?}");
            continue;
        }
        let e = p * n as f64;
        chi2 += (c as f64 - e).powi(2) / e;
        dof += 1;
    }
    let bound = chi2_critical_0_001(dof - 1);
    assert!(
        chi2 < bound,
        "chi2 {chi2:.2} >= {bound} for {counts:?} vs {expected:?}"
    );
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let params = greedy();
    assert_eq!(
        sample(&[0.1, 3.0, -1.0, 2.9], &spec(&params, &[], 0)).token,
        1
    );
    assert_eq!(
        sample(&[1.0, 5.0, 5.0, 2.0], &spec(&params, &[], 0)).token,
        1
    );
    // NaN counts as -inf, not as a maximum.
    assert_eq!(
        sample(&[1.0, f32::NAN, 0.5], &spec(&params, &[], 0)).token,
        0
    );
}

#[test]
fn banned_ids_are_never_chosen() {
    let params = greedy();
    let mut s = spec(&params, &[], 0);
    s.banned = &[1];
    assert_eq!(sample(&[0.1, 3.0, -1.0, 2.9], &s).token, 3);
    // Sampled too: ban the two likeliest of four.
    let random = SamplingParams {
        seed: Some(1),
        ..SamplingParams::default()
    };
    let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
    for draw in 0..500 {
        let mut s = spec(&random, &[], 0);
        s.banned = &[2, 3];
        s.seed.draw = draw;
        assert!(sample(&logits, &s).token < 2);
    }
}

#[test]
fn a_ban_on_everything_is_lifted_rather_than_inventing_a_token() {
    let params = greedy();
    let mut s = spec(&params, &[], 0);
    s.banned = &[0, 1, 2];
    assert_eq!(sample(&[0.5, 2.0, f32::NEG_INFINITY], &s).token, 1);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits_of_all_seen() {
    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..greedy()
    };
    // Token 0 (2.0, in the prompt) becomes 1.0 < token 1's 1.5.
    let history = [0, 5];
    assert_eq!(
        sample(&[2.0, 1.5, 0.0], &spec(&params, &history, 2)).token,
        1
    );
    // Token 0 seen in the output counts too (repetition covers prompt + output).
    assert_eq!(
        sample(&[2.0, 1.5, 0.0], &spec(&params, &history, 1)).token,
        1
    );
    // Negative logits are multiplied: -0.6 seen becomes -1.2 < -1.0 unseen.
    assert_eq!(sample(&[-0.6, -1.0], &spec(&params, &[0], 1)).token, 1);
    // Unseen tokens are untouched: 2.0 stays the maximum.
    assert_eq!(sample(&[2.0, 1.5], &spec(&params, &[1], 1)).token, 0);
}

#[test]
fn presence_and_frequency_penalties_count_the_output_only() {
    let params = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..greedy()
    };
    // Token 0 appears twice in the output: 3.0 - (0.5 + 2 * 0.25) = 2.0 < 2.2.
    let history = [7, 0, 0];
    assert_eq!(
        sample(
            &[3.0, 2.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            &spec(&params, &history, 1)
        )
        .token,
        1
    );
    // Once: 3.0 - 0.75 = 2.25 > 2.2.
    assert_eq!(sample(&[3.0, 2.2], &spec(&params, &[0], 0)).token, 0);
    // In the prompt only: no penalty.
    assert_eq!(sample(&[3.0, 2.9], &spec(&params, &[0, 0, 0], 3)).token, 0);
}

#[test]
fn logprobs_are_the_raw_log_softmax() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    // Penalties and temperature must not change the reported logprobs.
    let params = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.5,
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let out = sample(&logits_of(&probs), &spec(&params, &[3], 1));
    // Token 3 (0.4 -> ln 0.4 / 1.5 < ln 0.3) loses to token 2 under the penalty.
    assert_eq!(out.token, 2);
    assert!((out.logprob - 0.3f32.ln()).abs() < 1e-5, "{}", out.logprob);
    assert_eq!(out.top_logprobs.len(), 2);
    assert_eq!(out.top_logprobs[0].0, 3);
    assert!((out.top_logprobs[0].1 - 0.4f32.ln()).abs() < 1e-5);
    assert_eq!(out.top_logprobs[1].0, 2);
    assert!((out.top_logprobs[1].1 - 0.3f32.ln()).abs() < 1e-5);
    // Shifting every logit changes nothing (log-softmax is shift invariant).
    let shifted: Vec<f32> = logits_of(&probs).iter().map(|x| x + 100.0).collect();
    let out2 = sample(&shifted, &spec(&params, &[3], 1));
    assert!((out2.logprob - out.logprob).abs() < 1e-4);
    // No logprobs asked: no list.
    assert!(sample(&shifted, &spec(&greedy(), &[], 0))
        .top_logprobs
        .is_empty());
}

#[test]
fn draws_are_a_pure_function_of_seed_and_draw() {
    let params = SamplingParams::default();
    let logits = logits_of(&[0.25; 4]);
    let run = |seed: u64| -> Vec<u32> {
        (0..64)
            .map(|draw| {
                let mut s = spec(&params, &[], 0);
                s.seed = SampleSeed { seed, draw };
                sample(&logits, &s).token
            })
            .collect()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn race_uniforms_are_uniform_inside_the_open_interval() {
    // 10 equal bins over 100k tokens of one row, and over 100k draws of
    // one token (the two ways the counter moves).
    let key = race_key(SampleSeed { seed: 42, draw: 0 });
    let mut by_token = [0u64; 10];
    let mut by_draw = [0u64; 10];
    for i in 0..100_000u32 {
        let u = race_uniform(key, i);
        assert!(u > 0.0 && u < 1.0, "{u}");
        by_token[(u * 10.0) as usize] += 1;
        let v = race_uniform(
            race_key(SampleSeed {
                seed: 42,
                draw: i as u64,
            }),
            7,
        );
        by_draw[(v * 10.0) as usize] += 1;
    }
    assert_fits(&by_token, &[0.1; 10]);
    assert_fits(&by_draw, &[0.1; 10]);
    // The extremes of the 53-bit grid stay inside (0, 1) and are finite
    // Gumbel scores.
    for u in [0.5f64.powi(53), 1.0 - 0.5f64.powi(53)] {
        assert!(race_score(0.0, 0.0, 1.0, u).is_finite());
    }
}

#[test]
fn race_uniforms_of_neighbouring_tokens_are_independent() {
    // Pairs (token 2i, token 2i+1) in a 4x4 grid: dependence between
    // consecutive counters would skew the joint cells.
    let key = race_key(SampleSeed { seed: 9, draw: 3 });
    let mut cells = [0u64; 16];
    for i in 0..80_000u32 {
        let a = (race_uniform(key, 2 * i) * 4.0) as usize;
        let b = (race_uniform(key, 2 * i + 1) * 4.0) as usize;
        cells[4 * a + b] += 1;
    }
    assert_fits(&cells, &[1.0 / 16.0; 16]);
}

#[test]
fn the_race_follows_the_exact_probabilities_of_many_parameter_sets() {
    // Ten tokens, unequal, with a tie; each parameter set's exact kept
    // distribution computed here from the definitions.
    let probs = [0.02, 0.03, 0.05, 0.05, 0.08, 0.1, 0.12, 0.15, 0.18, 0.22];
    let logits = logits_of(&probs);
    let exact = |temperature: f64, keep: &[usize]| -> Vec<f64> {
        let w: Vec<f64> = probs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if keep.contains(&i) {
                    p.powf(1.0 / temperature)
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        w.iter().map(|x| x / total).collect()
    };
    let all: Vec<usize> = (0..10).collect();
    let cases: Vec<(SamplingParams, Vec<f64>)> = vec![
        (SamplingParams::default(), exact(1.0, &all)),
        (
            SamplingParams {
                temperature: 0.6,
                ..SamplingParams::default()
            },
            exact(0.6, &all),
        ),
        (
            SamplingParams {
                temperature: 1.5,
                ..SamplingParams::default()
            },
            exact(1.5, &all),
        ),
        (
            // The 7th likeliest is tied (0.05 twice): both stay.
            SamplingParams {
                top_k: 7,
                ..SamplingParams::default()
            },
            exact(1.0, &[2, 3, 4, 5, 6, 7, 8, 9]),
        ),
        (
            // 0.22 + 0.18 + 0.15 = 0.55 >= 0.5: three tokens.
            SamplingParams {
                top_p: 0.5,
                ..SamplingParams::default()
            },
            exact(1.0, &[7, 8, 9]),
        ),
        (
            // min_p 0.3 of 0.22 = 0.066: 0.08 and up.
            SamplingParams {
                min_p: 0.3,
                ..SamplingParams::default()
            },
            exact(1.0, &[4, 5, 6, 7, 8, 9]),
        ),
    ];
    for (params, expected) in &cases {
        let counts = histogram(&logits, params, 30_000);
        assert_fits(&counts, expected);
    }
}

#[test]
fn the_race_does_not_depend_on_where_the_kept_tokens_sit() {
    // The same four probabilities at other ids among -inf tokens: the
    // distribution over those ids is unchanged.
    let mut logits = vec![f32::NEG_INFINITY; 1000];
    let ids = [3usize, 400, 401, 999];
    for (&id, p) in ids.iter().zip([0.1f64, 0.2, 0.3, 0.4]) {
        logits[id] = p.ln() as f32;
    }
    let counts = histogram(&logits, &SamplingParams::default(), 20_000);
    let picked: Vec<u64> = ids.iter().map(|&i| counts[i]).collect();
    assert_eq!(picked.iter().sum::<u64>(), 20_000);
    assert_fits(&picked, &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn rows_with_nothing_finite_or_infinite_logits_draw_like_greedy() {
    let params = SamplingParams::default();
    let s = spec(&params, &[], 0);
    assert_eq!(sample(&[f32::NAN, f32::NEG_INFINITY], &s).token, 0);
    assert_eq!(
        sample(&[1.0, f32::INFINITY, 2.0, f32::INFINITY], &s).token,
        1
    );
}

#[test]
fn adjustments_are_one_entry_per_token_by_id() {
    let params = SamplingParams {
        repetition_penalty: 1.2,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplingParams::default()
    };
    let history = [9, 4, 4, 2, 4, 50];
    let mut s = spec(&params, &history, 2);
    s.banned = &[7, 2, 99];
    let got = adjustments(&s, 10);
    let entry = |token, repetition, subtract, ban| LogitAdjustment {
        token,
        repetition,
        subtract,
        ban,
    };
    assert_eq!(
        got,
        vec![
            entry(2, true, 0.75, true),
            entry(4, true, 1.0, false),
            entry(7, false, 0.0, true),
            entry(9, true, 0.0, false),
        ]
    );
    // Off by default: nothing to adjust.
    assert!(adjustments(&spec(&SamplingParams::default(), &history, 2), 10).is_empty());
}

#[test]
fn temperature_one_follows_the_softmax() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let counts = histogram(&logits_of(&probs), &SamplingParams::default(), 20_000);
    assert_fits(&counts, &probs);
}

#[test]
fn temperature_two_flattens_to_the_square_root() {
    let probs: [f64; 4] = [0.1, 0.2, 0.3, 0.4];
    let params = SamplingParams {
        temperature: 2.0,
        ..SamplingParams::default()
    };
    let root: Vec<f64> = probs.iter().map(|p| p.sqrt()).collect();
    let total: f64 = root.iter().sum();
    let expected: Vec<f64> = root.iter().map(|r| r / total).collect();
    assert_fits(&histogram(&logits_of(&probs), &params, 20_000), &expected);
}

#[test]
fn a_wrong_distribution_fails_the_bound() {
    // The check itself must be able to fail: uniform draws against the
    // 0.1/0.2/0.3/0.4 hypothesis.
    let counts = histogram(&logits_of(&[0.25; 4]), &SamplingParams::default(), 20_000);
    let result = std::panic::catch_unwind(|| assert_fits(&counts, &[0.1, 0.2, 0.3, 0.4]));
    assert!(result.is_err());
}

#[test]
fn top_k_keeps_the_k_likeliest_renormalised() {
    let params = SamplingParams {
        top_k: 2,
        ..SamplingParams::default()
    };
    let counts = histogram(&logits_of(&[0.1, 0.2, 0.3, 0.4]), &params, 20_000);
    assert_fits(&counts, &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
}

#[test]
fn top_p_keeps_the_shortest_prefix_reaching_p() {
    // 0.4 + 0.3 = 0.7 >= 0.65: tokens 3 and 2 only.
    let params = SamplingParams {
        top_p: 0.65,
        ..SamplingParams::default()
    };
    let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
    assert_fits(
        &histogram(&logits, &params, 20_000),
        &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0],
    );
    // 0.75 needs token 1 too.
    let params = SamplingParams {
        top_p: 0.75,
        ..SamplingParams::default()
    };
    assert_fits(
        &histogram(&logits, &params, 20_000),
        &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
    );
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    // Threshold 0.45 * 0.4 = 0.18: token 0 (0.1) goes, token 1 (0.2) stays.
    let params = SamplingParams {
        min_p: 0.45,
        ..SamplingParams::default()
    };
    let counts = histogram(&logits_of(&[0.1, 0.2, 0.3, 0.4]), &params, 20_000);
    assert_fits(&counts, &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0]);
}

#[test]
fn top_k_then_top_p_on_the_renormalised_rest() {
    // top_k 3 leaves 0.2/0.3/0.4 -> 2/9, 3/9, 4/9; top_p 0.5: 4/9 < 0.5, so
    // 3/9 joins (mass before it 0.44 < 0.5), 2/9 does not (0.78 >= 0.5).
    let params = SamplingParams {
        top_k: 3,
        top_p: 0.5,
        ..SamplingParams::default()
    };
    let counts = histogram(&logits_of(&[0.1, 0.2, 0.3, 0.4]), &params, 20_000);
    assert_fits(&counts, &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
}

#[test]
fn ranges_are_checked_with_the_field_named() {
    let ok = SamplingParams::default();
    assert!(ok.check().is_ok());
    let cases = [
        (
            "temperature",
            SamplingParams {
                temperature: -0.1,
                ..ok.clone()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 0.0,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 1.5,
                ..ok.clone()
            },
        ),
        (
            "min_p",
            SamplingParams {
                min_p: 1.5,
                ..ok.clone()
            },
        ),
        (
            "repetition_penalty",
            SamplingParams {
                repetition_penalty: 0.0,
                ..ok.clone()
            },
        ),
        (
            "presence_penalty",
            SamplingParams {
                presence_penalty: 2.5,
                ..ok.clone()
            },
        ),
        (
            "frequency_penalty",
            SamplingParams {
                frequency_penalty: -2.5,
                ..ok.clone()
            },
        ),
        (
            "logprobs",
            SamplingParams {
                logprobs: Some(21),
                ..ok.clone()
            },
        ),
    ];
    for (field, params) in cases {
        let err = params.check().expect_err(field).to_string();
        assert!(err.starts_with(field), "{err}");
    }
}
