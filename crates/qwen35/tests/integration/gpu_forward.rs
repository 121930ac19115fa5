//! The GPU gates of the bf16 runtime on the tiny fixtures (skipped without a
//! GPU; `GDN_REQUIRE_GPU=1` makes a missing GPU a failure):
//! - every prompt against HF's bf16 goldens with `qwen35_testkit::gate` (regret/mean/p99),
//!   on the dispatched GDN backend and on the portable one, backend asserted,
//!   and (SM 9.0) with the MLP's fused and unfused SwiGLU routes forced;
//! - a batch of mixed-length prompts against the same prompts one by one;
//! - chunked prefill (64 + 64, 37 + 91, 1 + 127, and 2048 + 2052 for the
//!   4100-token prompt) against unchunked;
//! - prefill then single-token decode against HF's bf16 cached decode and
//!   its fp32 cached decode; batched decode against single decode;
//! - a released slot reused by a new sequence gives the fresh results;
//! - decode CUDA graphs (padded batch buckets captured up front) against HF
//!   and the eager decode, without touching a bystander slot.
//!
//! Every test runs with both recurrent-state dtypes (f32, and bf16 storage
//! with f32 math: `--mamba-ssm-cache-dtype bfloat16`) against the same
//! goldens and limits.
//!
//! The tests allocate slots and pages with `qwen35_testkit::alloc::Seqs` (the
//! engine's allocator does it in the server) and share their steps with the
//! MoE gates (gpu_moe_forward.rs) through `qwen35_testkit::gpu`.
//!
//! Fixtures: tests/fixtures (or `QWEN35_FIXTURES`), made by
//! checks/fixtures/make_qwen35_fixtures.py.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::{PageId, SlotId};
use gdn_kernels::{Backend, BackendRequest, SwigluRequest};
use qwen35::{RowLogits, StateDtype};
use qwen35_testkit::alloc::Seqs;
use qwen35_testkit::gate::{compare, consistency, report, topk};
use qwen35_testkit::gpu::{self, decode_run, run_chunks, STATE_DTYPES};
use qwen35_testkit::{Fixture, MODELS};

fn stream() -> Option<Arc<CudaStream>> {
    gdn_kernels_testkit::gpu_stream()
}

fn models_and_dtypes() -> impl Iterator<Item = (&'static str, StateDtype)> {
    gpu::models_and_dtypes(&MODELS)
}

fn hopper(stream: &Arc<CudaStream>) -> bool {
    stream.context().compute_capability().unwrap() == (9, 0)
}

fn expected_backend(stream: &Arc<CudaStream>) -> Backend {
    if hopper(stream) {
        Backend::CuteDslSm90
    } else {
        Backend::Portable
    }
}

#[test]
fn every_prompt_passes_the_hf_bf16_gate_on_both_gdn_backends() {
    let Some(s) = stream() else { return };
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut requests = vec![
            (BackendRequest::Auto, expected_backend(&s)),
            (BackendRequest::Portable, Backend::Portable),
        ];
        if hopper(&s) {
            requests.push((BackendRequest::FlashInfer, Backend::FlashInfer));
        }
        for (request, backend) in requests {
            let mut model = gpu::load(&f, &s, request, dtype);
            assert_eq!(model.gdn_backend(), backend, "{name}: {request:?}");
            for (i, p) in f.prompts.iter().enumerate() {
                let logits = run_chunks(&mut model, &[p]);
                if request == BackendRequest::Auto && hopper(&s) {
                    // The tiny models have Hv <= 8, for which no context-parallel
                    // fixup is exported: Auto runs the DSL non-CP kernel throughout.
                    assert_eq!(
                        model.last_gdn_backend(),
                        Backend::CuteDslSm90,
                        "{name} prompt {i}"
                    );
                }
                let (ids, lps) = f.golden(i);
                let st = compare(&logits, &ids, &lps);
                report(&format!("{name} {backend} prompt {i} (T={})", p.len()), &st);
                assert!(st.passes(), "{name} {backend} prompt {i}: {st:?}");
            }
        }
    }
}

#[test]
fn every_prompt_passes_the_hf_bf16_gate_on_both_swiglu_routes() {
    let Some(s) = stream() else { return };
    if !hopper(&s) {
        eprintln!("skipped: the fused SwiGLU GEMM runs on SM 9.0 GPUs only");
        return;
    }
    // Auto fuses only prompts of at least SWIGLU_FUSED_MIN_ROWS tokens (the
    // 4100-token one): forcing each route runs every prompt through both.
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        for request in [SwigluRequest::Fused, SwigluRequest::Unfused] {
            model.set_swiglu_request(request);
            for (i, p) in f.prompts.iter().enumerate() {
                let logits = run_chunks(&mut model, &[p]);
                let (ids, lps) = f.golden(i);
                let st = compare(&logits, &ids, &lps);
                report(
                    &format!("{name} SwiGLU {request:?} prompt {i} (T={})", p.len()),
                    &st,
                );
                assert!(st.passes(), "{name} SwiGLU {request:?} prompt {i}: {st:?}");
            }
        }
    }
}

