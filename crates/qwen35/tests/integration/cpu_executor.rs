//! The CPU executor driven directly with engine rows, on the committed
//! fixtures (tiny random Qwen3.5 models, dense and MoE):
//! - greedy tokens through the executor (all prompts at once, chunked, in
//!   mixed steps) equal the CPU reference forward's own greedy loop, and the
//!   reported logprobs equal that forward's log-softmax;
//! - chunked prefill equals unchunked (identical tokens and logprobs: the CPU
//!   forward runs token by token, so chunking cannot change its arithmetic);
//! - `start == 0` resets a used slot;
//! - a row whose `start` is not its slot's position is refused and changes
//!   nothing;
//! - step timing (the request timeline) reports phases only when asked.

use engine::{ExecError, Executor, PageId, SampleSeed, SampleSpec, SlotId, StepRow};
use qwen35::engine_exec::{CpuExecutor, CpuSizing};
use qwen35::CpuModel;
use qwen35_testkit::drive::{run, step, Request};
use qwen35_testkit::{Fixture, MODELS, MOE_MODELS};

const PAGE: usize = 16;
/// Pages per slot: 4096 positions (the long prompt is not used here).
const PAGES_PER_SLOT: usize = 256;
const SLOTS: usize = 6;

fn executor(f: &Fixture) -> CpuExecutor {
    let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
    CpuExecutor::new(
        model,
        CpuSizing {
            num_slots: SLOTS,
            num_pages: SLOTS * PAGES_PER_SLOT,
            page_size: PAGE,
            max_model_len: PAGES_PER_SLOT * PAGE,
        },
    )
    .unwrap()
}

/// The fixture's prompts up to 128 tokens.
fn short_prompts(f: &Fixture) -> Vec<Vec<u32>> {
    f.prompts
        .iter()
        .filter(|p| p.len() <= 128)
        .cloned()
        .collect()
}

fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    logits[token as usize] - max - sum.ln() as f32
}

/// The reference: `CpuModel::forward` over the prompt, then argmax and feed
/// back, `n` times; returns (token, log-softmax of it) per step.
fn reference_greedy(model: &CpuModel, prompt: &[u32], n: usize) -> Vec<(u32, f32)> {
    let mut state = model.new_state();
    let mut logits = model.forward(prompt, &mut state).unwrap().pop().unwrap();
    let mut out = vec![];
    for _ in 0..n {
        // First maximum, as a greedy sampler picks.
        let (best, _) =
            logits
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                    if v > bv {
                        (i, v)
                    } else {
                        (bi, bv)
                    }
                });
        out.push((best as u32, log_softmax_at(&logits, best as u32)));
        logits = model
            .forward(&[best as u32], &mut state)
            .unwrap()
            .pop()
            .unwrap();
    }
    out
}

#[test]
fn greedy_tokens_through_the_executor_equal_the_reference_forward() {
    const OUT: usize = 10;
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        let f = Fixture::load(name);
        let reference = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        let mut exec = executor(&f);
        let prompts = short_prompts(&f);
        // Chunks of 16: the long prompts prefill over several steps while
        // the short ones already decode (mixed steps).
        let mut reqs: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Request::new(i as u32, PAGES_PER_SLOT, p, 16, OUT))
            .collect();
        run(&mut exec, &mut reqs);
        for (i, r) in reqs.iter().enumerate() {
            let want = reference_greedy(&reference, &r.prompt, OUT);
            let tokens: Vec<u32> = want.iter().map(|w| w.0).collect();
            assert_eq!(r.tokens(), tokens, "{name} prompt {i}");
            for (got, (tok, lp)) in r.out.iter().zip(&want) {
                // Same f32 logits, log-softmax summed in another order.
                assert!(
                    (got.logprob - lp).abs() <= 1e-4,
                    "{name} prompt {i} token {tok}: logprob {} vs {lp}",
                    got.logprob
                );
                assert_eq!(got.top_logprobs.len(), 5);
                assert_eq!(
                    got.top_logprobs[0].0, *tok,
                    "{name}: greedy is the top logprob"
                );
            }
        }
    }
}

#[test]
fn chunked_prefill_equals_unchunked() {
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        let f = Fixture::load(name);
        let mut exec = executor(&f);
        for p in short_prompts(&f).iter().filter(|p| p.len() > 8) {
            let mut whole = vec![Request::new(0, PAGES_PER_SLOT, p, p.len(), 6)];
            run(&mut exec, &mut whole);
            for chunk in [1, 7, 16, p.len() - 1] {
                let mut chunked = vec![Request::new(1, PAGES_PER_SLOT, p, chunk, 6)];
                run(&mut exec, &mut chunked);
                assert_eq!(
                    chunked[0].out,
                    whole[0].out,
                    "{name}, {} tokens in chunks of {chunk}",
                    p.len()
                );
            }
        }
    }
}

