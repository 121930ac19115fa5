//! The sampler's fast paths against the straightforward implementation it
//! replaced (kept here as `reference_sample`: a vocabulary-sized copy,
//! the log-normaliser always, a `seen` vector for the repetition penalty
//! and a full sort for top-k/top-p) on random rows with ties, NaN and -inf.
//! Tokens and top lists must be identical, and the logprob too when asked.
//! Both draw by the same race ([`race_key`], [`race_uniform`],
//! [`race_score`]); the race's distribution is tested in `sampler/tests.rs`.

use std::collections::HashMap;

use super::race::splitmix64;
use super::truncation::by_prob_desc;
use super::*;
use crate::executor::SampleSeed;
use crate::request::SamplingParams;

mod reference {
    use super::*;

    pub fn sample(logits: &[f32], spec: &SampleSpec<'_>) -> SampledToken {
        let params = spec.params;
        let mut work: Vec<f32> = logits.iter().map(|&x| sanitize(x)).collect();
        let log_norm = log_sum_exp(&work);
        apply_penalties(&mut work, spec);
        let mut saved = Vec::new();
        for &id in spec.banned {
            if let Some(x) = work.get_mut(id as usize) {
                saved.push((id as usize, *x));
                *x = f32::NEG_INFINITY;
            }
        }
        if !work.iter().any(|x| x.is_finite()) {
            for (id, x) in saved.into_iter().rev() {
                work[id] = x;
            }
        }
        let token = if params.temperature < GREEDY_TEMPERATURE {
            argmax(&work)
        } else {
            draw(&work, spec)
        };
        let top_logprobs = match params.logprobs {
            Some(k) if k > 0 => top_k_logprobs(logits, log_norm, k as usize),
            _ => Vec::new(),
        };
        SampledToken {
            token: token as u32,
            logprob: (sanitize(logits[token]) as f64 - log_norm) as f32,
            top_logprobs,
        }
    }

    fn top_k_logprobs(logits: &[f32], log_norm: f64, k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (i, sanitize(x) as f64))
            .collect();
        let k = k.min(all.len());
        if k < all.len() {
            all.select_nth_unstable_by(k - 1, by_prob_desc);
            all.truncate(k);
        }
        all.sort_by(by_prob_desc);
        all.into_iter()
            .map(|(i, x)| (i as u32, (x - log_norm) as f32))
            .collect()
    }

    fn apply_penalties(work: &mut [f32], spec: &SampleSpec<'_>) {
        let params = spec.params;
        if params.repetition_penalty != 1.0 {
            let mut seen = vec![false; work.len()];
            for &id in spec.history {
                if let Some(flag) = seen.get_mut(id as usize) {
                    *flag = true;
                }
            }
            for (x, seen) in work.iter_mut().zip(seen) {
                if seen {
                    *x = if *x > 0.0 {
                        *x / params.repetition_penalty
                    } else {
                        *x * params.repetition_penalty
                    };
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
                if let Some(x) = work.get_mut(id as usize) {
                    *x -= params.presence_penalty + params.frequency_penalty * count as f32;
                }
            }
        }
    }

    fn argmax(values: &[f32]) -> usize {
        let mut best = 0;
        for (i, &x) in values.iter().enumerate() {
            if x > values[best] {
                best = i;
            }
        }
        best
    }

    fn log_sum_exp(values: &[f32]) -> f64 {
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return max as f64;
        }
        let sum: f64 = values.iter().map(|&x| ((x - max) as f64).exp()).sum();
        max as f64 + sum.ln()
    }

    fn draw(work: &[f32], spec: &SampleSpec<'_>) -> usize {
        let params = spec.params;
        let temperature = params.temperature as f64;
        let max = work.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut candidates: Vec<(usize, f64)> = work
            .iter()
            .enumerate()
            .filter(|(_, x)| x.is_finite())
            .map(|(i, &x)| (i, ((x as f64 - max) / temperature).exp()))
            .collect();
        if params.min_p > 0.0 {
            let threshold = params.min_p as f64;
            candidates.retain(|&(_, w)| w >= threshold);
        }
        let top_k = params.top_k as usize;
        let truncate_k = top_k > 0 && top_k < candidates.len();
        let truncate_p = params.top_p < 1.0;
        if truncate_k || truncate_p {
            candidates.sort_by(by_prob_desc);
        }
        if truncate_k {
            let kth = candidates[top_k - 1].1;
            candidates.retain(|&(_, w)| w >= kth);
        }
        if truncate_p {
            let total: f64 = candidates.iter().map(|c| c.1).sum();
            let limit = params.top_p as f64 * total;
            let mut before = 0.0;
            let mut keep = 0;
            for &(_, w) in &candidates {
                if before >= limit && keep > 0 {
                    break;
                }
                before += w;
                keep += 1;
            }
            candidates.truncate(keep);
        }
        // The race, written out: every kept token's score, the best.
        let key = race_key(spec.seed);
        let mut scored: Vec<(f64, usize)> = candidates
            .iter()
            .map(|&(id, _)| {
                let u = race_uniform(key, id as u32);
                (race_score(work[id], max as f32, params.temperature, u), id)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.first().expect("at least one finite token").1
    }
}

/// A small deterministic generator for the test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Logits on a coarse grid (many exact ties, the maximum tied too), with
/// some NaN and -inf, occasionally a row of nothing finite but one token.
fn random_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let grid = 1 + rng.below(6) as i64;
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| match rng.below(50) {
            0 => f32::NAN,
            1 => f32::NEG_INFINITY,
            _ => (rng.below(2 * grid as u64 + 1) as i64 - grid) as f32 * 0.5,
        })
        .collect();
    if rng.below(10) == 0 {
        row.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        let keep = rng.below(vocab as u64) as usize;
        row[keep] = 1.0;
    }
    if rng.below(10) == 0 {
        row[0] = f32::NAN;
    }
    row
}

