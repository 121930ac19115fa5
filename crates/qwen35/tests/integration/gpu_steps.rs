//! GPU tests of the runtime seam (skipped without a GPU; `GDN_REQUIRE_GPU=1`
//! makes a missing GPU a failure), on the tiny fixtures:
//! - a mixed step (decode rows, prefill rows, a prefill chunk without
//!   logits, in scrambled row order) equals the same rows run as separate
//!   steps, and passes the HF bf16 gates;
//! - a slot exported to the host and imported into another slot, or copied
//!   to another slot, continues exactly like the original, with either
//!   recurrent-state dtype (a bf16 snapshot holds bf16 values, and half
//!   the recurrent bytes);
//! - a refused step (bad token, page beyond the cache, slot twice, the
//!   graphs' padding slot) changes no state.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::{PageId, SlotId};
use gdn_kernels::BackendRequest;
use qwen35::gpu::{GpuCache, GpuModel, GpuOptions, LogitsTo, Row, StepError};
use qwen35::{RowLogits, StateDtype, StateDtypeRequest};
use qwen35_testkit::gate::{compare, consistency};
use qwen35_testkit::{Fixture, MODELS};

const PAGE: usize = 16;

fn stream() -> Option<Arc<CudaStream>> {
    gdn_kernels_testkit::gpu_stream()
}

fn gpu_model(f: &Fixture, s: &Arc<CudaStream>) -> GpuModel {
    gpu_model_with(f, s, StateDtypeRequest::Auto)
}

fn gpu_model_with(f: &Fixture, s: &Arc<CudaStream>, state_dtype: StateDtypeRequest) -> GpuModel {
    GpuModel::load(
        f.config.clone(),
        &f.weights,
        s.clone(),
        GpuOptions {
            gdn_backend: BackendRequest::Auto,
            state_dtype,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Pages `slot * 16..` for the sequence in `slot` (256 positions).
fn pages_of(slot: u32) -> Vec<PageId> {
    (slot * 16..(slot + 1) * 16).map(PageId).collect()
}

fn row<'a>(
    slot: u32,
    start: usize,
    tokens: &'a [u32],
    pages: &'a [PageId],
    logits: RowLogits,
) -> Row<'a> {
    Row {
        slot: SlotId(slot),
        start,
        tokens,
        pages,
        logits,
    }
}

fn step(model: &mut GpuModel, cache: &mut GpuCache, rows: &[Row]) -> Vec<Vec<f32>> {
    model.step(cache, rows, LogitsTo::Host).unwrap()
}

#[test]
fn a_mixed_step_equals_its_rows_run_separately() {
    let Some(s) = stream() else { return };
    for name in MODELS {
        let f = Fixture::load(name);
        let mut model = gpu_model(&f, &s);
        let (ids, prefix, _, _) = f.decode_setup();
        // Y: a 37-token prompt (HF golden index yi); Z: the 128-token one in
        // two chunks, the first without logits.
        let yi = f
            .prompts
            .iter()
            .position(|p| p.len() == 37)
            .expect("a 37-token prompt");
        let zi = f
            .prompts
            .iter()
            .position(|p| p.len() == 128)
            .expect("a 128-token prompt");
        let (y, z) = (&f.prompts[yi], &f.prompts[zi]);
        let (px, py, pz) = (pages_of(0), pages_of(1), pages_of(2));
        let run = |model: &mut GpuModel, mixed: bool| -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
            let mut cache = model.new_cache(3, 48, PAGE).unwrap();
            // X: prefilled alone first.
            step(
                model,
                &mut cache,
                &[row(0, 0, &ids[..prefix], &px, RowLogits::Last)],
            );
            let s1 = [
                row(1, 0, y, &py, RowLogits::All),
                row(2, 0, &z[..50], &pz, RowLogits::None),
                row(0, prefix, &ids[prefix..prefix + 1], &px, RowLogits::Last),
            ];
            let s2 = [
                row(2, 50, &z[50..], &pz, RowLogits::Last),
                row(
                    0,
                    prefix + 1,
                    &ids[prefix + 1..prefix + 2],
                    &px,
                    RowLogits::Last,
                ),
            ];
            let mut first = vec![];
            let mut second = vec![];
            if mixed {
                first = step(model, &mut cache, &s1);
                second = step(model, &mut cache, &s2);
            } else {
                for r in &s1 {
                    first.extend(step(model, &mut cache, std::slice::from_ref(r)));
                }
                for r in &s2 {
                    second.extend(step(model, &mut cache, std::slice::from_ref(r)));
                }
            }
            (first, second)
        };
        let (mixed1, mixed2) = run(&mut model, true);
        let (sep1, sep2) = run(&mut model, false);
        // Step 1: Y's 37 rows, then X's decode row (row order, not batch order).
        assert_eq!(mixed1.len(), y.len() + 1, "{name}");
        assert_eq!(mixed2.len(), 2, "{name}");
        let st = consistency(&mixed1, &sep1);
        println!("{name} mixed vs separate, step 1: {st:?}");
        assert!(st.consistent(), "{name} step 1: {st:?}");
        let st = consistency(&mixed2, &sep2);
        println!("{name} mixed vs separate, step 2: {st:?}");
        assert!(st.consistent(), "{name} step 2: {st:?}");
        // Against HF: Y teacher-forced, Z's last position, X's two decodes.
        let (gi, gl) = f.golden(yi);
        let st = compare(&mixed1[..y.len()], &gi, &gl);
        assert!(st.passes(), "{name} Y in a mixed step vs HF: {st:?}");
        let (gi, gl) = f.golden(zi);
        let st = compare(&mixed2[..1], &gi[z.len() - 1..], &gl[z.len() - 1..]);
        assert!(
            st.passes(),
            "{name} Z's last chunk in a mixed step vs HF: {st:?}"
        );
        let (di, dl) = f.golden_keys("decode.topk_ids", "decode.topk_logprobs");
        // decode.* row 0 is the prefill's last position, then one per decode.
        let x = [mixed1[y.len()].clone(), mixed2[1].clone()];
        let st = compare(&x, &di[1..3], &dl[1..3]);
        assert!(
            st.passes(),
            "{name} X's decodes in mixed steps vs HF: {st:?}"
        );
    }
}