#[test]
fn start_zero_resets_a_used_slot() {
    for name in MODELS.into_iter().chain(MOE_MODELS) {
        let f = Fixture::load(name);
        let prompts = short_prompts(&f);
        let (a, b) = (&prompts[prompts.len() - 1], &prompts[prompts.len() - 2]);
        let mut fresh = executor(&f);
        let mut alone = vec![Request::new(0, PAGES_PER_SLOT, b, 16, 5)];
        run(&mut fresh, &mut alone);
        let mut exec = executor(&f);
        let mut first = vec![Request::new(0, PAGES_PER_SLOT, a, 16, 5)];
        run(&mut exec, &mut first);
        // The same slot (and pages) for another prompt from position 0.
        let mut again = vec![Request::new(0, PAGES_PER_SLOT, b, 16, 5)];
        run(&mut exec, &mut again);
        assert_eq!(again[0].out, alone[0].out, "{name}");
    }
}

fn refusal(exec: &mut CpuExecutor, rows: &[StepRow]) -> String {
    match exec.step(rows) {
        Err(ExecError::Refused(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_row_at_the_wrong_position_is_refused_and_changes_nothing() {
    let f = Fixture::load(MODELS[0]);
    let prompts = short_prompts(&f);
    let p = &prompts[prompts.len() - 1];
    let mut clean = executor(&f);
    let mut want = vec![Request::new(0, PAGES_PER_SLOT, p, 16, 4)];
    run(&mut clean, &mut want);

    let mut exec = executor(&f);
    let mut reqs = vec![Request::new(0, PAGES_PER_SLOT, p, 16, 4)];
    // Two prompt chunks in: slot 0 is at position 32.
    step(&mut exec, &mut reqs).unwrap();
    step(&mut exec, &mut reqs).unwrap();
    assert_eq!(reqs[0].fed, 32);
    let pages: Vec<PageId> = (0..PAGES_PER_SLOT as u32).map(PageId).collect();
    let other: Vec<PageId> = (PAGES_PER_SLOT as u32..2 * PAGES_PER_SLOT as u32)
        .map(PageId)
        .collect();
    let params = qwen35_testkit::drive::greedy();
    let spec = SampleSpec {
        params: &params,
        history: &p[..33],
        prompt_len: 33,
        seed: SampleSeed { seed: 7, draw: 0 },
        banned: &[],
        allowed: None,
    };
    let tokens = &p[32..33];
    let row = |slot: u32, start: usize, pages| StepRow {
        snapshots: &[],
        slot: SlotId(slot),
        start,
        tokens,
        pages,
        sample: Some(spec),
    };
    let (pages, other) = (pages.as_slice(), other.as_slice());
    for start in [31, 33] {
        let m = refusal(&mut exec, &[row(0, start, pages)]);
        assert!(m.contains("slot 0 holds 32 tokens"), "{m}");
    }
    // A never-used slot holds no sequence to continue.
    let m = refusal(&mut exec, &[row(1, 5, other)]);
    assert!(m.contains("slot 1 holds no sequence's tokens"), "{m}");
    // One bad row refuses the whole step, the good row included.
    let m = refusal(&mut exec, &[row(1, 5, other), row(0, 32, pages)]);
    assert!(m.contains("slot 1"), "{m}");
    run(&mut exec, &mut reqs);
    assert_eq!(reqs[0].out, want[0].out, "the refusals changed the state");
}

#[test]
fn step_timing_reports_each_steps_phases_only_when_asked() {
    let f = Fixture::load(MODELS[0]);
    let prompt = short_prompts(&f)
        .into_iter()
        .find(|p| p.len() > 20)
        .unwrap();
    let mut exec = executor(&f);
    let mut reqs = vec![Request::new(0, PAGES_PER_SLOT, &prompt, 8, 2)];
    assert!(step(&mut exec, &mut reqs).unwrap());
    assert_eq!(exec.last_step_phases(), None, "off by default");
    exec.set_step_timing(true);
    let t0 = std::time::Instant::now();
    assert!(step(&mut exec, &mut reqs).unwrap());
    let wall = t0.elapsed();
    let ph = exec.last_step_phases().expect("phases once asked");
    assert!(!ph.forward.is_zero(), "{ph:?}");
    assert!(
        ph.host_prep + ph.forward + ph.sample <= wall,
        "{ph:?} over {wall:?}"
    );
    exec.set_step_timing(false);
    assert!(step(&mut exec, &mut reqs).unwrap());
    assert_eq!(exec.last_step_phases(), None, "off again");
}
