//! Sampling on the device (`gdn_kernels::DeviceSampler`) against its oracle,
//! the engine's CPU sampler (skipped without a GPU; `GDN_REQUIRE_GPU=1`
//! makes a missing GPU a failure):
//! - random rows at Qwen3.5's vocabulary (248,320) and at small ones, every
//!   parameter kind (greedy, temperature, top-k with ties at the k-th,
//!   top-p, min-p, penalties, bans including all banned, NaN / -inf / +inf
//!   rows, logprobs 0..=20): the tokens must be equal, logprobs within
//!   1e-4. A different token is accepted only where a float rounding
//!   boundary is shown (the CPU sampler draws the GPU's token once top_p or
//!   min_p moves by one f32 ulp, or the two tokens' race scores are equal
//!   to 1e-12), at most 1 in 10,000 rows, each printed;
//! - the kernel is deterministic run to run;
//! - the GPU executor's device-sampled tokens equal the CPU sampler applied
//!   to the runtime's host logits for the same rows;
//! - rows with allowed-token masks (structured outputs), in `masks`.
//!
//! Not a test: `emit_cases_for_the_cpu_emulation` (ignored) writes random
//! cases with the CPU sampler's answers for `checks/sampling_emulation`,
//! which runs the kernel's source on the CPU (no GPU needed).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::sampler::{self, race_key, race_score, race_uniform, GREEDY_TEMPERATURE};
use engine::{
    AllowedTokens, Executor, PageId, SampleSeed, SampleSpec, SampledToken, SamplingParams, SlotId,
    StepRow,
};
use gdn_kernels::{DeviceSampler, MaskUpload, RowSampling, SampledRow, TokenAdjustment};
use qwen35::engine_exec::{GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::{GpuModel, GpuOptions, LogitsTo, Row};
use qwen35::RowLogits;

mod sampling_masks;
use sampling_masks as masks;

const QWEN35_VOCAB: usize = 248_320;
const LOGPROB_TOLERANCE: f32 = 1e-4;

/// SplitMix64 counter generator for the test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A random row: model-like (spread logits with a few peaks), a coarse
/// grid (many exact ties, the maximum tied too), or degenerate (nothing
/// finite, a single finite token, +inf); NaN and -inf sprinkled in.
fn random_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let kind = rng.below(10);
    let mut row: Vec<f32> = match kind {
        0..=4 => {
            let spread = 2.0 + 10.0 * rng.unit();
            (0..vocab)
                .map(|_| ((rng.unit() * 2.0 - 1.0) * spread) as f32)
                .collect()
        }
        5..=7 => {
            let grid = 1 + rng.below(6);
            (0..vocab)
                .map(|_| (rng.below(2 * grid + 1) as i64 - grid as i64) as f32 * 0.5)
                .collect()
        }
        _ => vec![f32::NEG_INFINITY; vocab],
    };
    if kind <= 4 {
        for _ in 0..rng.below(4) {
            let i = rng.below(vocab as u64) as usize;
            row[i] += (5.0 + 10.0 * rng.unit()) as f32;
        }
    }
    if kind == 8 {
        let i = rng.below(vocab as u64) as usize;
        row[i] = 1.0;
    }
    if kind == 9 && rng.below(2) == 0 {
        row.iter_mut().for_each(|x| *x = f32::NAN);
    }
    let sprinkle = rng.below(3);
    for _ in 0..(vocab / 50).max(1) * sprinkle as usize {
        let i = rng.below(vocab as u64) as usize;
        row[i] = if rng.below(2) == 0 {
            f32::NAN
        } else {
            f32::NEG_INFINITY
        };
    }
    if rng.below(200) == 0 {
        let i = rng.below(vocab as u64) as usize;
        row[i] = f32::INFINITY;
    }
    row
}