fn random_params(rng: &mut Rng) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: [0.0, 0.0, 0.5, 1.0, 1.7][rng.below(5) as usize],
        ..SamplingParams::default()
    };
    if rng.below(3) == 0 {
        p.top_k = 1 + rng.below(12) as u32;
    }
    if rng.below(3) == 0 {
        p.top_p = 0.05 + 0.9 * rng.unit() as f32;
    }
    if rng.below(4) == 0 {
        p.min_p = 0.3 * rng.unit() as f32;
    }
    if rng.below(3) == 0 {
        p.repetition_penalty = [0.8, 1.3, 2.0][rng.below(3) as usize];
    }
    if rng.below(3) == 0 {
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
    }
    if rng.below(2) == 0 {
        p.logprobs = Some(rng.below(5) as u32);
    }
    p
}

#[test]
fn fast_paths_equal_the_reference_on_random_rows() {
    let mut rng = Rng(0xfa57);
    let mut greedy_rows = 0;
    for case in 0..10_000 {
        let vocab = 1 + rng.below(40) as usize;
        let row = random_row(&mut rng, vocab);
        let params = random_params(&mut rng);
        let history: Vec<u32> = (0..rng.below(12))
            .map(|_| rng.below(vocab as u64 + 2) as u32)
            .collect();
        let banned: Vec<u32> = (0..rng.below(3))
            .map(|_| rng.below(vocab as u64 + 1) as u32)
            .collect();
        let spec = SampleSpec {
            params: &params,
            history: &history,
            prompt_len: rng.below(history.len() as u64 + 1) as usize,
            seed: SampleSeed {
                seed: rng.next(),
                draw: rng.below(100),
            },
            banned: &banned,
            allowed: None,
        };
        if !row.iter().any(|x| x.is_finite()) && params.temperature >= GREEDY_TEMPERATURE {
            continue; // both panic: nothing to draw from
        }
        greedy_rows += usize::from(params.temperature < GREEDY_TEMPERATURE);
        let want = reference::sample(&row, &spec);
        let got = sample(&row, &spec);
        let what = format!("case {case}: {row:?} {params:?} {history:?} {banned:?}");
        assert_eq!(got.token, want.token, "{what}");
        // Bitwise, so that NaN (a row with nothing finite) compares too.
        let bits = |t: &SampledToken| -> Vec<(u32, u32)> {
            t.top_logprobs
                .iter()
                .map(|&(id, lp)| (id, lp.to_bits()))
                .collect()
        };
        assert_eq!(bits(&got), bits(&want), "{what}");
        if params.logprobs.is_some() {
            assert_eq!(
                got.logprob.to_bits(),
                want.logprob.to_bits(),
                "{what}: logprob"
            );
        } else {
            assert!(got.logprob.is_nan(), "{what}: logprob not asked");
        }
    }
    assert!(greedy_rows > 2000, "the cases cover greedy: {greedy_rows}");
}

