//! The GPU executor driven with engine rows (skipped without a GPU;
//! `GDN_REQUIRE_GPU=1` makes a missing GPU a failure), on the tiny fixtures:
//! - every short prompt, teacher-forced through the executor all at once in
//!   chunks of 16 (mixed decode + prefill steps, then decode-only steps),
//!   with and without decode CUDA graphs: the greedy token at each position
//!   passes HF's bf16 gate (regret) and the returned logprobs match HF's
//!   (mean and p99 of |ours - HF| over the returned top 5), with both
//!   recurrent-state dtypes (f32; bf16 storage with f32 math);
//! - the page pool sized from free memory fits the fraction asked for;
//! - a row at the wrong position for its slot is refused and changes nothing;
//! - step timing (the request timeline) reports every step's phases within
//!   the call's wall time, and changes no token;
//! - the device's memory pool keeps its memory across steps (release
//!   threshold: none), so the same work twice reserves nothing new;
//! - a MoE config whose experts the MoE kernels cannot run is refused
//!   with the reason before any upload (the MoE fixtures themselves are
//!   gated in gpu_moe_forward).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::{ExecError, Executor, PageId, SlotId, StepRow};
use qwen35::engine_exec::{GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::{GpuModel, GpuOptions};
use qwen35::{StateDtype, StateDtypeRequest};
use qwen35_testkit::drive::{run, Request};
use qwen35_testkit::gate::{MAX_MEAN_ABS, MAX_P99_ABS, MAX_REGRET};
use qwen35_testkit::{Fixture, MODELS, MOE_MODELS};

const PAGE: usize = 16;
const PAGES_PER_SLOT: usize = 16;

fn stream() -> Option<Arc<CudaStream>> {
    // Graph capture needs a created stream (not the legacy default one).
    gdn_kernels_testkit::gpu_stream().map(|s| s.context().new_stream().unwrap())
}

fn executor(f: &Fixture, s: &Arc<CudaStream>, slots: usize, pages: PagePool) -> GpuExecutor {
    executor_with(f, s, slots, pages, GpuOptions::default())
}

fn executor_with(
    f: &Fixture,
    s: &Arc<CudaStream>,
    slots: usize,
    pages: PagePool,
    options: GpuOptions,
) -> GpuExecutor {
    let model = GpuModel::load(f.config.clone(), &f.weights, s.clone(), options).unwrap();
    GpuExecutor::new(
        model,
        GpuSizing {
            num_slots: slots,
            pages,
            page_size: PAGE,
            max_model_len: PAGES_PER_SLOT * PAGE,
        },
    )
    .unwrap()
}

/// Gate statistics of teacher-forced samples against HF's top-64 rows.
#[derive(Debug, Default)]
struct Stats {
    positions: usize,
    max_regret: f32,
    diffs: Vec<f32>,
}

impl Stats {
    fn add(&mut self, r: &Request, ids: &[Vec<u32>], lps: &[Vec<f32>]) {
        // Sample j follows prompt position prompt_len - 1 + j.
        for (j, t) in r.out.iter().enumerate() {
            let (hi, hl) = (&ids[r.prompt.len() - 1 + j], &lps[r.prompt.len() - 1 + j]);
            let lp_of = |tok: u32| hi.iter().position(|&x| x == tok).map(|k| hl[k]);
            // Outside HF's top 64: its 64th logprob bounds the true regret.
            let ours = lp_of(t.token).unwrap_or(*hl.last().unwrap());
            self.max_regret = self.max_regret.max(hl[0] - ours);
            for &(tok, lp) in &t.top_logprobs {
                if let Some(want) = lp_of(tok) {
                    self.diffs.push((lp - want).abs());
                }
            }
            self.positions += 1;
        }
    }

    fn check(mut self, what: &str) {
        assert!(
            self.positions > 0 && !self.diffs.is_empty(),
            "{what}: nothing compared"
        );
        self.diffs.sort_by(f32::total_cmp);
        let mean = self.diffs.iter().sum::<f32>() / self.diffs.len() as f32;
        let p99 = self.diffs[(self.diffs.len() * 99 / 100).min(self.diffs.len() - 1)];
        println!(
            "{what}: {} positions, max regret {:.3}, |logprob - HF| mean {mean:.4} p99 {p99:.4}",
            self.positions, self.max_regret
        );
        assert!(
            self.max_regret <= MAX_REGRET,
            "{what}: regret {}",
            self.max_regret
        );
        assert!(mean <= MAX_MEAN_ABS, "{what}: mean {mean}");
        assert!(p99 <= MAX_P99_ABS, "{what}: p99 {p99}");
    }
}

#[test]
fn teacher_forced_greedy_through_the_executor_passes_the_hf_bf16_gate() {
    let Some(s) = stream() else { return };
    let dtypes = [StateDtype::F32, StateDtype::Bf16];
    for (name, dtype) in MODELS.iter().flat_map(|n| dtypes.map(|d| (*n, d))) {
        let f = Fixture::load(name);
        let short: Vec<(usize, &Vec<u32>)> = f
            .prompts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.len() > 1 && p.len() <= 128)
            .collect();
        for graphs in [false, true] {
            let options = GpuOptions {
                state_dtype: StateDtypeRequest::Fixed(dtype),
                ..GpuOptions::default()
            };
            let pages = PagePool::Fixed(short.len() * PAGES_PER_SLOT);
            let mut exec = executor_with(&f, &s, short.len(), pages, options);
            assert_eq!(exec.state_geometry().recurrent_dtype, dtype.name());
            if graphs {
                let sizes = exec.capture_decode_graphs(8).unwrap();
                assert_eq!(sizes.first(), Some(&1), "{name}");
                assert_eq!(*sizes.last().unwrap(), short.len().min(8), "{name}");
                // Start-up phases: the load's, the cache's, one per batch size.
                let phases: Vec<String> = exec
                    .startup_phases()
                    .iter()
                    .map(|(p, _)| p.to_string())
                    .collect();
                let mut want: Vec<String> = [
                    "pinned_staging",
                    "model_kernels",
                    "cublas",
                    "gdn_prefill_init",
                    "weights_upload",
                    "cache_alloc",
                ]
                .map(String::from)
                .to_vec();
                want.extend(sizes.iter().map(|b| format!("decode_graph_b{b}")));
                assert_eq!(phases, want, "{name}");
            }
            // Each prompt: its first quarter as the prompt (at least one
            // token), the rest forced one token per step.
            let mut reqs: Vec<Request> = short
                .iter()
                .enumerate()
                .map(|(slot, (_, p))| {
                    let k = (p.len() / 4).max(1);
                    let mut r = Request::new(slot as u32, PAGES_PER_SLOT, &p[..k], 16, p.len() - k);
                    r.forced = Some(p[k..].to_vec());
                    r
                })
                .collect();
            run(&mut exec, &mut reqs);
            let mut stats = Stats::default();
            for (r, (i, _)) in reqs.iter().zip(&short) {
                let (ids, lps) = f.golden(*i);
                stats.add(r, &ids, &lps);
            }
            stats.check(&format!(
                "{name} executor ({dtype} state, graphs: {graphs}) vs HF bf16"
            ));
        }
    }
}