#[test]
fn slots_export_import_and_copy_continue_exactly() {
    let Some(s) = stream() else { return };
    let dtypes = [StateDtype::F32, StateDtype::Bf16];
    for (name, dtype) in MODELS.iter().flat_map(|n| dtypes.map(|d| (*n, d))) {
        println!("-- {name}, {dtype} recurrent state");
        let f = Fixture::load(name);
        let mut model = gpu_model_with(&f, &s, StateDtypeRequest::Fixed(dtype));
        let (ids, prefix, steps, _) = f.decode_setup();
        let mut cache = model.new_cache(4, 64, PAGE).unwrap();
        let p = pages_of(0);
        step(
            &mut model,
            &mut cache,
            &[row(0, 0, &ids[..prefix], &p, RowLogits::Last)],
        );
        let parked = cache.export_slot(SlotId(0)).unwrap();
        // A snapshot holds the slot's bytes in the cache's dtype.
        assert_eq!(parked.state_dtype(), Some(dtype), "{name}");
        assert_eq!(parked.bytes(), model.slot_and_page_bytes(PAGE).0, "{name}");
        let rec = parked.recurrent_f32(0).unwrap();
        assert!(rec.iter().any(|&x| x != 0.0), "{name}: an empty state");
        if dtype == StateDtype::Bf16 {
            let is_bf16 = |x: f32| half::bf16::from_f32(x).to_f32() == x;
            assert!(rec.iter().all(|&x| is_bf16(x)), "{name}");
        }
        let continue_in = |model: &mut GpuModel, cache: &mut GpuCache, slot: u32| {
            (prefix..prefix + steps)
                .flat_map(|j| {
                    step(
                        model,
                        cache,
                        &[row(slot, j, &ids[j..j + 1], &p, RowLogits::Last)],
                    )
                })
                .collect::<Vec<_>>()
        };
        let original = continue_in(&mut model, &mut cache, 0);
        // Slot 0 moved on; slot 2 gets the parked state (the KV of the
        // prefix is still in the pages), slot 3 a device copy of it.
        cache.import_slot(SlotId(2), &parked).unwrap();
        assert_eq!(
            cache.export_slot(SlotId(2)).unwrap(),
            parked,
            "{name}: import then export"
        );
        cache.copy_slot(SlotId(2), SlotId(3)).unwrap();
        let imported = continue_in(&mut model, &mut cache, 2);
        assert_eq!(
            imported, original,
            "{name}: an imported slot continues differently"
        );
        let copied = continue_in(&mut model, &mut cache, 3);
        assert_eq!(
            copied, original,
            "{name}: a copied slot continues differently"
        );
        // Copies in the other direction (higher slot onto lower) too.
        cache.import_slot(SlotId(3), &parked).unwrap();
        cache.copy_slot(SlotId(3), SlotId(1)).unwrap();
        assert_eq!(
            cache.export_slot(SlotId(1)).unwrap(),
            parked,
            "{name}: copy 3 -> 1"
        );
        // A zeroed slot holds what a never-used slot holds; a used one not.
        let zero = model
            .new_cache(4, 64, PAGE)
            .unwrap()
            .export_slot(SlotId(0))
            .unwrap();
        assert_ne!(
            cache.export_slot(SlotId(1)).unwrap(),
            zero,
            "{name}: a used slot"
        );
        cache.zero_slot(SlotId(1)).unwrap();
        assert_eq!(
            cache.export_slot(SlotId(1)).unwrap(),
            zero,
            "{name}: zero_slot"
        );
        // Refusals: out-of-range slots, another model's state.
        assert!(cache.copy_slot(SlotId(4), SlotId(0)).is_err());
        assert!(cache.export_slot(SlotId(9)).is_err());
        let other_model = gpu_model_with(&f, &s, StateDtypeRequest::Fixed(dtype));
        let mut foreign = other_model.new_cache(4, 64, PAGE).unwrap();
        assert!(foreign.import_slot(SlotId(0), &parked).is_err());
    }
}