fn random_params(rng: &mut Rng) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: [0.0, 0.0, 1e-6, 0.05, 0.3, 0.7, 1.0, 1.0, 1.5][rng.below(9) as usize],
        ..SamplingParams::default()
    };
    if rng.below(3) == 0 {
        p.top_k = [1, 2, 5, 20, 50, 1000][rng.below(6) as usize];
    }
    if rng.below(3) == 0 {
        p.top_p = (0.05 + 0.95 * rng.unit()) as f32;
    }
    if rng.below(4) == 0 {
        p.min_p = (0.3 * rng.unit()) as f32;
    }
    if rng.below(3) == 0 {
        p.repetition_penalty = [0.8, 1.1, 1.3, 2.0][rng.below(4) as usize];
    }
    if rng.below(3) == 0 {
        p.presence_penalty = [0.5, -0.5, 1.5][rng.below(3) as usize];
        p.frequency_penalty = [0.25, -0.1, 1.0][rng.below(3) as usize];
    }
    if rng.below(2) == 0 {
        p.logprobs = Some(rng.below(21) as u32);
    }
    p
}

/// One random case: a row, its parameters, history, bans, seed and the
/// tokens it may sample (`None`: every one).
struct Case {
    row: Vec<f32>,
    params: SamplingParams,
    history: Vec<u32>,
    prompt_len: usize,
    banned: Vec<u32>,
    seed: SampleSeed,
    allowed: Option<AllowedTokens>,
}

impl Case {
    fn random(rng: &mut Rng, vocab: usize) -> Case {
        let row = random_row(rng, vocab);
        let params = random_params(rng);
        // Histories reach the row's best tokens often (penalties matter).
        let mut best: Vec<usize> = (0..vocab).collect();
        if vocab <= 4096 {
            best.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        }
        let pick = |rng: &mut Rng| -> u32 {
            if rng.below(2) == 0 {
                best[rng.below(vocab.min(8) as u64) as usize] as u32
            } else {
                rng.below(vocab as u64 + 2) as u32
            }
        };
        let history: Vec<u32> = (0..rng.below(40)).map(|_| pick(rng)).collect();
        let prompt_len = rng.below(history.len() as u64 + 1) as usize;
        let banned: Vec<u32> = if vocab <= 64 && rng.below(20) == 0 {
            // Every token banned: the ban is lifted.
            (0..vocab as u32).collect()
        } else {
            (0..rng.below(4)).map(|_| pick(rng)).collect()
        };
        Case {
            row,
            params,
            history,
            prompt_len,
            banned,
            seed: SampleSeed {
                seed: rng.next(),
                draw: rng.below(1000),
            },
            allowed: None,
        }
    }

    fn spec(&self) -> SampleSpec<'_> {
        SampleSpec {
            params: &self.params,
            history: &self.history,
            prompt_len: self.prompt_len,
            seed: self.seed,
            banned: &self.banned,
            allowed: self.allowed.as_ref(),
        }
    }
}

fn adjustments(spec: &SampleSpec, vocab: usize) -> Vec<TokenAdjustment> {
    sampler::adjustments(spec, vocab)
        .into_iter()
        .map(|a| TokenAdjustment {
            token: a.token,
            repetition: a.repetition,
            subtract: a.subtract,
            ban: a.ban,
        })
        .collect()
}

/// Samples `cases` on the device, the logits rows in a shuffled order (so
/// that `logits_row` is honoured); the cases with allowed tokens send
/// their masks (mask rows in case order).
fn sample_on_device(
    sampler: &mut DeviceSampler,
    s: &Arc<CudaStream>,
    cases: &[Case],
    vocab: usize,
    rng: &mut Rng,
) -> Vec<SampledRow> {
    let n = cases.len();
    let slots = shuffled_slots(n, rng);
    let mut host = vec![0f32; n * vocab];
    for (c, &slot) in cases.iter().zip(&slots) {
        host[slot * vocab..(slot + 1) * vocab].copy_from_slice(&c.row);
    }
    let mut logits = s.clone_htod(&host).unwrap();
    let specs: Vec<SampleSpec> = cases.iter().map(Case::spec).collect();
    let adjs: Vec<Vec<TokenAdjustment>> = specs.iter().map(|sp| adjustments(sp, vocab)).collect();
    let mut constrained = 0..;
    let rows: Vec<RowSampling> = specs
        .iter()
        .zip(&slots)
        .zip(&adjs)
        .map(|((sp, &slot), a)| {
            let p = sp.params;
            let mask_row = sp.allowed.and_then(|_| constrained.next());
            RowSampling {
                logits_row: slot,
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                min_p: p.min_p,
                repetition_penalty: p.repetition_penalty,
                logprobs: p.logprobs,
                seed: sp.seed.seed,
                draw: sp.seed.draw,
                adjustments: a,
                mask_row,
            }
        })
        .collect();
    let allowed: Vec<&[u32]> = cases
        .iter()
        .filter_map(|c| c.allowed.as_ref().map(AllowedTokens::words))
        .collect();
    let mut upload = MaskUpload::new();
    let masks = (!allowed.is_empty()).then(|| upload.upload(s, vocab, &allowed).unwrap());
    // Which call failed matters (a fault is reported for the whole call):
    // `emit_cases_for_the_cpu_emulation` with REPLAY replays it on the CPU.
    sampler
        .sample(&mut logits, vocab, &rows, masks.as_ref())
        .unwrap_or_else(|e| panic!("{n} rows of vocab {vocab}: {e}"))
}