#[test]
fn the_page_pool_from_free_memory_fits_the_fraction_asked() {
    let Some(s) = stream() else { return };
    let f = Fixture::load(MODELS[0]);
    let (_, total) = s.context().mem_get_info().unwrap();
    let reserve = 1 << 30;
    let exec = executor(
        &f,
        &s,
        4,
        PagePool::FromMemory {
            gpu_memory_utilization: 0.25,
            activation_reserve: reserve,
        },
    );
    let g = exec.geometry();
    let (slot_bytes, page_bytes) = exec.model().slot_and_page_bytes(PAGE);
    let (free, _) = s.context().mem_get_info().unwrap();
    let used = total - free;
    println!(
        "{} pages of {page_bytes} bytes; {used} bytes in use of {total}",
        g.num_pages
    );
    assert!(g.num_pages > 0);
    // What the pool and slots took, plus the reserve, stays within the
    // fraction (give or take the driver's 2 MiB rounding of each of the
    // cache's few dozen buffers).
    let slack = 64 << 20;
    assert!(
        used + reserve <= total / 4 + page_bytes + slot_bytes + slack,
        "{used} + {reserve} > {total} / 4"
    );
    // And the pool is not tiny: at least half of what the fraction left.
    let pool = (g.num_pages + 1) * page_bytes;
    assert!(
        pool * 2 >= total / 4 - (used - pool) - reserve,
        "pool {pool} too small"
    );
}