#[test]
fn a_mixed_batch_equals_its_prompts_one_by_one_and_slots_are_reused_clean() {
    let Some(s) = stream() else { return };
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        let short: Vec<&Vec<u32>> = f.prompts.iter().filter(|p| p.len() <= 128).collect();
        let alone: Vec<Vec<Vec<f32>>> =
            short.iter().map(|p| run_chunks(&mut model, &[p])).collect();
        let mut cache = model.new_cache(short.len(), 64, 16).unwrap();
        let mut seqs = Seqs::all_of(&cache);
        for round in 0..2 {
            // Round 1 runs in slots (and pages) released by round 0.
            let ids: Vec<_> = short.iter().map(|_| seqs.add()).collect();
            let step: Vec<_> = ids
                .iter()
                .zip(&short)
                .map(|(id, p)| (*id, p.as_slice()))
                .collect();
            let all = seqs
                .step(&mut model, &mut cache, &step, RowLogits::All)
                .unwrap();
            let mut at = 0;
            for (i, p) in short.iter().enumerate() {
                let got = &all[at..at + p.len()];
                at += p.len();
                let st = consistency(got, &alone[i]);
                report(
                    &format!("{name} round {round} batch vs alone, prompt {i}"),
                    &st,
                );
                assert!(st.consistent(), "{name} prompt {i}: {st:?}");
                let (gi, gl) = f.golden(i);
                assert!(compare(got, &gi, &gl).passes(), "{name} prompt {i} vs HF");
            }
            for id in ids {
                seqs.release(id);
            }
        }
    }
}

#[test]
fn chunked_prefill_equals_unchunked() {
    let Some(s) = stream() else { return };
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        for (i, p) in f.prompts.iter().enumerate() {
            let splits: &[usize] = match p.len() {
                128 => &[64, 37, 1],
                n if n > 4096 => &[2048],
                _ => continue,
            };
            let whole = run_chunks(&mut model, &[p]);
            for &at in splits {
                let chunked = run_chunks(&mut model, &[&p[..at], &p[at..]]);
                let st = consistency(&chunked, &whole);
                report(
                    &format!("{name} prompt {i} split {at}+{}", p.len() - at),
                    &st,
                );
                assert!(st.consistent(), "{name} prompt {i} split at {at}: {st:?}");
                let (gi, gl) = f.golden(i);
                assert!(
                    compare(&chunked, &gi, &gl).passes(),
                    "{name} prompt {i} vs HF"
                );
            }
        }
    }
}

#[test]
fn prefill_then_decode_matches_hf_cached_decode_alone_and_batched() {
    let Some(s) = stream() else { return };
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        let (ids, prefix, steps, others) = f.decode_setup();
        let mut cache = model.new_cache(1 + others.len(), 64, 16).unwrap();
        let mut seqs = Seqs::all_of(&cache);
        let mut run = |batched: bool| {
            decode_run(
                &mut model,
                (&mut cache, &mut seqs),
                (ids, RowLogits::Last),
                (prefix, steps),
                &others,
                batched,
            )
        };
        let alone = run(false);
        let batched = run(true);
        let (gi, gl) = f.golden_keys("decode.topk_ids", "decode.topk_logprobs");
        let st = compare(&alone, &gi, &gl);
        report(&format!("{name} decode vs HF bf16 cached decode"), &st);
        assert!(st.passes(), "{name}: {st:?}");
        let fp32 = f.reference("decode.logits");
        let (ri, rl): (Vec<_>, Vec<_>) = fp32.iter().map(|r| topk(r, 64)).unzip();
        let st = compare(&alone, &ri, &rl);
        report(&format!("{name} decode vs HF fp32 cached decode"), &st);
        assert!(st.passes(), "{name}: {st:?}");
        let st = consistency(&batched, &alone);
        report(&format!("{name} batched decode vs alone"), &st);
        assert!(st.consistent(), "{name}: {st:?}");
    }
}