/// The logits rows of `n` cases, shuffled.
fn shuffled_slots(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut slots: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        slots.swap(i, rng.below(i as u64 + 1) as usize);
    }
    slots
}

/// The random test's (vocab, rows per call, calls): Qwen3.5's vocabulary,
/// then small ones (one below and above the block's 1024 threads, and tiny
/// rows).
const RANDOM_TEST_PLAN: [(usize, usize, usize); 7] = [
    (QWEN35_VOCAB, 64, 8),
    (1, 500, 2),
    (7, 1000, 6),
    (40, 1000, 8),
    (1023, 500, 4),
    (1025, 500, 4),
    (5000, 250, 4),
];
const RANDOM_TEST_SEED: u64 = 0x5a3b1e;

/// Whether two logprobs agree (NaN with NaN, infinities exactly).
fn close(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= LOGPROB_TOLERANCE
}

/// Whether the CPU sampler can be shown to sit on a rounding boundary
/// between its token and `gpu`: one f32 ulp of top_p or min_p moves its
/// draw to `gpu`, or the race scores of the two tokens are equal to 1e-12.
fn rounding_boundary(c: &Case, cpu: u32, gpu: u32) -> Option<String> {
    let ulp = |x: f32, up: bool| {
        let b = x.to_bits();
        f32::from_bits(if up { b + 1 } else { b - 1 })
    };
    for up in [false, true] {
        let mut moved = clone_case(c);
        if c.params.top_p < 1.0 {
            moved.params.top_p = ulp(c.params.top_p, up).min(1.0);
            if sampler::sample(&moved.row, &moved.spec()).token == gpu {
                return Some(format!(
                    "top_p {} -> {}",
                    c.params.top_p, moved.params.top_p
                ));
            }
            moved.params.top_p = c.params.top_p;
        }
        if c.params.min_p > 0.0 {
            moved.params.min_p = ulp(c.params.min_p, up);
            if sampler::sample(&moved.row, &moved.spec()).token == gpu {
                return Some(format!(
                    "min_p {} -> {}",
                    c.params.min_p, moved.params.min_p
                ));
            }
        }
    }
    // The race: the adjusted logits of the two tokens (as the sampler's
    // adjustment list defines them).
    let mut work: Vec<f32> = c
        .row
        .iter()
        .map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x })
        .collect();
    for a in sampler::adjustments(&c.spec(), work.len()) {
        let x = &mut work[a.token as usize];
        if a.repetition {
            let r = c.params.repetition_penalty;
            *x = if *x > 0.0 { *x / r } else { *x * r };
        }
        *x -= a.subtract;
        if a.ban {
            *x = f32::NEG_INFINITY;
        }
    }
    let max = work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let key = race_key(c.seed);
    let score = |t: u32| {
        race_score(
            work[t as usize],
            max,
            c.params.temperature,
            race_uniform(key, t),
        )
    };
    let (a, b) = (score(cpu), score(gpu));
    ((a - b).abs() <= 1e-12 * a.abs().max(1.0)).then(|| format!("race scores {a} vs {b}"))
}

fn clone_case(c: &Case) -> Case {
    Case {
        row: c.row.clone(),
        params: c.params.clone(),
        history: c.history.clone(),
        prompt_len: c.prompt_len,
        banned: c.banned.clone(),
        seed: c.seed,
        allowed: masks::copy(&c.allowed),
    }
}

/// Tallies of one comparison run.
#[derive(Default)]
struct Tally {
    rows: usize,
    sampled: usize,
    boundary: usize,
}