#[test]
fn greedy_argmax_takes_the_lowest_id_of_a_tie_across_lanes() {
    // Ties 16 and 33 ids apart (other lanes of `max_ignoring_nan`), NaN
    // before them, and the tail after the last full chunk.
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let spec = SampleSpec {
        params: &params,
        history: &[],
        prompt_len: 0,
        seed: SampleSeed { seed: 1, draw: 0 },
        banned: &[],
        allowed: None,
    };
    for (first, second) in [(3, 19), (40, 73), (5, 100), (99, 100)] {
        let mut row = vec![0.0f32; 101];
        row[0] = f32::NAN;
        row[first] = 2.0;
        row[second] = 2.0;
        assert_eq!(sample(&row, &spec).token as usize, first);
        assert_eq!(reference::sample(&row, &spec).token as usize, first);
    }
    let all_nan = vec![f32::NAN; 37];
    assert_eq!(sample(&all_nan, &spec).token, 0);
}

#[test]
fn rows_sampled_on_threads_come_back_in_row_order() {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let spec = SampleSpec {
        params: &params,
        history: &[],
        prompt_len: 0,
        seed: SampleSeed { seed: 1, draw: 0 },
        banned: &[],
        allowed: None,
    };
    // Row i peaks at id (7 * i) % 64.
    let rows: Vec<Vec<f32>> = (0..23)
        .map(|i| {
            let mut r = vec![0.0f32; 64];
            r[(7 * i) % 64] = 1.0;
            r
        })
        .collect();
    let specs: Vec<&SampleSpec> = vec![&spec; rows.len()];
    for threads in [1, 2, 3, 8] {
        let got: Vec<u32> = sample_rows(&rows, &specs, threads)
            .iter()
            .map(|t| t.token)
            .collect();
        let want: Vec<u32> = (0..23).map(|i| ((7 * i) % 64) as u32).collect();
        assert_eq!(got, want, "{threads} threads");
    }
}

/// Not a test: per-row time of the reference and the fast sampler on one
/// vocabulary-sized row (Qwen3.5's 248320), side by side. Run with
/// `cargo test -p gdn-engine --release -- --ignored --nocapture sampler_speed`.
#[test]
#[ignore]
fn sampler_speed() {
    let vocab = 248_320;
    let mut rng = Rng(1);
    let row: Vec<f32> = (0..vocab)
        .map(|_| (rng.unit() * 20.0 - 10.0) as f32)
        .collect();
    let history: Vec<u32> = (0..512).map(|_| rng.below(vocab as u64) as u32).collect();
    let cases = [
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
        ),
        (
            "greedy + logprobs 5",
            SamplingParams {
                temperature: 0.0,
                logprobs: Some(5),
                ..SamplingParams::default()
            },
        ),
        (
            "greedy + repetition 1.1",
            SamplingParams {
                temperature: 0.0,
                repetition_penalty: 1.1,
                ..SamplingParams::default()
            },
        ),
        ("temperature 1", SamplingParams::default()),
        (
            "temperature 0.7, top_k 50",
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature 0.7, top_p 0.9",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                ..SamplingParams::default()
            },
        ),
    ];
    let time = |f: &dyn Fn() -> u32| {
        let n = 20;
        let t = std::time::Instant::now();
        let mut sink = 0;
        for _ in 0..n {
            sink ^= f();
        }
        std::hint::black_box(sink);
        t.elapsed().as_secs_f64() * 1e3 / n as f64
    };
    for (name, params) in &cases {
        let spec = SampleSpec {
            params,
            history: &history,
            prompt_len: 256,
            seed: SampleSeed { seed: 3, draw: 0 },
            banned: &[],
            allowed: None,
        };
        assert_eq!(
            sample(&row, &spec).token,
            reference::sample(&row, &spec).token
        );
        let slow = time(&|| reference::sample(&row, &spec).token);
        let fast = time(&|| sample(&row, &spec).token);
        println!(
            "{name:28} reference {slow:8.3} ms/row  fast {fast:8.3} ms/row  ({:.1}x)",
            slow / fast
        );
    }
    let rows: Vec<Vec<f32>> = vec![row; 64];
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let spec = SampleSpec {
        params: &greedy,
        history: &[],
        prompt_len: 0,
        seed: SampleSeed { seed: 3, draw: 0 },
        banned: &[],
        allowed: None,
    };
    let specs = vec![&spec; rows.len()];
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let one = time(&|| sample_rows(&rows, &specs, 1)[0].token);
    let many = time(&|| sample_rows(&rows, &specs, threads)[0].token);
    println!("64 greedy rows: 1 thread {one:.3} ms, {threads} threads {many:.3} ms");
}
