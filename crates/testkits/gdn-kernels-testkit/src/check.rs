//! The oracle checks: FlashInfer's tolerances, the comparison of a GPU
//! result with the oracle's, and the continuation gate.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gdn_kernels::oracle::{GdnGeometry, ReferenceOutputs};
use gdn_kernels::{Backend, GdnPrefill, HEAD_DIM};

use crate::Problem;

/// FlashInfer's own test tolerances, `(atol, rtol)`, for the output and the
/// final state (the state's error comes from its fp16 intra-chunk inverse).
pub const OUTPUT_TOLERANCE: (f64, f64) = (1e-2, 1e-2);
pub const STATE_TOLERANCE: (f64, f64) = (5e-3, 1e-3);

/// Qwen3.5's GDN `(Hqk, Hv)`: 0.8B/2B (r=1), 4B/9B (r=2), 27B (r=3).
pub const QWEN35_GDN_HEADS: [(usize, usize); 3] = [(16, 16), (16, 32), (16, 48)];
/// Sequence lengths around the kernels' 64-token chunks, and one long one.
pub const ORACLE_LENGTHS: [usize; 8] = [1, 2, 63, 64, 65, 127, 128, 2048];

/// A head-dim-128 geometry.
pub fn geometry(num_qk_heads: usize, num_v_heads: usize) -> GdnGeometry {
    GdnGeometry {
        num_qk_heads,
        num_v_heads,
        head_dim: HEAD_DIM,
    }
}

/// Compares a GPU result `(output, final state)` with the oracle's under the
/// tolerances above, prints the errors, and fails on any unwritten,
/// non-finite or out-of-tolerance element.
pub fn check_against_oracle(
    case: &str,
    backend: Backend,
    got: &(Vec<f32>, Vec<f32>),
    want: &ReferenceOutputs,
) -> (Comparison, Comparison) {
    let out = compare(&got.0, &want.output, OUTPUT_TOLERANCE.0, OUTPUT_TOLERANCE.1);
    let state = compare(
        &got.1,
        &want.final_state,
        STATE_TOLERANCE.0,
        STATE_TOLERANCE.1,
    );
    println!(
        "{case:<44} {backend:<16} out max|e| {:.2e} rel {:.2e} | state max|e| {:.2e} rel {:.2e}",
        out.max_abs, out.rel_l2, state.max_abs, state.rel_l2
    );
    assert_eq!(
        out.non_finite + state.non_finite,
        0,
        "{case} {backend}: unwritten or non-finite elements"
    );
    assert_eq!(
        out.violations, 0,
        "{case} {backend}: output outside tolerance: {out:?}"
    );
    assert_eq!(
        state.violations, 0,
        "{case} {backend}: state outside tolerance: {state:?}"
    );
    (out, state)
}

/// Runs a single-sequence problem on `op` whole and as tokens `..at` then
/// `at..` with the state carried, checks both against the oracle and against
/// each other (the continuation gate every backend must pass).
pub fn check_continuation(
    case: &str,
    op: &mut GdnPrefill,
    stream: &Arc<CudaStream>,
    whole: &Problem,
    at: usize,
) {
    let want = whole.reference();
    let end = whole.total_tokens();
    let run = |p: &Problem, op: &mut GdnPrefill| p.run_on(op, stream).unwrap();
    let whole_result = run(whole, op);
    let first = run(
        &whole.token_range(
            0,
            at,
            whole.initial_state.clone().expect("an initial state"),
        ),
        op,
    );
    let second = run(&whole.token_range(at, end, first.1), op);
    let split = (first.0.into_iter().chain(second.0).collect(), second.1);
    let backend = op.backend();
    check_against_oracle(&format!("{case} (split)"), backend, &split, &want);
    check_against_oracle(&format!("{case} (whole)"), backend, &whole_result, &want);
    assert_results_agree(
        &format!("{case} {backend}: split vs whole"),
        &split,
        &whole_result,
    );
}

/// Fails unless two GPU results `(output, final state)` agree within the
/// oracle tolerances (a split run against the whole one).
pub fn assert_results_agree(case: &str, a: &(Vec<f32>, Vec<f32>), b: &(Vec<f32>, Vec<f32>)) {
    let o = compare(&a.0, &b.0, OUTPUT_TOLERANCE.0, OUTPUT_TOLERANCE.1);
    let s = compare(&a.1, &b.1, STATE_TOLERANCE.0, STATE_TOLERANCE.1);
    assert_eq!(
        (o.violations, s.violations),
        (0, 0),
        "{case}: results differ: {o:?} {s:?}"
    );
}

/// Error statistics of `got` against `want` under `|g - w| <= atol + rtol * |w|`.
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    pub max_abs: f64,
    pub rel_l2: f64,
    pub violations: usize,
    pub non_finite: usize,
}

pub fn compare(got: &[f32], want: &[f32], atol: f64, rtol: f64) -> Comparison {
    assert_eq!(got.len(), want.len(), "compare: lengths differ");
    let (mut max_abs, mut num, mut den, mut violations, mut non_finite) =
        (0f64, 0f64, 0f64, 0usize, 0usize);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g as f64, w as f64);
        if !g.is_finite() {
            non_finite += 1;
            continue;
        }
        let e = (g - w).abs();
        max_abs = max_abs.max(e);
        num += e * e;
        den += w * w;
        if e > atol + rtol * w.abs() {
            violations += 1;
        }
    }
    Comparison {
        max_abs,
        rel_l2: (num / den.max(f64::MIN_POSITIVE)).sqrt(),
        violations,
        non_finite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle over two `token_range` chunks with the state carried equals
    /// the oracle over the whole sequence (the chunks slice every input).
    #[test]
    fn token_ranges_continue_the_whole_sequence() {
        let whole = Problem::random(5, geometry(2, 4), &[40], true);
        let want = whole.reference();
        let a = whole.token_range(0, 17, whole.initial_state.clone().unwrap());
        let ra = a.reference();
        let b = whole.token_range(17, 40, ra.final_state.clone());
        let rb = b.reference();
        let out: Vec<f32> = ra.output.into_iter().chain(rb.output).collect();
        assert_results_agree(
            "oracle split",
            &(out, rb.final_state),
            &(want.output, want.final_state),
        );
    }
}
