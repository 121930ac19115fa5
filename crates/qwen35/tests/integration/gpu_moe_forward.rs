//! The GPU gates of the bf16 runtime on the tiny MoE fixtures (skipped
//! without a GPU; `GDN_REQUIRE_GPU=1` makes a missing GPU a failure), for
//! each of `MOE_MODELS` with both recurrent-state dtypes:
//! - every prompt of up to 128 tokens (1 token takes the experts' direct
//!   path, with the shared expert inside it; 5 the CUDA-core GEMV tiles, 37
//!   the tensor-core GEMV tiles, 128 the 64-row tensor-core tiles) through
//!   the MoE gate;
//! - chunked prefill (64 + 64, 37 + 91, 1 + 127) through the gate and
//!   against unchunked;
//! - prefill then single-token decode through the gate against HF's bf16
//!   cached decode; batched decode against single decode;
//! - decode CUDA graphs (padded batch buckets captured up front) through
//!   the gate and against the eager decode, replays bitwise equal, without
//!   touching a bystander slot.
//!
//! The MoE gate (`qwen35_testkit::moe`, whose module doc says why the plain
//! gate cannot judge a MoE forward): the plain gate's limits between the
//! run and the exact f32 forward whose bf16-ambiguous routing decisions are
//! fitted to the run, and between the run and HF's bf16 goldens wherever
//! that fit agrees with the one fitted to HF's goldens. Two runs that must
//! agree (chunked and not, batched and not, graphs and eager) are held to
//! the consistency limits wherever their fits agree.
//!
//! The 4100-token prompt is left to the CPU floor (bf16_golden_floor.rs):
//! fitting its routing costs the CPU about a hundred times a 128-token
//! prompt's, per run (docs/qwen35.md); the long-context paths are gated on
//! the dense fixtures (gpu_forward.rs).
//!
//! Fixtures: tests/fixtures (or `QWEN35_FIXTURES`), made by
//! checks/fixtures/make_qwen35_moe_fixtures.py.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gdn_kernels::BackendRequest;
use qwen35::gpu::{GpuCache, GpuModel};
use qwen35::{CpuModel, RowLogits};
use qwen35_testkit::alloc::Seqs;
use qwen35_testkit::gate::{report, GateStats};
use qwen35_testkit::gpu::{self, decode_run, run_chunks, STATE_DTYPES};
use qwen35_testkit::moe::{self, fit_routing, Fitted, MoeGate};
use qwen35_testkit::{Fixture, TopK, MOE_MODELS};

/// Prompts longer than this are left to the CPU floor (see the module doc).
const MAX_PROMPT: usize = 128;

/// A MoE fixture, its exact CPU forward, and that forward fitted to HF's
/// goldens (once per model: both dtypes and every run share them).
struct Moe {
    name: &'static str,
    f: Fixture,
    cpu: CpuModel,
    /// Per prompt of at most [`MAX_PROMPT`] tokens: (index, golden, fit).
    prompts: Vec<(usize, TopK, Fitted)>,
    /// HF's goldens at every position of the decode fixture's tokens, and
    /// their fit.
    decode: (TopK, Fitted),
}

impl Moe {
    fn load(name: &'static str) -> Moe {
        let f = Fixture::load(name);
        assert!(f.config.moe.is_some(), "{name}: a MoE fixture");
        let cpu = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        let prompts = (0..f.prompts.len())
            .filter(|&i| f.prompts[i].len() <= MAX_PROMPT)
            .map(|i| {
                let golden = f.golden(i);
                let fit = fit_routing(&cpu, &f.prompts[i], (&golden.0, &golden.1));
                (i, golden, fit)
            })
            .collect();
        let golden = f.golden_decode_positions();
        let fit = fit_routing(&cpu, Moe::decode_tokens(&f), (&golden.0, &golden.1));
        Moe {
            name,
            f,
            cpu,
            prompts,
            decode: (golden, fit),
        }
    }

    /// The decode fixture's prompt up to prefix + steps.
    fn decode_tokens(f: &Fixture) -> &[u32] {
        let (ids, prefix, steps, _) = f.decode_setup();
        &ids[..prefix + steps]
    }

    /// Gates one run of `tokens` (asserted), against `hf` (HF's goldens
    /// of those positions and their fit); returns the run's fit.
    fn gate(
        &self,
        what: &str,
        tokens: &[u32],
        logits: &[Vec<f32>],
        hf: (&TopK, &Fitted),
    ) -> Fitted {
        let (g, fit) = moe::gate(&self.cpu, tokens, logits, hf);
        report_gate(&format!("{} {what}", self.name), &g);
        assert!(g.passes(), "{} {what}: {g:?}", self.name);
        fit
    }
}

fn report_gate(what: &str, g: &MoeGate) {
    report(
        &format!(
            "{what} vs the exact forward fitted to it ({} flips, largest gap {:.4})",
            g.flips, g.max_gap
        ),
        &g.vs_fit,
    );
    report(&format!("{what} vs HF bf16 where the fits agree"), &g.vs_hf);
}

