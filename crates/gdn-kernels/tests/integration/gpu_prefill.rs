//! GPU gates for the GDN prefill op. They skip (pass with a note) where there
//! is no GPU; `GDN_REQUIRE_GPU=1` turns a missing GPU into a failure. The one
//! command that runs them is in the README ("GPU tests"; `checks/gpu/device_run.sh tests`
//! on a machine without cargo).
//!
//! Every GPU result is compared with the f64 CPU oracle on the same bf16
//! inputs, with FlashInfer's own test tolerances (output atol = rtol = 1e-2,
//! state atol 5e-3 / rtol 1e-3), and every test asserts which backend ran.
//!
//! The C++ kernel with our value-dimension split (`flashinfer-vsplit`,
//! patches/0001) goes through the same cases in tests of its own (names with
//! `vsplit`), so a fault in it cannot take the shipped kernels' tests down:
//! run them alone with the filter `vsplit`, the others with `--skip vsplit`.

use gdn_kernels::{Backend, BackendRequest, ErrorKind, GdnError, GdnGeometry, GdnPrefill};
use gdn_kernels_testkit::{
    check_against_oracle as check, check_continuation, geometry, gpu_stream, Problem,
    ORACLE_LENGTHS as LENGTHS, QWEN35_GDN_HEADS as GEOMETRIES,
};
use std::sync::Arc;

use cudarc::driver::CudaStream;

type Stream = Arc<CudaStream>;

/// The shipped kernels these tests hold to the oracle.
const SHIPPED: [BackendRequest; 2] = [BackendRequest::FlashInfer, BackendRequest::Portable];
/// The value-split C++ kernel (never run before its first H200 call).
const VSPLIT: [BackendRequest; 1] = [BackendRequest::FlashInferVsplit];

#[test]
fn both_backends_match_the_oracle_over_lengths_ratios_and_initial_state() {
    let Some(stream) = gpu_stream() else { return };
    match_over_lengths_ratios_and_initial_state(&stream, &SHIPPED);
}

#[test]
fn flashinfer_vsplit_matches_the_oracle_over_lengths_ratios_and_initial_state() {
    let Some(stream) = gpu_stream() else { return };
    match_over_lengths_ratios_and_initial_state(&stream, &VSPLIT);
}

fn match_over_lengths_ratios_and_initial_state(stream: &Stream, requests: &[BackendRequest]) {
    for (hq, hv) in GEOMETRIES {
        let g = geometry(hq, hv);
        let mut ops: Vec<GdnPrefill> = requests
            .iter()
            .map(|&r| {
                let op = GdnPrefill::new(stream.clone(), g, r).expect("H200 is eligible");
                // Backend names parse as the requests that name them.
                assert_eq!(op.backend().to_string().parse::<BackendRequest>(), Ok(r));
                op
            })
            .collect();
        for t in LENGTHS {
            for init in [false, true] {
                let p =
                    Problem::random(1000 + t as u64 + hv as u64 * 7 + init as u64, g, &[t], init);
                let want = p.reference();
                let case = format!("Hqk/Hv={hq}/{hv} T={t} init={init}");
                for op in &mut ops {
                    let got = p.run_on(op, stream).unwrap();
                    check(&case, op.backend(), &got, &want);
                }
            }
        }
    }
}

#[test]
fn varlen_batches_with_mixed_lengths_match_the_oracle() {
    let Some(stream) = gpu_stream() else { return };
    varlen_batches_match(&stream, &SHIPPED);
}

#[test]
fn flashinfer_vsplit_varlen_batches_with_mixed_lengths_match_the_oracle() {
    let Some(stream) = gpu_stream() else { return };
    varlen_batches_match(&stream, &VSPLIT);
}

