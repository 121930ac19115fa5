//! CPU oracle of the gated delta rule (Gated DeltaNet) in recurrent form.
//!
//! This is the reference the GPU prefill kernels are checked against. It walks
//! every token of every sequence one by one, keeps the state in `f64` and only
//! rounds to `f32` when storing outputs and the final state.
//!
//! Per sequence `n` and value head `h` (query/key head `h / (Hv / Hqk)`), with
//! the state `S[v][k]` starting at `initial_state` (or zero), each token `t`
//! does:
//!
//! ```text
//! S        = alpha[t, h] * S
//! pred[v]  = sum_k S[v][k] * k_t[k]
//! d[v]     = beta[t, h] * (v_t[v] - pred[v])
//! S[v][k] += d[v] * k_t[k]
//! out[t, h, v] = scale * sum_k S[v][k] * q_t[k]
//! ```
//!
//! `q` and `k` are used as given (the caller has already L2-normalised them);
//! `alpha` is the linear decay `exp(g)`, `beta` the post-sigmoid write
//! strength. The state layout is `[N, Hv, D(v), D(k)]` with k contiguous, as in
//! FlashInfer.

use crate::shared::error::{invalid, GdnError, Op};

const OP: Op = Op::GdnReference;

/// Head dimension every backend supports.
pub const HEAD_DIM: usize = 128;

/// Shapes of one packed varlen GDN problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnGeometry {
    pub num_qk_heads: usize,
    pub num_v_heads: usize,
    pub head_dim: usize,
}

/// Inputs of one packed varlen GDN prefill.
pub struct ReferenceInputs<'a> {
    pub geometry: GdnGeometry,
    /// `[T, Hqk, D]` packed tokens.
    pub q: &'a [f32],
    /// `[T, Hqk, D]`.
    pub k: &'a [f32],
    /// `[T, Hv, D]`.
    pub v: &'a [f32],
    /// `[T, Hv]` linear decay `exp(g)` in (0, 1].
    pub alpha: &'a [f32],
    /// `[T, Hv]`.
    pub beta: &'a [f32],
    /// `[N + 1]`, starts at 0, non-decreasing, last == T; zero-length
    /// sequences allowed.
    pub cu_seqlens: &'a [usize],
    /// `[N, Hv, D(v), D(k)]`, k contiguous; `None` means a zero state.
    pub initial_state: Option<&'a [f32]>,
    pub scale: f32,
}

/// Outputs of [`gated_delta_rule_reference`].
pub struct ReferenceOutputs {
    /// `[T, Hv, D]`.
    pub output: Vec<f32>,
    /// `[N, Hv, D(v), D(k)]`, k contiguous.
    pub final_state: Vec<f32>,
}

fn checked_product(name: &'static str, dims: &[usize]) -> Result<usize, GdnError> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            invalid(
                OP,
                name,
                format!("element count overflows usize (dims {dims:?})"),
            )
        })
}

fn check_len(name: &'static str, actual: usize, dims: &[(&str, usize)]) -> Result<usize, GdnError> {
    let sizes: Vec<usize> = dims.iter().map(|&(_, d)| d).collect();
    let expected = checked_product(name, &sizes)?;
    if actual != expected {
        let shape = dims
            .iter()
            .map(|(label, d)| format!("{label}={d}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(invalid(
            OP,
            name,
            format!("expected {expected} elements ([{shape}]), got {actual}"),
        ));
    }
    Ok(expected)
}

fn validate_geometry(g: &GdnGeometry) -> Result<usize, GdnError> {
    for (arg, value) in [
        ("geometry.head_dim", g.head_dim),
        ("geometry.num_qk_heads", g.num_qk_heads),
        ("geometry.num_v_heads", g.num_v_heads),
    ] {
        if value == 0 {
            return Err(invalid(OP, arg, "expected > 0, got 0"));
        }
    }
    // Written without `%` / `is_multiple_of` (stable only from 1.87; MSRV 1.85).
    let ratio = g.num_v_heads / g.num_qk_heads;
    if ratio == 0 || ratio * g.num_qk_heads != g.num_v_heads {
        return Err(invalid(
            OP,
            "geometry.num_v_heads",
            format!(
                "expected a positive multiple of num_qk_heads={}, got {}",
                g.num_qk_heads, g.num_v_heads
            ),
        ));
    }
    Ok(ratio)
}