fn compare(c: &Case, got: &SampledRow, want: &SampledToken, what: &str, tally: &mut Tally) {
    tally.rows += 1;
    tally.sampled += usize::from(c.params.temperature >= GREEDY_TEMPERATURE);
    let show = || {
        format!(
            "{what}: params {:?}, history {:?} (prompt {}), banned {:?}, seed {:?}",
            c.params, c.history, c.prompt_len, c.banned, c.seed
        )
    };
    if got.token != want.token {
        match rounding_boundary(c, want.token, got.token) {
            Some(why) => {
                println!(
                    "boundary: gpu {} cpu {} ({why}) {}",
                    got.token,
                    want.token,
                    show()
                );
                tally.boundary += 1;
                return;
            }
            None => panic!("token: gpu {} cpu {}; {}", got.token, want.token, show()),
        }
    }
    assert!(
        close(got.logprob, want.logprob),
        "logprob: gpu {} cpu {}; {}",
        got.logprob,
        want.logprob,
        show()
    );
    assert_eq!(
        got.top_logprobs.len(),
        want.top_logprobs.len(),
        "top list; {}",
        show()
    );
    for (g, w) in got.top_logprobs.iter().zip(&want.top_logprobs) {
        assert!(
            g.0 == w.0 && close(g.1, w.1),
            "top: gpu {:?} cpu {:?}; {}",
            got.top_logprobs,
            want.top_logprobs,
            show()
        );
    }
}

#[test]
fn the_kernel_samples_what_the_cpu_sampler_samples_on_random_rows() {
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let mut rng = Rng(RANDOM_TEST_SEED);
    let mut tally = Tally::default();
    for (vocab, per_call, calls) in RANDOM_TEST_PLAN {
        for call in 0..calls {
            println!("vocab {vocab} call {call}: {per_call} rows");
            let cases: Vec<Case> = (0..per_call)
                .map(|_| Case::random(&mut rng, vocab))
                .collect();
            let got = sample_on_device(&mut sampler, &s, &cases, vocab, &mut rng);
            assert_eq!(got.len(), cases.len());
            let want: Vec<SampledToken> = cases
                .iter()
                .map(|c| sampler::sample(&c.row, &c.spec()))
                .collect();
            for (i, ((c, g), w)) in cases.iter().zip(&got).zip(&want).enumerate() {
                compare(
                    c,
                    g,
                    w,
                    &format!("vocab {vocab} call {call} row {i}"),
                    &mut tally,
                );
            }
        }
    }
    println!(
        "{} rows ({} sampled, the rest greedy), {} rounding-boundary differences",
        tally.rows, tally.sampled, tally.boundary
    );
    assert!(tally.rows >= 20_000 && tally.sampled >= 10_000);
    assert!(
        tally.boundary * 10_000 <= tally.rows,
        "{} boundary differences in {} rows",
        tally.boundary,
        tally.rows
    );
}