fn varlen_batches_match(stream: &Stream, requests: &[BackendRequest]) {
    let batches: [&[usize]; 3] = [
        &[1, 64, 65, 127, 2048, 2, 63],
        &[300, 17, 128],
        &[4096, 1, 1, 1],
    ];
    for (hq, hv) in GEOMETRIES {
        let g = geometry(hq, hv);
        for (i, lens) in batches.iter().enumerate() {
            for init in [false, true] {
                let p = Problem::random(
                    7000 + i as u64 * 13 + hv as u64 + init as u64,
                    g,
                    lens,
                    init,
                );
                let want = p.reference();
                let case = format!("Hv={hv} varlen {lens:?} init={init}");
                for &request in requests {
                    let mut op = GdnPrefill::new(stream.clone(), g, request).unwrap();
                    check(
                        &case,
                        op.backend(),
                        &p.run_on(&mut op, stream).unwrap(),
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn zero_length_sequences_run_on_portable_and_are_refused_by_flashinfer() {
    let Some(stream) = gpu_stream() else { return };
    let g = geometry(16, 32);
    let p = Problem::random(55, g, &[5, 0, 70, 0], true);
    let want = p.reference();
    let mut portable = GdnPrefill::new(stream.clone(), g, BackendRequest::Portable).unwrap();
    check(
        "zero-length sequences",
        Backend::Portable,
        &p.run_on(&mut portable, &stream).unwrap(),
        &want,
    );
    for request in [BackendRequest::FlashInfer, BackendRequest::FlashInferVsplit] {
        // Refused by the op before any launch: safe beside the shipped kernels.
        let mut fi = GdnPrefill::new(stream.clone(), g, request).unwrap();
        match p.run_on(&mut fi, &stream).map_err(GdnError::into_kind) {
            Err(ErrorKind::InvalidArgument {
                arg: "cu_seqlens",
                message,
            }) => assert!(message.contains("empty"), "{message}"),
            other => panic!("expected a cu_seqlens error, got {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn continuation_128_equals_64_plus_64_with_carried_state() {
    let Some(stream) = gpu_stream() else { return };
    continuation_carries_state(&stream, &SHIPPED);
}

#[test]
fn flashinfer_vsplit_continuation_128_equals_64_plus_64_with_carried_state() {
    let Some(stream) = gpu_stream() else { return };
    continuation_carries_state(&stream, &VSPLIT);
}

fn continuation_carries_state(stream: &Stream, requests: &[BackendRequest]) {
    for (hq, hv) in GEOMETRIES {
        let g = geometry(hq, hv);
        let whole = Problem::random(31 + hv as u64, g, &[128], true);
        for &request in requests {
            let mut op = GdnPrefill::new(stream.clone(), g, request).unwrap();
            let case = format!("continuation Hv={hv} 128 vs 64+64");
            check_continuation(&case, &mut op, stream, &whole, 64);
        }
    }
}

#[test]
fn flashinfer_is_bitwise_deterministic_run_to_run() {
    let Some(stream) = gpu_stream() else { return };
    bitwise_deterministic(&stream, BackendRequest::FlashInfer);
}

#[test]
fn flashinfer_vsplit_is_bitwise_deterministic_run_to_run() {
    let Some(stream) = gpu_stream() else { return };
    bitwise_deterministic(&stream, BackendRequest::FlashInferVsplit);
}

fn bitwise_deterministic(stream: &Stream, request: BackendRequest) {
    let g = geometry(16, 32);
    let p = Problem::random(99, g, &[2048, 1, 777, 64], true);
    let mut op = GdnPrefill::new(stream.clone(), g, request).unwrap();
    assert_eq!(op.decision().requested, request);
    let first = p.run_on(&mut op, stream).unwrap();
    for run in 1..5 {
        let again = p.run_on(&mut op, stream).unwrap();
        let same_out = first
            .0
            .iter()
            .zip(&again.0)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let same_state = first
            .1
            .iter()
            .zip(&again.1)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same_out && same_state,
            "{request:?}: run {run} differs bitwise from run 0"
        );
    }
}

#[test]
fn auto_dispatch_on_hopper_resolves_the_dsl_kernels_and_falls_back_for_unbuilt_ratios() {
    let Some(stream) = gpu_stream() else { return };
    let cc = stream.context().compute_capability().unwrap();
    for (hq, hv) in GEOMETRIES {
        let g = geometry(hq, hv);
        let mut op = GdnPrefill::new(stream.clone(), g, BackendRequest::Auto).unwrap();
        let expected = if cc == (9, 0) {
            Backend::CuteDslSm90
        } else {
            Backend::Portable
        };
        assert_eq!(op.backend(), expected, "{:?}", op.decision());
        if expected == Backend::CuteDslSm90 {
            // Per call: one long sequence goes context-parallel, a short one does not.
            for (lens, ran) in [
                (&[4100usize][..], Backend::CuteDslSm90Cp),
                (&[300][..], Backend::CuteDslSm90),
            ] {
                let p = Problem::random(9, g, lens, true);
                let got = p.run_on(&mut op, &stream).unwrap();
                assert_eq!(op.last_backend(), ran, "{lens:?}");
                check(
                    &format!("auto {hq}/{hv} {lens:?}"),
                    ran,
                    &got,
                    &p.reference(),
                );
            }
        }
    }
    // The C++ FlashInfer kernel stays available by explicit request.
    if cc == (9, 0) {
        let op =
            GdnPrefill::new(stream.clone(), geometry(16, 32), BackendRequest::FlashInfer).unwrap();
        assert_eq!(op.workspace_bytes(), 128 * stream.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as usize);
    }
    // Ratio 4 is not built into the bundle: Auto falls back, explicit FlashInfer is refused.
    let g = geometry(8, 32);
    let mut op = GdnPrefill::new(stream.clone(), g, BackendRequest::Auto).unwrap();
    assert_eq!(op.backend(), Backend::Portable);
    assert!(
        op.decision().reason.contains("ratio 4"),
        "{:?}",
        op.decision()
    );
    let p = Problem::random(4, g, &[65, 3], true);
    check(
        "ratio 4 via auto fallback",
        Backend::Portable,
        &p.run_on(&mut op, &stream).unwrap(),
        &p.reference(),
    );
    assert!(matches!(
        GdnPrefill::new(stream.clone(), g, BackendRequest::FlashInfer).map_err(GdnError::into_kind),
        Err(ErrorKind::Unsupported {
            backend: "flashinfer",
            ..
        })
    ));
    assert!(matches!(
        GdnPrefill::new(stream.clone(), g, BackendRequest::FlashInferVsplit)
            .map_err(GdnError::into_kind),
        Err(ErrorKind::Unsupported {
            backend: "flashinfer-vsplit",
            ..
        })
    ));
}

#[test]
fn bad_buffers_are_refused_before_any_launch() {
    let Some(stream) = gpu_stream() else { return };
    let g = geometry(16, 32);
    let mut op = GdnPrefill::new(stream.clone(), g, BackendRequest::Auto).unwrap();
    let mut p = Problem::random(5, g, &[10], false);
    p.v.pop();
    match p.run_on(&mut op, &stream).map_err(GdnError::into_kind) {
        Err(ErrorKind::InvalidArgument { arg: "v", message }) => {
            assert!(message.contains("T=10"), "{message}")
        }
        other => panic!("expected a v length error, got {:?}", other.map(|_| ())),
    }
    let mut p = Problem::random(5, g, &[10], false);
    p.cu_seqlens = vec![0, 6, 4, 10];
    assert!(matches!(
        p.run_on(&mut op, &stream).map_err(GdnError::into_kind),
        Err(ErrorKind::InvalidArgument {
            arg: "cu_seqlens",
            ..
        })
    ));
    let bad_dim = GdnGeometry { head_dim: 64, ..g };
    assert!(matches!(
        GdnPrefill::new(stream.clone(), bad_dim, BackendRequest::Auto).map_err(GdnError::into_kind),
        Err(ErrorKind::InvalidArgument { .. })
    ));
}