/// Two runs of the same tokens within the consistency limits wherever
/// their fits agree (asserted).
fn assert_consistent(what: &str, a: (&[Vec<f32>], &Fitted), b: (&[Vec<f32>], &Fitted)) {
    let st: GateStats = moe::consistent(a, b);
    report(what, &st);
    assert!(st.consistent(), "{what}: {st:?}");
}

fn stream() -> Option<Arc<CudaStream>> {
    gdn_kernels_testkit::gpu_stream()
}

#[test]
fn prefill_chunked_or_not_passes_the_moe_gate() {
    let Some(s) = stream() else { return };
    for name in MOE_MODELS {
        let m = Moe::load(name);
        for dtype in STATE_DTYPES {
            println!("-- {name}, {dtype} recurrent state");
            let mut model = gpu::load(&m.f, &s, BackendRequest::Auto, dtype);
            for (i, golden, hf_fit) in &m.prompts {
                let p = &m.f.prompts[*i];
                let whole = run_chunks(&mut model, &[p]);
                let what = format!("prompt {i} (T={})", p.len());
                let fit = m.gate(&what, p, &whole, (golden, hf_fit));
                if p.len() != MAX_PROMPT {
                    continue;
                }
                for at in [64, 37, 1] {
                    let chunked = run_chunks(&mut model, &[&p[..at], &p[at..]]);
                    let what = format!("prompt {i} split {at}+{}", p.len() - at);
                    let chunked_fit = m.gate(&what, p, &chunked, (golden, hf_fit));
                    assert_consistent(
                        &format!("{name} {what} vs unchunked"),
                        (&chunked, &chunked_fit),
                        (&whole, &fit),
                    );
                }
            }
        }
    }
}

#[test]
fn decode_eager_and_graphed_passes_the_moe_gate_alone_and_batched() {
    // Graph capture needs a created stream (not the legacy default one).
    let Some(s) = stream() else { return };
    let s = s.context().new_stream().unwrap();
    const BUCKETS: [usize; 4] = [1, 2, 4, 8];
    for name in MOE_MODELS {
        let m = Moe::load(name);
        let (ids, prefix, steps, others) = m.f.decode_setup();
        let tokens = Moe::decode_tokens(&m.f);
        let n = 1 + others.len();
        assert!(n <= 8, "{name}: the buckets hold the batched decode");
        let hf = (&m.decode.0, &m.decode.1);
        // Every row of the prefill is kept: the fit needs a target at
        // every position the decode's state has seen.
        let run = |model: &mut GpuModel, at: (&mut GpuCache, &mut Seqs), batched: bool| {
            decode_run(
                model,
                at,
                (ids, RowLogits::All),
                (prefix, steps),
                &others,
                batched,
            )
        };
        for dtype in STATE_DTYPES {
            println!("-- {name}, {dtype} recurrent state");
            let mut model = gpu::load(&m.f, &s, BackendRequest::Auto, dtype);
            let mut cache = model.new_cache(n, 64, 16).unwrap();
            let mut seqs = Seqs::all_of(&cache);
            let alone = run(&mut model, (&mut cache, &mut seqs), false);
            let batched = run(&mut model, (&mut cache, &mut seqs), true);
            let alone_fit = m.gate("decode alone", tokens, &alone, hf);
            let batched_fit = m.gate("decode batched", tokens, &batched, hf);
            assert_consistent(
                &format!("{name} batched decode vs alone"),
                (&batched, &batched_fit),
                (&alone, &alone_fit),
            );
            // Round 0 and round 1 replay the padded bucket of n with other
            // slots, pages and positions; "alone" replays bucket 1.
            let mut g = gpu::graphed_cache(&mut model, (n, 64), &ids[..prefix], &BUCKETS, 256);
            let round0 = run(&mut model, (&mut g.cache, &mut g.seqs), true);
            let round1 = run(&mut model, (&mut g.cache, &mut g.seqs), true);
            let graphs_alone = run(&mut model, (&mut g.cache, &mut g.seqs), false);
            assert_eq!(
                round0, round1,
                "{name}: a replay differs from the one before"
            );
            assert!(cache.decode_graph_batch_sizes().is_empty());
            g.assert_bystander_untouched(name);
            let round_fit = m.gate("graphs batched", tokens, &round1, hf);
            let graphs_alone_fit = m.gate("graphs alone", tokens, &graphs_alone, hf);
            let bucket = n.next_power_of_two();
            assert_consistent(
                &format!("{name} graphs (bucket {bucket}) vs eager, batched"),
                (&round1, &round_fit),
                (&batched, &batched_fit),
            );
            assert_consistent(
                &format!("{name} graphs (bucket 1) vs eager, alone"),
                (&graphs_alone, &graphs_alone_fit),
                (&alone, &alone_fit),
            );
        }
    }
}