#[test]
fn decode_deep_into_a_long_prompt_matches_hf_teacher_forced_eager_and_graphed() {
    // Decode steps at positions 4000..4099 attend over thousands of cached
    // keys (the split "flash-decoding" attention path); HF's teacher-forced
    // goldens give the expected distribution at each of those positions.
    // Graphed: tiers of 128 pages (2048 positions) and the whole context;
    // these steps need about 257 pages, so they take the second tier.
    let Some(s) = stream() else { return };
    let s = s.context().new_stream().unwrap();
    let f = Fixture::load("text_gva2");
    let (i, p) = f
        .prompts
        .iter()
        .enumerate()
        .find(|(_, p)| p.len() > 4096)
        .expect("text_gva2 has a long prompt");
    for dtype in STATE_DTYPES {
        println!("-- text_gva2, {dtype} recurrent state");
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        let prefix = 4000;
        let pages = p.len().div_ceil(16) + 1;
        let mut run = |graphs: bool| {
            // One more slot and page for the graphs' padding rows.
            let mut cache = model.new_cache(2, pages + 1, 16).unwrap();
            if graphs {
                model
                    .capture_decode_graphs(
                        &mut cache,
                        &[1],
                        p.len() + 16,
                        SlotId(1),
                        PageId(pages as u32),
                    )
                    .unwrap();
                assert_eq!(cache.decode_graph_batch_sizes(), vec![1]);
            }
            let mut seqs = Seqs::new(1, pages, 16);
            let id = seqs.add();
            let mut rows = seqs
                .step(
                    &mut model,
                    &mut cache,
                    &[(id, &p[..prefix])],
                    RowLogits::Last,
                )
                .unwrap();
            for j in prefix..p.len() {
                rows.extend(
                    seqs.step(
                        &mut model,
                        &mut cache,
                        &[(id, &p[j..j + 1])],
                        RowLogits::Last,
                    )
                    .unwrap(),
                );
            }
            rows
        };
        let eager = run(false);
        let graphed = run(true);
        let (ids, lps) = f.golden(i);
        for (what, rows) in [("eager", &eager), ("graphed", &graphed)] {
            let st = compare(rows, &ids[prefix - 1..], &lps[prefix - 1..]);
            report(
                &format!("text_gva2 {what} decode at positions {prefix}..{}", p.len()),
                &st,
            );
            assert!(st.passes(), "{what}: {st:?}");
        }
        let st = consistency(&graphed, &eager);
        report("text_gva2 deep decode, graphed vs eager", &st);
        assert!(st.consistent(), "{st:?}");
    }
}

#[test]
fn decode_graphs_match_hf_and_the_eager_decode_and_leave_other_slots_alone() {
    // Graph capture needs a created stream (not the legacy default one).
    let Some(s) = stream() else { return };
    let s = s.context().new_stream().unwrap();
    const BUCKETS: [usize; 4] = [1, 2, 4, 8];
    for (name, dtype) in models_and_dtypes() {
        let f = Fixture::load(name);
        let mut model = gpu::load(&f, &s, BackendRequest::Auto, dtype);
        let (ids, prefix, steps, others) = f.decode_setup();
        let n = 1 + others.len();
        assert!(n <= 8, "{name}: the buckets hold the batched decode");
        let mut eager_cache = model.new_cache(n, 64, 16).unwrap();
        let mut eager_seqs = Seqs::all_of(&eager_cache);
        let eager = decode_run(
            &mut model,
            (&mut eager_cache, &mut eager_seqs),
            (ids, RowLogits::Last),
            (prefix, steps),
            &others,
            true,
        );
        // One bystander slot (n) with a live state that no step names, then
        // the padding slot (n + 1) and page (64) the graphs pad with.
        let mut g = gpu::graphed_cache(&mut model, (n, 64), &ids[..prefix], &BUCKETS, 256);
        // Round 0 and round 1 replay the padded bucket of n with other
        // slots, pages and positions; "alone" replays bucket 1.
        let round0 = decode_run(
            &mut model,
            (&mut g.cache, &mut g.seqs),
            (ids, RowLogits::Last),
            (prefix, steps),
            &others,
            true,
        );
        let round1 = decode_run(
            &mut model,
            (&mut g.cache, &mut g.seqs),
            (ids, RowLogits::Last),
            (prefix, steps),
            &others,
            true,
        );
        let alone = decode_run(
            &mut model,
            (&mut g.cache, &mut g.seqs),
            (ids, RowLogits::Last),
            (prefix, steps),
            &others,
            false,
        );
        assert_eq!(
            round0, round1,
            "{name}: a replay differs from the one before"
        );
        assert!(eager_cache.decode_graph_batch_sizes().is_empty());
        g.assert_bystander_untouched(name);
        let (gi, gl) = f.golden_keys("decode.topk_ids", "decode.topk_logprobs");
        for (what, rows) in [("graphs batched", &round1), ("graphs alone", &alone)] {
            let st = compare(rows, &gi, &gl);
            report(
                &format!("{name} {what} decode vs HF bf16 cached decode"),
                &st,
            );
            assert!(st.passes(), "{name} {what}: {st:?}");
        }
        let st = consistency(&round1, &eager);
        report(
            &format!(
                "{name} graphs (bucket {}) vs eager decode",
                n.next_power_of_two()
            ),
            &st,
        );
        assert!(st.consistent(), "{name}: {st:?}");
    }
}