#[test]
fn a_row_at_the_wrong_position_is_refused_and_changes_nothing() {
    let Some(s) = stream() else { return };
    let f = Fixture::load(MODELS[0]);
    let p = f
        .prompts
        .iter()
        .find(|p| p.len() == 37)
        .expect("a 37-token prompt");
    let run_with = |refuse: bool| {
        let mut exec = executor(&f, &s, 2, PagePool::Fixed(2 * PAGES_PER_SLOT));
        let mut reqs = vec![Request::new(0, PAGES_PER_SLOT, p, 16, 6)];
        qwen35_testkit::drive::step(&mut exec, &mut reqs).unwrap();
        if refuse {
            let pages: Vec<PageId> = (0..PAGES_PER_SLOT as u32).map(PageId).collect();
            for (slot, start) in [(0, 15), (0, 17), (1, 16)] {
                let row = StepRow {
                    snapshots: &[],
                    slot: SlotId(slot),
                    start,
                    tokens: &p[16..32],
                    pages: &pages,
                    sample: None,
                };
                match exec.step(&[row]) {
                    Err(ExecError::Refused(m)) => assert!(m.contains("holds"), "{m}"),
                    other => panic!("slot {slot} start {start}: expected a refusal, got {other:?}"),
                }
            }
        }
        run(&mut exec, &mut reqs);
        reqs.pop().unwrap().out
    };
    assert_eq!(run_with(true), run_with(false));
}

#[test]
fn step_timing_reports_each_steps_phases_and_changes_no_token() {
    let Some(s) = stream() else { return };
    let f = Fixture::load(MODELS[0]);
    let p = f
        .prompts
        .iter()
        .find(|p| p.len() == 37)
        .expect("a 37-token prompt");
    let run_with = |timing: bool| {
        let mut exec = executor(&f, &s, 2, PagePool::Fixed(2 * PAGES_PER_SLOT));
        exec.capture_decode_graphs(2).unwrap();
        exec.set_step_timing(timing);
        // Chunks of 16, 16 and 5 prompt tokens, then decode steps (graphs).
        let mut reqs = vec![Request::new(0, PAGES_PER_SLOT, p, 16, 6)];
        let mut steps = 0;
        loop {
            let t0 = std::time::Instant::now();
            if !qwen35_testkit::drive::step(&mut exec, &mut reqs).unwrap() {
                break;
            }
            let wall = t0.elapsed();
            steps += 1;
            match exec.last_step_phases() {
                None => assert!(!timing, "step {steps}: timing on, no phases"),
                Some(ph) => {
                    assert!(timing, "step {steps}: phases with timing off");
                    assert!(!ph.forward.is_zero(), "step {steps}: {ph:?}");
                    // The phases follow each other inside the call.
                    let sum = ph.host_prep + ph.forward + ph.sample;
                    assert!(
                        sum <= wall + std::time::Duration::from_micros(200),
                        "step {steps}: {ph:?} over {wall:?}"
                    );
                    assert!(ph.launch <= wall, "step {steps}: {ph:?}");
                }
            }
        }
        assert!(steps >= 8, "{steps} steps");
        reqs.pop().unwrap().out
    };
    assert_eq!(run_with(true), run_with(false));
}

#[test]
fn the_memory_pool_keeps_its_memory_across_steps() {
    let Some(s) = stream() else { return };
    let f = Fixture::load(MODELS[0]);
    let mut exec = executor(&f, &s, 2, PagePool::Fixed(2 * PAGES_PER_SLOT));
    // Loading the model set the threshold: a step's synchronisation no
    // longer hands the activations' memory back to the driver.
    assert_eq!(qwen35::gpu::pool_release_threshold(&s).unwrap(), u64::MAX);
    let p = f
        .prompts
        .iter()
        .find(|p| p.len() == 37)
        .expect("a 37-token prompt");
    let mut reqs = vec![Request::new(0, PAGES_PER_SLOT, p, 64, 2)];
    run(&mut exec, &mut reqs);
    let (free_after_run, _) = s.context().mem_get_info().unwrap();
    let mut again = vec![Request::new(1, PAGES_PER_SLOT, p, 64, 2)];
    run(&mut exec, &mut again);
    let (free_after_again, _) = s.context().mem_get_info().unwrap();
    // The same work again reserves nothing new.
    assert_eq!(free_after_again, free_after_run);
    assert_eq!(reqs[0].tokens(), again[0].tokens());
}

#[test]
fn a_moe_shape_the_kernels_cannot_run_is_refused_with_the_reason() {
    let Some(s) = stream() else { return };
    for name in MOE_MODELS {
        let f = Fixture::load(name);
        let mut config = f.config.clone();
        let moe = config.moe.as_mut().expect("a MoE fixture");
        // The expert GEMMs step through I in 32s.
        moe.moe_intermediate_size = 40;
        let err = GpuModel::load(config, &f.weights, s.clone(), GpuOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{name}: experts of I = 40 loaded on the GPU"))
            .to_string();
        assert!(
            err.contains("MoE (8 experts, top-2, shared expert)")
                && err.contains("multiples of 32"),
            "{name}: {err}"
        );
    }
}