fn refused(model: &mut GpuModel, cache: &mut GpuCache, rows: &[Row]) -> String {
    match model.step(cache, rows, LogitsTo::Host) {
        Err(StepError::Refused(m)) => m,
        other => panic!("expected a refusal, got {:?}", other.map(|r| r.len())),
    }
}

#[test]
fn a_refused_step_changes_nothing() {
    let Some(s) = stream() else { return };
    let s = s.context().new_stream().unwrap();
    let f = Fixture::load(MODELS[0]);
    let mut model = gpu_model(&f, &s);
    let (ids, prefix, _, _) = f.decode_setup();
    let vocab = f.config.vocab_size as u32;
    let run = |model: &mut GpuModel, refuse_first: bool| {
        // 2 slots + padding slot 2; 32 pages + padding page 32.
        let mut cache = model.new_cache(3, 33, PAGE).unwrap();
        model
            .capture_decode_graphs(&mut cache, &[1, 2], 256, SlotId(2), PageId(32))
            .unwrap();
        let (p0, p1) = (pages_of(0), pages_of(1));
        step(
            model,
            &mut cache,
            &[row(0, 0, &ids[..prefix], &p0, RowLogits::Last)],
        );
        if refuse_first {
            let before = cache.export_slot(SlotId(0)).unwrap();
            let next = &ids[prefix..prefix + 1];
            let good = row(0, prefix, next, &p0, RowLogits::Last);
            let bad_token = [vocab];
            let m = refused(
                model,
                &mut cache,
                &[good, row(1, 0, &bad_token, &p1, RowLogits::Last)],
            );
            assert!(m.contains(&format!("token id {vocab}")), "{m}");
            let far = [PageId(40)];
            let m = refused(
                model,
                &mut cache,
                &[good, row(1, 0, &ids[..3], &far, RowLogits::Last)],
            );
            assert!(m.contains("page 40 is not a page"), "{m}");
            let m = refused(
                model,
                &mut cache,
                &[good, row(0, 0, &ids[..3], &p1, RowLogits::Last)],
            );
            assert!(m.contains("slot 0 appears twice"), "{m}");
            let m = refused(
                model,
                &mut cache,
                &[good, row(2, 0, &ids[..1], &p1, RowLogits::Last)],
            );
            assert!(m.contains("slot 2 is not a slot"), "{m}");
            let pad = [PageId(32)];
            let m = refused(
                model,
                &mut cache,
                &[good, row(1, 0, &ids[..1], &pad, RowLogits::Last)],
            );
            assert!(m.contains("page 32 is not a page"), "{m}");
            let m = refused(
                model,
                &mut cache,
                &[row(0, prefix, next, &p0[..1], RowLogits::Last)],
            );
            assert!(m.contains("has 1 pages"), "{m}");
            assert_eq!(cache.export_slot(SlotId(0)).unwrap(), before);
        }
        (prefix..prefix + 4)
            .flat_map(|j| {
                step(
                    model,
                    &mut cache,
                    &[row(0, j, &ids[j..j + 1], &p0, RowLogits::Last)],
                )
            })
            .collect::<Vec<_>>()
    };
    let clean = run(&mut model, false);
    let after_refusals = run(&mut model, true);
    assert_eq!(after_refusals, clean);
}