fn validate_cu_seqlens(cu: &[usize]) -> Result<(), GdnError> {
    const ARG: &str = "cu_seqlens";
    if cu.is_empty() {
        return Err(invalid(
            OP,
            ARG,
            "expected at least 1 element ([N+1]), got 0",
        ));
    }
    if cu[0] != 0 {
        return Err(invalid(
            OP,
            ARG,
            format!("entry 0: expected 0, got {}", cu[0]),
        ));
    }
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(
                OP,
                ARG,
                format!(
                    "entry {}: expected non-decreasing (>= entry {i} = {}), got {}",
                    i + 1,
                    w[0],
                    w[1]
                ),
            ));
        }
    }
    Ok(())
}

/// Runs the gated delta rule token by token on the CPU (f64 accumulation).
///
/// # Errors
///
/// An [`crate::ErrorKind::InvalidArgument`] of [`Op::GdnReference`] naming
/// the offending argument, the expected and the actual value when the
/// geometry is invalid, `cu_seqlens` is malformed, or a length does not match
/// the geometry and `cu_seqlens`.
pub fn gated_delta_rule_reference(inputs: &ReferenceInputs) -> Result<ReferenceOutputs, GdnError> {
    let g = inputs.geometry;
    let ratio = validate_geometry(&g)?;
    validate_cu_seqlens(inputs.cu_seqlens)?;

    let d = g.head_dim;
    let hqk = g.num_qk_heads;
    let hv = g.num_v_heads;
    let cu = inputs.cu_seqlens;
    let num_seqs = cu.len() - 1;
    let total = cu[num_seqs];

    check_len("q", inputs.q.len(), &[("T", total), ("Hqk", hqk), ("D", d)])?;
    check_len("k", inputs.k.len(), &[("T", total), ("Hqk", hqk), ("D", d)])?;
    let out_len = check_len("v", inputs.v.len(), &[("T", total), ("Hv", hv), ("D", d)])?;
    check_len("alpha", inputs.alpha.len(), &[("T", total), ("Hv", hv)])?;
    check_len("beta", inputs.beta.len(), &[("T", total), ("Hv", hv)])?;
    let state_dims = [("N", num_seqs), ("Hv", hv), ("D(v)", d), ("D(k)", d)];
    let state_len = checked_product(
        "final_state",
        &state_dims.iter().map(|&(_, x)| x).collect::<Vec<_>>(),
    )?;
    if let Some(init) = inputs.initial_state {
        check_len("initial_state", init.len(), &state_dims)?;
    }

    let scale = f64::from(inputs.scale);
    let mut output = vec![0f32; out_len];
    let mut final_state = vec![0f32; state_len];
    let mut state = vec![0f64; d * d];

    for seq in 0..num_seqs {
        let (start, end) = (cu[seq], cu[seq + 1]);
        for h in 0..hv {
            let qk_head = h / ratio;
            let slice = (seq * hv + h) * d * d..(seq * hv + h + 1) * d * d;
            match inputs.initial_state {
                Some(init) => {
                    for (dst, &src) in state.iter_mut().zip(&init[slice.clone()]) {
                        *dst = f64::from(src);
                    }
                }
                None => state.fill(0.0),
            }

            for t in start..end {
                let a = f64::from(inputs.alpha[t * hv + h]);
                let b = f64::from(inputs.beta[t * hv + h]);
                let qk_off = (t * hqk + qk_head) * d;
                let q_t = &inputs.q[qk_off..qk_off + d];
                let k_t = &inputs.k[qk_off..qk_off + d];
                let v_off = (t * hv + h) * d;
                let v_t = &inputs.v[v_off..v_off + d];
                let out_t = &mut output[v_off..v_off + d];

                // Rows of S (one per value index) evolve independently.
                for ((row, &v_val), out) in state.chunks_exact_mut(d).zip(v_t).zip(out_t) {
                    let mut pred = 0f64;
                    for (s, &kk) in row.iter_mut().zip(k_t) {
                        *s *= a;
                        pred += *s * f64::from(kk);
                    }
                    let delta = b * (f64::from(v_val) - pred);
                    let mut acc = 0f64;
                    for ((s, &kk), &qq) in row.iter_mut().zip(k_t).zip(q_t) {
                        *s += delta * f64::from(kk);
                        acc += *s * f64::from(qq);
                    }
                    *out = (scale * acc) as f32;
                }
            }

            for (dst, &src) in final_state[slice].iter_mut().zip(&state) {
                *dst = src as f32;
            }
        }
    }

    Ok(ReferenceOutputs {
        output,
        final_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(num_qk_heads: usize, num_v_heads: usize, head_dim: usize) -> GdnGeometry {
        GdnGeometry {
            num_qk_heads,
            num_v_heads,
            head_dim,
        }
    }

    fn assert_close(actual: &[f32], expected: &[f32], tol: f32, what: &str) {
        assert_eq!(actual.len(), expected.len(), "{what}: length");
        for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
            assert!(
                (a - e).abs() <= tol,
                "{what}[{i}]: got {a}, expected {e} (tol {tol})"
            );
        }
    }

    /// Deterministic pseudo-random values in [lo, hi).
    fn lcg_fill(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                lo + (hi - lo) * u as f32
            })
            .collect()
    }

    /// Random problem: q/k rows L2-normalised, alpha in (0.5, 1), beta in (0, 1).
    struct Problem {
        geometry: GdnGeometry,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        alpha: Vec<f32>,
        beta: Vec<f32>,
    }

    fn normalise_rows(x: &mut [f32], d: usize) {
        for row in x.chunks_exact_mut(d) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= n);
        }
    }

    fn random_problem(seed: u64, geometry: GdnGeometry, total: usize) -> Problem {
        let d = geometry.head_dim;
        let mut q = lcg_fill(seed, total * geometry.num_qk_heads * d, -1.0, 1.0);
        let mut k = lcg_fill(seed + 1, total * geometry.num_qk_heads * d, -1.0, 1.0);
        normalise_rows(&mut q, d);
        normalise_rows(&mut k, d);
        Problem {
            geometry,
            q,
            k,
            v: lcg_fill(seed + 2, total * geometry.num_v_heads * d, -1.0, 1.0),
            alpha: lcg_fill(seed + 3, total * geometry.num_v_heads, 0.5, 1.0),
            beta: lcg_fill(seed + 4, total * geometry.num_v_heads, 0.05, 1.0),
        }
    }

    impl Problem {
        fn inputs<'a>(
            &'a self,
            cu_seqlens: &'a [usize],
            initial_state: Option<&'a [f32]>,
            scale: f32,
        ) -> ReferenceInputs<'a> {
            ReferenceInputs {
                geometry: self.geometry,
                q: &self.q,
                k: &self.k,
                v: &self.v,
                alpha: &self.alpha,
                beta: &self.beta,
                cu_seqlens,
                initial_state,
                scale,
            }
        }
    }

    #[test]
    fn hand_worked_three_tokens() {
        // D = 2, one head, scale = 0.5, zero initial state.
        //
        // t0: q=[1,0] k=[1,0] v=[2,3] alpha=0.5 beta=1
        //   S = 0.5*0 = 0; pred = [0,0]; d = 1*([2,3]-0) = [2,3]
        //   S = [[2,0],[3,0]]; out = 0.5*[2,3] = [1, 1.5]
        // t1: q=[0,1] k=[0.6,0.8] v=[1,-1] alpha=0.5 beta=0.5
        //   S = [[1,0],[1.5,0]]; pred = [0.6, 0.9]
        //   d = 0.5*([1-0.6, -1-0.9]) = [0.2, -0.95]
        //   S[0] = [1,0] + 0.2*[0.6,0.8] = [1.12, 0.16]
        //   S[1] = [1.5,0] - 0.95*[0.6,0.8] = [0.93, -0.76]
        //   out = 0.5*[0.16, -0.76] = [0.08, -0.38]
        // t2: q=[0.6,0.8] k=[1,0] v=[0,0] alpha=1 beta=1
        //   S unchanged by decay; pred = [1.12, 0.93]; d = [-1.12, -0.93]
        //   S[0] = [0, 0.16]; S[1] = [0, -0.76]
        //   out = 0.5*[0.8*0.16, 0.8*(-0.76)] = [0.064, -0.304]
        // final state = [[0, 0.16], [0, -0.76]]
        let q = [1.0, 0.0, 0.0, 1.0, 0.6, 0.8];
        let k = [1.0, 0.0, 0.6, 0.8, 1.0, 0.0];
        let v = [2.0, 3.0, 1.0, -1.0, 0.0, 0.0];
        let alpha = [0.5, 0.5, 1.0];
        let beta = [1.0, 0.5, 1.0];
        let out = gated_delta_rule_reference(&ReferenceInputs {
            geometry: geo(1, 1, 2),
            q: &q,
            k: &k,
            v: &v,
            alpha: &alpha,
            beta: &beta,
            cu_seqlens: &[0, 3],
            initial_state: None,
            scale: 0.5,
        })
        .unwrap();
        assert_close(
            &out.output,
            &[1.0, 1.5, 0.08, -0.38, 0.064, -0.304],
            1e-6,
            "output",
        );
        assert_close(
            &out.final_state,
            &[0.0, 0.16, 0.0, -0.76],
            1e-6,
            "final_state",
        );
    }

    #[test]
    fn initial_state_is_decayed_and_read() {
        // D = 2, one head, one token, scale = 1.
        // S0 = [[1,2],[3,4]]; alpha = 0.5 -> S = [[0.5,1],[1.5,2]]
        // k = [1,0] -> pred = [0.5, 1.5]; v = [1,1], beta = 1 -> d = [0.5, -0.5]
        // S[0] = [0.5+0.5, 1] = [1,1]; S[1] = [1.5-0.5, 2] = [1,2]
        // q = [1,1] -> out = [2, 3]
        let inputs = |init: Option<&'static [f32]>| ReferenceInputs {
            geometry: geo(1, 1, 2),
            q: &[1.0, 1.0],
            k: &[1.0, 0.0],
            v: &[1.0, 1.0],
            alpha: &[0.5],
            beta: &[1.0],
            cu_seqlens: &[0, 1],
            initial_state: init,
            scale: 1.0,
        };
        let with = gated_delta_rule_reference(&inputs(Some(&[1.0, 2.0, 3.0, 4.0]))).unwrap();
        assert_close(&with.output, &[2.0, 3.0], 1e-6, "output with state");
        assert_close(
            &with.final_state,
            &[1.0, 1.0, 1.0, 2.0],
            1e-6,
            "final with state",
        );

        // Zero state: S = 0; pred = 0; d = [1,1]; S = [[1,0],[1,0]]; out = [1,1].
        let without = gated_delta_rule_reference(&inputs(None)).unwrap();
        assert_close(&without.output, &[1.0, 1.0], 1e-6, "output zero state");
        assert_close(
            &without.final_state,
            &[1.0, 0.0, 1.0, 0.0],
            1e-6,
            "final zero state",
        );
        // An explicit zero state equals None.
        let zeros = gated_delta_rule_reference(&inputs(Some(&[0.0; 4]))).unwrap();
        assert_eq!(zeros.output, without.output);
        assert_eq!(zeros.final_state, without.final_state);
    }

    /// Extracts value head `h` (and its qk head `qh`) into a one-head problem.
    fn single_head(p: &Problem, h: usize, qh: usize, total: usize) -> Problem {
        let d = p.geometry.head_dim;
        let (hqk, hv) = (p.geometry.num_qk_heads, p.geometry.num_v_heads);
        let pick = |x: &[f32], heads: usize, head: usize, width: usize| -> Vec<f32> {
            (0..total)
                .flat_map(|t| {
                    x[(t * heads + head) * width..(t * heads + head + 1) * width].to_vec()
                })
                .collect()
        };
        Problem {
            geometry: geo(1, 1, d),
            q: pick(&p.q, hqk, qh, d),
            k: pick(&p.k, hqk, qh, d),
            v: pick(&p.v, hv, h, d),
            alpha: pick(&p.alpha, hv, h, 1),
            beta: pick(&p.beta, hv, h, 1),
        }
    }

    fn check_gva(hqk: usize, hv: usize) {
        let d = 4;
        let total = 5;
        let p = random_problem(11 + hv as u64, geo(hqk, hv, d), total);
        let cu = [0, total];
        let init = lcg_fill(99, hv * d * d, -0.5, 0.5);
        let full = gated_delta_rule_reference(&p.inputs(&cu, Some(&init), 0.7)).unwrap();
        let r = hv / hqk;
        for h in 0..hv {
            let one = single_head(&p, h, h / r, total);
            let init_h = &init[h * d * d..(h + 1) * d * d];
            let got = gated_delta_rule_reference(&one.inputs(&cu, Some(init_h), 0.7)).unwrap();
            let out_h: Vec<f32> = (0..total)
                .flat_map(|t| full.output[(t * hv + h) * d..(t * hv + h + 1) * d].to_vec())
                .collect();
            assert_eq!(
                out_h, got.output,
                "output of v head {h} (Hqk={hqk}, Hv={hv})"
            );
            assert_eq!(
                &full.final_state[h * d * d..(h + 1) * d * d],
                &got.final_state[..],
                "state of v head {h}"
            );
            // A wrong mapping (another qk head) must give a different answer,
            // so this test can tell the mappings apart.
            if hqk > 1 {
                let wrong = single_head(&p, h, (h / r + 1) % hqk, total);
                let bad =
                    gated_delta_rule_reference(&wrong.inputs(&cu, Some(init_h), 0.7)).unwrap();
                assert_ne!(out_h, bad.output, "qk heads are indistinguishable");
            }
        }
    }

    #[test]
    fn gva_two_v_heads_share_one_qk_head() {
        check_gva(1, 2);
        // Same q/k, different v/alpha/beta: heads must still differ.
        let d = 4;
        let p = random_problem(5, geo(1, 2, d), 3);
        let out = gated_delta_rule_reference(&p.inputs(&[0, 3], None, 1.0)).unwrap();
        assert_ne!(&out.output[0..d], &out.output[d..2 * d]);
    }

    #[test]
    fn gva_ratio_three() {
        check_gva(2, 6);
        check_gva(1, 3);
    }

    #[test]
    fn gva_ratio_one_multi_head() {
        check_gva(3, 3);
    }

    #[test]
    fn continuation_equals_single_pass() {
        let d = 8;
        let g = geo(2, 4, d);
        let p = random_problem(21, g, 4);
        let init = lcg_fill(7, g.num_v_heads * d * d, -0.3, 0.3);
        let whole = gated_delta_rule_reference(&p.inputs(&[0, 4], Some(&init), 0.35)).unwrap();

        let split = |p: &Problem, lo: usize, hi: usize| -> Problem {
            let (hqk, hv) = (g.num_qk_heads, g.num_v_heads);
            Problem {
                geometry: g,
                q: p.q[lo * hqk * d..hi * hqk * d].to_vec(),
                k: p.k[lo * hqk * d..hi * hqk * d].to_vec(),
                v: p.v[lo * hv * d..hi * hv * d].to_vec(),
                alpha: p.alpha[lo * hv..hi * hv].to_vec(),
                beta: p.beta[lo * hv..hi * hv].to_vec(),
            }
        };
        let first = split(&p, 0, 2);
        let second = split(&p, 2, 4);
        let a = gated_delta_rule_reference(&first.inputs(&[0, 2], Some(&init), 0.35)).unwrap();
        let b = gated_delta_rule_reference(&second.inputs(&[0, 2], Some(&a.final_state), 0.35))
            .unwrap();
        let joined: Vec<f32> = a.output.iter().chain(&b.output).copied().collect();
        // The carried state is rounded to f32 between the halves.
        assert_close(&joined, &whole.output, 1e-6, "output");
        assert_close(&b.final_state, &whole.final_state, 1e-6, "final_state");
        // The second half must actually depend on the carried state.
        let cold = gated_delta_rule_reference(&second.inputs(&[0, 2], None, 0.35)).unwrap();
        assert!(cold
            .output
            .iter()
            .zip(&b.output)
            .any(|(x, y)| (x - y).abs() > 1e-3));
    }

    #[test]
    fn varlen_with_zero_length_sequence() {
        let d = 4;
        let g = geo(1, 2, d);
        let hv = g.num_v_heads;
        // Sequences: [0,2), [2,2) (empty), [2,5), [5,5) (empty).
        let cu = [0, 2, 2, 5, 5];
        let n = cu.len() - 1;
        let total = 5;
        let p = random_problem(31, g, total);
        let per = hv * d * d;
        let init = lcg_fill(41, n * per, -0.5, 0.5);
        let all = gated_delta_rule_reference(&p.inputs(&cu, Some(&init), 0.5)).unwrap();
        assert_eq!(all.output.len(), total * hv * d);
        assert_eq!(all.final_state.len(), n * per);

        // Empty sequences pass their initial state through unchanged.
        assert_eq!(&all.final_state[per..2 * per], &init[per..2 * per]);
        assert_eq!(&all.final_state[3 * per..4 * per], &init[3 * per..4 * per]);

        // Non-empty sequences equal independent runs (no state leaks across).
        for (seq, (lo, hi)) in [(0usize, (0usize, 2usize)), (2, (2, 5))] {
            let (hqk, len) = (g.num_qk_heads, hi - lo);
            let sub = Problem {
                geometry: g,
                q: p.q[lo * hqk * d..hi * hqk * d].to_vec(),
                k: p.k[lo * hqk * d..hi * hqk * d].to_vec(),
                v: p.v[lo * hv * d..hi * hv * d].to_vec(),
                alpha: p.alpha[lo * hv..hi * hv].to_vec(),
                beta: p.beta[lo * hv..hi * hv].to_vec(),
            };
            let init_s = &init[seq * per..(seq + 1) * per];
            let got =
                gated_delta_rule_reference(&sub.inputs(&[0, len], Some(init_s), 0.5)).unwrap();
            assert_eq!(
                &all.output[lo * hv * d..hi * hv * d],
                &got.output[..],
                "seq {seq}"
            );
            assert_eq!(
                &all.final_state[seq * per..(seq + 1) * per],
                &got.final_state[..]
            );
        }

        // With no initial state, the empty sequences end at exactly zero.
        let zero = gated_delta_rule_reference(&p.inputs(&cu, None, 0.5)).unwrap();
        assert!(zero.final_state[per..2 * per].iter().all(|&x| x == 0.0));
        assert!(zero.final_state[0..per].iter().any(|&x| x != 0.0));
    }

    #[test]
    fn empty_batch_and_all_empty() {
        let p = random_problem(1, geo(1, 1, 2), 0);
        let out = gated_delta_rule_reference(&p.inputs(&[0], None, 1.0)).unwrap();
        assert!(out.output.is_empty() && out.final_state.is_empty());
        let out = gated_delta_rule_reference(&p.inputs(&[0, 0, 0], None, 1.0)).unwrap();
        assert!(out.output.is_empty());
        assert_eq!(out.final_state, vec![0.0; 8]);
    }

    fn err_of(inputs: &ReferenceInputs) -> String {
        match gated_delta_rule_reference(inputs) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn error_messages_name_the_argument() {
        let g = geo(1, 2, 128);
        let p = random_problem(3, g, 3);
        let cu = [0usize, 3];

        let mut i = p.inputs(&cu, None, 1.0);
        i.q = &p.q[..383];
        assert_eq!(
            err_of(&i),
            "gdn_reference: q: expected 384 elements ([T=3, Hqk=1, D=128]), got 383"
        );

        let mut i = p.inputs(&cu, None, 1.0);
        i.k = &p.v;
        assert_eq!(
            err_of(&i),
            "gdn_reference: k: expected 384 elements ([T=3, Hqk=1, D=128]), got 768"
        );

        let mut i = p.inputs(&cu, None, 1.0);
        i.v = &p.q;
        assert_eq!(
            err_of(&i),
            "gdn_reference: v: expected 768 elements ([T=3, Hv=2, D=128]), got 384"
        );

        let mut i = p.inputs(&cu, None, 1.0);
        i.alpha = &p.alpha[..5];
        assert_eq!(
            err_of(&i),
            "gdn_reference: alpha: expected 6 elements ([T=3, Hv=2]), got 5"
        );

        let mut i = p.inputs(&cu, None, 1.0);
        i.beta = &p.alpha[..0];
        assert_eq!(
            err_of(&i),
            "gdn_reference: beta: expected 6 elements ([T=3, Hv=2]), got 0"
        );

        let bad_state = vec![0.0f32; 2 * 128 * 128 - 1];
        let i = p.inputs(&cu, Some(&bad_state), 1.0);
        assert_eq!(
            err_of(&i),
            "gdn_reference: initial_state: expected 32768 elements ([N=1, Hv=2, D(v)=128, D(k)=128]), got 32767"
        );

        // cu_seqlens whose last entry disagrees with the data length.
        let i = p.inputs(&[0, 2], None, 1.0);
        assert_eq!(
            err_of(&i),
            "gdn_reference: q: expected 256 elements ([T=2, Hqk=1, D=128]), got 384"
        );

        let i = p.inputs(&[], None, 1.0);
        assert!(err_of(&i).starts_with("gdn_reference: cu_seqlens: expected at least 1"));
        let i = p.inputs(&[1, 3], None, 1.0);
        assert_eq!(
            err_of(&i),
            "gdn_reference: cu_seqlens: entry 0: expected 0, got 1"
        );
        let i = p.inputs(&[0, 2, 1, 3], None, 1.0);
        assert_eq!(
            err_of(&i),
            "gdn_reference: cu_seqlens: entry 2: expected non-decreasing (>= entry 1 = 2), got 1"
        );

        for (hqk, hv) in [(2, 3), (2, 1), (0, 2), (1, 0)] {
            let mut i = p.inputs(&cu, None, 1.0);
            i.geometry = geo(hqk, hv, 128);
            let e = err_of(&i);
            assert!(
                e.starts_with("gdn_reference: geometry.num_"),
                "Hqk={hqk} Hv={hv}: {e}"
            );
        }
        let mut i = p.inputs(&cu, None, 1.0);
        i.geometry = geo(1, 2, 0);
        assert_eq!(
            err_of(&i),
            "gdn_reference: geometry.head_dim: expected > 0, got 0"
        );

        // The valid inputs themselves pass.
        assert!(gated_delta_rule_reference(&p.inputs(&cu, None, 1.0)).is_ok());
    }
}