#[test]
fn hand_made_rows_with_known_answers() {
    // Independent of the oracle: answers worked out by hand.
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let vocab = 6;
    let greedy = RowSampling {
        logits_row: 0,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        logprobs: Some(3),
        seed: 1,
        draw: 0,
        adjustments: &[],
        mask_row: None,
    };
    let ban = |token| TokenAdjustment {
        token,
        repetition: false,
        subtract: 0.0,
        ban: true,
    };
    let all_banned: Vec<TokenAdjustment> = (0..6).map(ban).collect();
    let rep = [TokenAdjustment {
        token: 1,
        repetition: true,
        subtract: 0.0,
        ban: false,
    }];
    let rows_logits: [[f32; 6]; 5] = [
        [0.0, 3.0, f32::NAN, 3.0, 1.0, -1.0], // tie at the max: id 1
        [0.0, 3.0, 2.0, 1.0, 2.5, -1.0],      // 1 banned: 4
        [0.0, 3.0, 2.0, 1.0, 2.5, -1.0],      // all banned: lifted, 1
        [0.0, 3.0, 2.0, 1.0, 2.5, -1.0],      // 3.0 / 2 = 1.5 < 2.5: 4
        [f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN, f32::NAN], // 0
    ];
    let host: Vec<f32> = rows_logits.iter().flatten().copied().collect();
    let mut logits = s.clone_htod(&host).unwrap();
    let b1 = [ban(1)];
    let mut rows = vec![greedy; 5];
    for (i, r) in rows.iter_mut().enumerate() {
        r.logits_row = i;
    }
    rows[1].adjustments = &b1;
    rows[2].adjustments = &all_banned;
    rows[3].adjustments = &rep;
    rows[3].repetition_penalty = 2.0;
    rows[4].temperature = 1.0; // nothing finite: like greedy
    let got = sampler.sample(&mut logits, vocab, &rows, None).unwrap();
    let tokens: Vec<u32> = got.iter().map(|r| r.token).collect();
    assert_eq!(tokens, vec![1, 4, 1, 4, 0]);
    // Raw logprobs of row 0: log-softmax of [0, 3, -inf, 3, 1, -1].
    let z: f64 = [0.0f64, 3.0, 3.0, 1.0, -1.0].iter().map(|x| x.exp()).sum();
    let lp = |x: f64| (x - z.ln()) as f32;
    assert!((got[0].logprob - lp(3.0)).abs() < 1e-5);
    let ids: Vec<u32> = got[0].top_logprobs.iter().map(|t| t.0).collect();
    assert_eq!(ids, vec![1, 3, 4]);
    // Row 3's chosen token 4 reports its raw logprob, not the penalised row's.
    let z3: f64 = [0.0f64, 3.0, 2.0, 1.0, 2.5, -1.0]
        .iter()
        .map(|x| x.exp())
        .sum();
    assert!((got[3].logprob - (2.5 - z3.ln()) as f32).abs() < 1e-5);
    // A row of NaN: every logprob NaN, the ids in order.
    assert!(got[4].logprob.is_nan());
    assert_eq!(
        got[4].top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
}

#[test]
fn the_kernel_is_deterministic_run_to_run() {
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let mut sampler = DeviceSampler::new(s.clone()).unwrap();
    let mut rng = Rng(77);
    let cases: Vec<Case> = (0..32)
        .map(|_| {
            let mut c = Case::random(&mut rng, QWEN35_VOCAB);
            c.params.temperature = 0.8;
            c
        })
        .collect();
    let first = sample_on_device(&mut sampler, &s, &cases, QWEN35_VOCAB, &mut Rng(1));
    for _ in 0..3 {
        let again = sample_on_device(&mut sampler, &s, &cases, QWEN35_VOCAB, &mut Rng(2));
        let tokens = |r: &[SampledRow]| r.iter().map(|x| x.token).collect::<Vec<_>>();
        assert_eq!(tokens(&first), tokens(&again));
    }
}

#[test]
fn the_executor_samples_on_the_device_what_the_cpu_sampler_draws_from_host_logits() {
    executor_against_host_logits(false);
}

/// The GPU executor's device sampling against the CPU sampler on the
/// runtime's host logits; with `constrain`, every other row carries a
/// random allowed-token mask each step (the answer by the definition:
/// `masks::answer` on the host row).
fn executor_against_host_logits(constrain: bool) {
    let Some(s) = gdn_kernels_testkit::gpu_stream() else {
        return;
    };
    let s = s.context().new_stream().unwrap();
    let f = qwen35_testkit::Fixture::load(qwen35_testkit::MODELS[0]);
    let load = || {
        GpuModel::load(
            f.config.clone(),
            &f.weights,
            s.clone(),
            GpuOptions::default(),
        )
    };
    let page = 16;
    let pages_per_slot = 8;
    let prompts: Vec<&Vec<u32>> = f
        .prompts
        .iter()
        .filter(|p| !p.is_empty() && p.len() <= 100)
        .take(6)
        .collect();
    let n = prompts.len();
    assert!(n >= 2, "the fixture has short prompts");
    let mut exec = GpuExecutor::new(
        load().unwrap(),
        GpuSizing {
            num_slots: n,
            pages: PagePool::Fixed(n * pages_per_slot),
            page_size: page,
            max_model_len: pages_per_slot * page,
        },
    )
    .unwrap();
    let mut model = load().unwrap();
    let mut cache = model.new_cache(n, n * pages_per_slot, page).unwrap();
    let pages: Vec<Vec<PageId>> = (0..n)
        .map(|i| {
            (0..pages_per_slot)
                .map(|j| PageId((i * pages_per_slot + j) as u32))
                .collect()
        })
        .collect();
    let params: Vec<SamplingParams> = (0..n)
        .map(|i| SamplingParams {
            temperature: [0.0, 0.7, 1.0, 1.3][i % 4],
            top_k: [0, 20, 0, 5][i % 4],
            top_p: [1.0, 0.9, 0.8, 1.0][i % 4],
            min_p: [0.0, 0.0, 0.05, 0.0][i % 4],
            repetition_penalty: [1.0, 1.1, 1.0, 1.3][i % 4],
            presence_penalty: [0.0, 0.5, 0.0, 0.0][i % 4],
            logprobs: Some([0, 5, 20, 1][i % 4]),
            ..SamplingParams::default()
        })
        .collect();
    let mut rng = Rng(5);
    let mut histories: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut starts = vec![0usize; n];
    let mut compared = 0;
    for step in 0..4u64 {
        let inputs: Vec<Vec<u32>> = (0..n).map(|i| histories[i][starts[i]..].to_vec()).collect();
        let banned: Vec<Vec<u32>> = (0..n).map(|_| vec![rng.below(50) as u32]).collect();
        let vocab = exec.geometry().vocab_size;
        let allowed: Vec<Option<AllowedTokens>> = (0..n)
            .map(|i| {
                (constrain && i % 2 == 1)
                    .then(|| AllowedTokens::ready(masks::random_density_mask(&mut rng, vocab)))
            })
            .collect();
        let specs: Vec<SampleSpec> = (0..n)
            .map(|i| SampleSpec {
                params: &params[i],
                history: &histories[i],
                prompt_len: prompts[i].len(),
                seed: SampleSeed {
                    seed: 1000 + i as u64,
                    draw: step,
                },
                banned: &banned[i],
                allowed: allowed[i].as_ref(),
            })
            .collect();
        let rows: Vec<StepRow> = (0..n)
            .map(|i| StepRow {
                snapshots: &[],
                slot: SlotId(i as u32),
                start: starts[i],
                tokens: &inputs[i],
                pages: &pages[i],
                sample: Some(specs[i]),
            })
            .collect();
        let got = exec.step(&rows).unwrap();
        let model_rows: Vec<Row> = rows
            .iter()
            .map(|r| Row {
                slot: r.slot,
                start: r.start,
                tokens: r.tokens,
                pages: r.pages,
                logits: RowLogits::Last,
            })
            .collect();
        let host = model
            .step_logits(&mut cache, &model_rows, LogitsTo::Host)
            .unwrap();
        for i in 0..n {
            let c = Case {
                row: host.row(i).to_vec(),
                params: params[i].clone(),
                history: histories[i].clone(),
                prompt_len: prompts[i].len(),
                banned: banned[i].clone(),
                seed: specs[i].seed,
                allowed: masks::copy(&allowed[i]),
            };
            let want = masks::answer(&c);
            if let Some(a) = &allowed[i] {
                assert!(
                    a.is_allowed(got[i].token),
                    "step {step} row {i}: token {} not allowed",
                    got[i].token
                );
            }
            let g = SampledRow {
                token: got[i].token,
                logprob: got[i].logprob,
                top_logprobs: got[i].top_logprobs.clone(),
            };
            let mut tally = Tally::default();
            let what = format!("step {step} row {i}");
            compare(&masks::premasked(&c), &g, &want, &what, &mut tally);
            assert_eq!(tally.boundary, 0, "step {step} row {i}: a boundary case");
            compared += 1;
        }
        for i in 0..n {
            starts[i] = histories[i].len();
            histories[i].push(got[i].token);
        }
    }
    println!("{compared} executor rows equal to the CPU sampler on host logits");
}

#[test]
fn the_executor_sends_the_masks_of_constrained_rows_to_the_device_sampler() {
    executor_against_host_logits(true);
}

/// Not a test: writes `PLAN` (`vocab x rows,...`) random cases of seed
/// `SEED` (and with `TIES`, rows of three tied values with top-p / top-k
/// cutting inside the ties), or with `REPLAY=<calls>` the rows of the
/// random test's first calls, and the CPU sampler's answers to `EMIT`, for
/// `checks/sampling_emulation/run.sh` (the layout its main.cpp reads).
/// With `MASKS`, half the `PLAN` cases get a random allowed-token mask (the
/// answer by the definition, `masks::answer`).
#[test]
#[ignore]
fn emit_cases_for_the_cpu_emulation() {
    let path = std::env::var("EMIT").expect("EMIT=<output file>");
    let seed = std::env::var("SEED").map_or(3, |s| s.parse().unwrap());
    let ties = std::env::var_os("TIES").is_some();
    let with_masks = std::env::var_os("MASKS").is_some();
    let mut rng = Rng(seed);
    let mut cases: Vec<(usize, Case)> = vec![];
    if let Ok(calls) = std::env::var("REPLAY") {
        // The random test's first `calls` calls, row for row (its seed, and
        // its shuffles drawn in between).
        let mut left: usize = calls.parse().expect("REPLAY=<calls>");
        rng = Rng(RANDOM_TEST_SEED);
        for (vocab, per_call, calls) in RANDOM_TEST_PLAN {
            for _ in 0..calls.min(left) {
                let call: Vec<Case> = (0..per_call)
                    .map(|_| Case::random(&mut rng, vocab))
                    .collect();
                shuffled_slots(per_call, &mut rng);
                cases.extend(call.into_iter().map(|c| (vocab, c)));
                left -= 1;
            }
        }
    } else {
        let plan = std::env::var("PLAN").expect("PLAN=<vocab>x<rows>,... or REPLAY=<calls>");
        for p in plan.split(',') {
            let (v, n) = p.split_once('x').expect("vocab x rows");
            let (vocab, rows): (usize, usize) = (v.parse().unwrap(), n.parse().unwrap());
            for _ in 0..rows {
                let mut c = Case::random(&mut rng, vocab);
                if ties {
                    c.row = (0..vocab)
                        .map(|_| (rng.below(3) as f32 - 1.0) * 0.5)
                        .collect();
                    c.params.temperature = 1.0;
                    c.params.top_p = (0.02 + 0.96 * rng.unit()) as f32;
                    if rng.below(2) == 0 {
                        c.params.top_k = (vocab / 6 + rng.below(vocab as u64 / 2) as usize) as u32;
                    }
                }
                if with_masks && rng.below(2) == 0 {
                    c.allowed = Some(AllowedTokens::ready(masks::random_mask(&mut rng, &c.row)));
                }
                cases.push((vocab, c));
            }
        }
    }
    let mut out: Vec<u8> = vec![];
    let mut n = 0u32;
    for (vocab, c) in cases {
        {
            let spec = c.spec();
            let want = masks::answer(&c);
            let adj = sampler::adjustments(&spec, vocab);
            let p = &c.params;
            let mut put = |b: &[u8]| out.extend_from_slice(b);
            put(&(vocab as u32).to_le_bytes());
            c.row.iter().for_each(|x| put(&x.to_le_bytes()));
            put(&c.seed.seed.to_le_bytes());
            put(&c.seed.draw.to_le_bytes());
            for x in [p.temperature, p.top_p, p.min_p, p.repetition_penalty] {
                put(&x.to_le_bytes());
            }
            put(&p.top_k.to_le_bytes());
            put(&p.logprobs.map_or(-1i32, |k| k as i32).to_le_bytes());
            put(&(adj.len() as u32).to_le_bytes());
            for a in &adj {
                put(&a.token.to_le_bytes());
                put(&(u32::from(a.repetition) | (u32::from(a.ban) << 1)).to_le_bytes());
                put(&a.subtract.to_le_bytes());
            }
            // The mask: its words (covering the vocabulary), 0 without one.
            let words = c.allowed.as_ref().map_or(Vec::new(), |a| {
                let mut w = a.words().to_vec();
                w.resize(gdn_kernels::mask_words(vocab), 0);
                w
            });
            put(&(words.len() as u32).to_le_bytes());
            words.iter().for_each(|w| put(&w.to_le_bytes()));
            put(&want.token.to_le_bytes());
            put(&want.logprob.to_le_bytes());
            put(&(want.top_logprobs.len() as u32).to_le_bytes());
            for (id, lp) in &want.top_logprobs {
                put(&id.to_le_bytes());
                put(&lp.to_le_bytes());
            }
            n += 1;
        }
    }
    let mut file = n.to_le_bytes().to_vec();
    file.extend(out);
    std::fs::write(&path, file).unwrap();
    println!("{n} cases written to {path}");
}
