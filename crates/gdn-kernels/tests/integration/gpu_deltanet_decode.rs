//! GPU gate of the fused DeltaNet decode op (`ModelOps::deltanet_decode_fused`):
//! several steps of batches of single tokens over random conv and recurrent
//! states in shuffled slots, at Qwen3.5's shapes (4B/9B: 16 q/k heads, 32
//! value heads; 27B: 48 value heads), small odd shapes (groups of 3, conv
//! kernels 2 and 9) and a batch that takes two launches, on every split
//! count the op picks, against an f64 reference of the DeltaNet decode math
//! written here from Hugging Face's Qwen3.5 (conv + SiLU, q/k L2 norm,
//! gates, delta rule, gated RMSNorm). Checks:
//! - the conv state advances exactly (it only moves bf16 inputs);
//! - the recurrent state and the output lie within a bound derived from
//!   f32 arithmetic and the bf16 rounding points (below);
//! - slots outside the batch are untouched, and bad input is refused.
//!
//! The same checks run over a bf16 state (`StateDtype::Bf16`: f32 math,
//! the state stored rounded to bf16), on the fused op and on the unfused
//! ops (conv, recurrent step, gated norm), whose numerics are the fused
//! op's. A bf16 state element passes when it lies in
//! [round(s - u), round(s + u)] (u its f32 distance, as for the outputs);
//! the outputs keep their bounds, since they read the f32 values before
//! the store rounds them. The copies that widen a bf16 state for the GDN
//! prefill and round its final state back are checked exactly.
//!
//! Skips without a GPU (`GDN_REQUIRE_GPU=1` makes that a failure).
//!
//! The bound: the reference rounds to bf16 where HF (and the kernel) store
//! bf16 (conv output, q, k, beta, o, the normalised o, its product with the
//! weight, the output). Each f32 result on the GPU lies within relative
//! `F32_REL` of the exact value of its inputs (dot products of at most 128
//! terms: 128 * 2^-24 of the sum of absolute terms, below 1e-5). The
//! reference carries, next to each value, how far the GPU's can be from it:
//! the f32 error plus what its inputs' distances propagate (first order);
//! at a bf16 rounding point the distance becomes the reach of the rounding
//! over that interval, which is zero unless the interval holds a rounding
//! boundary (then one bf16 step). An output element passes when the GPU's
//! value lies in [round(y - u), round(y + u)]; a state element when it lies
//! within its distance. The recurrent state of each step starts from the
//! GPU's state of the step before, so distances do not compound.

use gdn_kernels::{
    BatchLayout, DeltaNetInputs, DeltaNetShape, DeltaNetWeights, DeviceBatch, ModelOps,
    RecurrentState, StateDtype, HEAD_DIM,
};
use gdn_kernels_testkit::{gpu_stream, Rng};
use half::bf16;

const D: usize = HEAD_DIM;
const F32_REL: f64 = 1e-5;
const EPS: f32 = 1e-6;

fn round_bf16(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

/// `x` (an exact value, the GPU's within `u`) rounded to bf16, and how far
/// the GPU's rounded value can be from it.
fn rounded(x: f64, u: f64) -> (f64, f64) {
    let r = round_bf16(x);
    let reach = (round_bf16(x + u) - r)
        .abs()
        .max((round_bf16(x - u) - r).abs());
    (r, reach)
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One layer's weights on the host.
struct Weights {
    conv: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
}

/// What one sequence's step must produce, with the distance allowed.
struct Expected {
    /// `[taps][C]`, exact.
    conv_state: Vec<f64>,
    /// `[Hv, 128, 128]` and its distances.
    state: Vec<f64>,
    state_tol: Vec<f64>,
    /// `[Hv, 128]`: the output's bounds and the reference's own rounding
    /// (lo, hi, y) per element.
    out_bounds: Vec<(f64, f64, f64)>,
}

/// The DeltaNet decode of one token (`x`: the projection row, bf16) from
/// the conv state `conv` (`[taps][C]`) and recurrent state `s`.
fn reference(shape: DeltaNetShape, w: &Weights, x: &[f64], conv: &[f64], s: &[f64]) -> Expected {
    let (hk, hv, kw) = (shape.qk_heads, shape.v_heads, shape.conv_kernel);
    let (c_dim, taps) = (shape.conv_dim(), kw - 1);
    // Conv over the last `taps` inputs and the new one, SiLU, bf16.
    let mut mixed = vec![(0.0, 0.0); c_dim];
    for (c, m) in mixed.iter_mut().enumerate() {
        let inputs = (0..taps).map(|j| conv[j * c_dim + c]).chain([x[c]]);
        let terms: Vec<f64> = inputs
            .enumerate()
            .map(|(j, v)| w.conv[c * kw + j] as f64 * v)
            .collect();
        let acc: f64 = terms.iter().sum();
        let abs: f64 = terms.iter().map(|t| t.abs()).sum();
        let pre = silu(acc);
        *m = rounded(pre, F32_REL * (pre.abs() + abs));
    }
    // L2 norm of each q and k head (eps 1e-6 inside the root), bf16.
    let l2 = |head: &[(f64, f64)]| -> Vec<(f64, f64)> {
        let ss: f64 = head.iter().map(|(v, _)| v * v).sum::<f64>() + 1e-6;
        let r = 1.0 / ss.sqrt();
        let r_rel = head.iter().map(|(v, dv)| v.abs() * dv).sum::<f64>() / ss + F32_REL;
        head.iter()
            .map(|&(v, dv)| {
                let pre = v * r;
                rounded(pre, F32_REL * pre.abs() + dv * r + pre.abs() * r_rel)
            })
            .collect()
    };
    let q: Vec<Vec<(f64, f64)>> = (0..hk).map(|h| l2(&mixed[h * D..(h + 1) * D])).collect();
    let k: Vec<Vec<(f64, f64)>> = (0..hk)
        .map(|h| l2(&mixed[(hk + h) * D..(hk + h + 1) * D]))
        .collect();
    let (col_b, col_a, col_z) = (shape.col_b(), shape.col_a(), shape.col_z());
    let scale = (D as f64).powf(-0.5);
    let mut state = vec![0.0; hv * D * D];
    let mut state_tol = vec![0.0; hv * D * D];
    let mut out_bounds = Vec::with_capacity(hv * D);
    for h in 0..hv {
        let kh = h / (hv / hk);
        let (qh, kvec) = (&q[kh], &k[kh]);
        let v = &mixed[(2 * hk + h) * D..(2 * hk + h + 1) * D];
        let (beta, dbeta) = {
            let pre = sigmoid(x[col_b + h]);
            rounded(pre, F32_REL * pre)
        };
        let alpha =
            (-(w.a_log[h] as f64).exp() * softplus(x[col_a + h] + w.dt_bias[h] as f64)).exp();
        let dalpha = F32_REL * alpha;
        let mut o = vec![(0.0, 0.0); D];
        for (row, o_row) in o.iter_mut().enumerate() {
            let s_row = &s[(h * D + row) * D..(h * D + row + 1) * D];
            let pred: f64 = (0..D).map(|i| alpha * s_row[i] * kvec[i].0).sum();
            let abs_sk: f64 = (0..D).map(|i| (s_row[i] * kvec[i].0).abs()).sum();
            let dpred = (0..D)
                .map(|i| alpha * s_row[i].abs() * kvec[i].1)
                .sum::<f64>()
                + (dalpha + F32_REL * alpha) * abs_sk;
            let (vr, dv) = v[row];
            let d = beta * (vr - pred);
            let dd = dbeta * (vr - pred).abs() + beta * (dv + dpred) + F32_REL * d.abs();
            let base = (h * D + row) * D;
            for i in 0..D {
                let new = alpha * s_row[i] + d * kvec[i].0;
                state[base + i] = new;
                state_tol[base + i] = F32_REL * (alpha * s_row[i].abs() + (d * kvec[i].0).abs())
                    + dalpha * s_row[i].abs()
                    + d.abs() * kvec[i].1
                    + dd * kvec[i].0.abs();
            }
            let new_row = &state[base..base + D];
            let tol_row = &state_tol[base..base + D];
            let pre = scale * (0..D).map(|i| new_row[i] * qh[i].0).sum::<f64>();
            let u = scale
                * (0..D)
                    .map(|i| {
                        F32_REL * (new_row[i] * qh[i].0).abs()
                            + tol_row[i] * qh[i].0.abs()
                            + new_row[i].abs() * qh[i].1
                    })
                    .sum::<f64>();
            *o_row = rounded(pre, u);
        }
        // Gated RMSNorm: bf16(bf16(w * bf16(o / rms(o))) * silu(z)).
        let ms = o.iter().map(|(v, _)| v * v).sum::<f64>() / D as f64 + EPS as f64;
        let rinv = 1.0 / ms.sqrt();
        let rinv_rel =
            o.iter().map(|(v, dv)| v.abs() * dv).sum::<f64>() / (D as f64 * ms) + F32_REL;
        for (c, &(ov, dov)) in o.iter().enumerate() {
            let n1 = ov * rinv;
            let (n1, dn1) = rounded(n1, F32_REL * n1.abs() + dov * rinv + n1.abs() * rinv_rel);
            let wc = w.norm[c] as f64;
            let n2 = wc * n1;
            let (n2, dn2) = rounded(n2, F32_REL * n2.abs() + wc.abs() * dn1);
            let gate = silu(x[col_z + h * D + c]);
            let y = n2 * gate;
            let u = F32_REL * y.abs() + dn2 * gate.abs();
            out_bounds.push((round_bf16(y - u), round_bf16(y + u), round_bf16(y)));
        }
    }
    // The conv state: the last `taps` inputs, oldest first.
    let mut conv_state = vec![0.0; taps * c_dim];
    for j in 0..taps {
        for c in 0..c_dim {
            conv_state[j * c_dim + c] = if j + 1 < taps {
                conv[(j + 1) * c_dim + c]
            } else {
                x[c]
            };
        }
    }
    Expected {
        conv_state,
        state,
        state_tol,
        out_bounds,
    }
}

/// One sequence's step as the reference sees it: the projection row and
/// the states before the step.
struct StepInputs<'a> {
    x: &'a [f64],
    conv: &'a [f64],
    state: &'a [f64],
}

/// What the GPU left for one sequence after a step.
struct Got {
    conv_state: Vec<f64>,
    state: Vec<f32>,
    out: Vec<f64>,
}

/// How close the results came to their bounds.
#[derive(Default)]
struct Stats {
    /// Largest state error as a fraction of its allowance.
    worst_state: f64,
    outputs: usize,
    /// Outputs equal to the reference's own rounding.
    equal: usize,
    /// Outputs whose bound allowed more than one value.
    ambiguous: usize,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state within {:.3} of its bound at worst; {} of {} outputs equal the reference's rounding ({} with a bound of more than one value)",
            self.worst_state, self.equal, self.outputs, self.ambiguous
        )
    }
}

/// Asserts one sequence's step against the reference, the state stored in
/// `dtype`; returns the reference's conv state after it.
fn check_step(
    shape: DeltaNetShape,
    weights: &Weights,
    step: StepInputs,
    got: &Got,
    dtype: StateDtype,
    what: &str,
    stats: &mut Stats,
) -> Vec<f64> {
    let want = reference(shape, weights, step.x, step.conv, step.state);
    assert_eq!(got.conv_state, want.conv_state, "{what}: conv state");
    for (i, &g) in got.state.iter().enumerate() {
        let tol = want.state_tol[i];
        if dtype == StateDtype::Bf16 {
            let (lo, hi) = (
                round_bf16(want.state[i] - tol),
                round_bf16(want.state[i] + tol),
            );
            assert!(
                (lo..=hi).contains(&(g as f64)),
                "{what}: bf16 state [{}, {}, {}]: got {g}, want within [{lo}, {hi}] (exact {})",
                i / (D * D),
                i / D % D,
                i % D,
                want.state[i]
            );
            continue;
        }
        let err = (g as f64 - want.state[i]).abs();
        assert!(
            err <= tol,
            "{what}: state [{}, {}, {}]: got {g}, want {} +- {tol:.3e}",
            i / (D * D),
            i / D % D,
            i % D,
            want.state[i]
        );
        if tol > 0.0 {
            stats.worst_state = stats.worst_state.max(err / tol);
        }
    }
    for (e, (&g, &(lo, hi, y))) in got.out.iter().zip(&want.out_bounds).enumerate() {
        assert!(
            (lo..=hi).contains(&g),
            "{what}: out [{}, {}]: got {g}, want within [{lo}, {hi}] (reference {y})",
            e / D,
            e % D
        );
        stats.outputs += 1;
        stats.equal += (g == y) as usize;
        stats.ambiguous += (lo != hi) as usize;
    }
    want.conv_state
}

/// Which ops run the decode step.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Fused,
    /// deltanet_conv, deltanet_decode, deltanet_out_norm.
    Unfused,
}

struct Case {
    shape: DeltaNetShape,
    dtype: StateDtype,
    path: Path,
    seqs: usize,
    steps: usize,
    /// Sequences whose results are compared (all when empty).
    check: Vec<usize>,
}

fn bf16s(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Runs `case`, asserting every check on the compared sequences; returns
/// the split count the op used.
fn run_case(ops: &ModelOps, case: &Case, seed: u64) -> usize {
    let stream = ops.stream();
    let shape = case.shape;
    let (n, hv) = (case.seqs, shape.v_heads);
    let (conv_len, state_len, ld) = (
        shape.conv_state_len(),
        shape.recurrent_state_len(),
        shape.proj_width(),
    );
    let mut rng = Rng::new(seed);
    // Slots: the sequences in reverse order with two bystanders (slot 0 and
    // the last) that the step must not touch.
    let slots: Vec<usize> = (0..n).map(|s| n - s).collect();
    let num_slots = n + 2;
    let check: Vec<usize> = if case.check.is_empty() {
        (0..n).collect()
    } else {
        case.check.clone()
    };
    let weights = Weights {
        conv: (0..shape.conv_dim() * shape.conv_kernel)
            .map(|_| rng.uniform(-0.6, 0.6))
            .collect(),
        a_log: (0..hv).map(|_| rng.uniform(-1.5, 1.0)).collect(),
        dt_bias: (0..hv).map(|_| rng.uniform(-1.0, 1.0)).collect(),
        norm: (0..D).map(|_| rng.uniform(0.5, 1.5)).collect(),
    };
    let up = |v: &[f32]| stream.clone_htod(v).unwrap();
    let (conv_w, a_log, dt_bias, norm) = (
        up(&weights.conv),
        up(&weights.a_log),
        up(&weights.dt_bias),
        up(&weights.norm),
    );
    // Random states, filled on the device (the two-launch case holds GBs).
    let mut conv_state = stream.alloc_zeros::<bf16>(num_slots * conv_len).unwrap();
    let mut state_f32 = stream.alloc_zeros::<f32>(num_slots * state_len).unwrap();
    ops.fill_uniform_bf16(&mut conv_state, seed, 2.0, 0.0)
        .unwrap();
    ops.fill_uniform_f32(&mut state_f32, seed + 1, 0.5, 0.0)
        .unwrap();
    let mut state = match case.dtype {
        StateDtype::F32 => RecurrentState::F32(state_f32),
        StateDtype::Bf16 => {
            let host = stream.clone_dtoh(&state_f32).unwrap();
            RecurrentState::from_f32(stream, StateDtype::Bf16, &host).unwrap()
        }
    };
    let slot_of = |buf_len: usize, slot: usize| slot * buf_len..(slot + 1) * buf_len;
    let get_conv = |cs: &cudarc::driver::CudaSlice<bf16>, slot: usize| {
        bf16s(
            &stream
                .clone_dtoh(&cs.slice(slot_of(conv_len, slot)))
                .unwrap(),
        )
    };
    let get_state = |st: &RecurrentState, slot: usize| -> Vec<f32> {
        st.to_host(stream, slot_of(state_len, slot))
            .unwrap()
            .to_f32()
    };
    let bystanders = [0, num_slots - 1];
    let bystander_before: Vec<(Vec<f64>, Vec<f32>)> = bystanders
        .iter()
        .map(|&b| (get_conv(&conv_state, b), get_state(&state, b)))
        .collect();
    let mut ref_conv: Vec<Vec<f64>> = check
        .iter()
        .map(|&s| get_conv(&conv_state, slots[s]))
        .collect();
    let layout = BatchLayout {
        tokens: vec![0; n],
        cu_seqlens: (0..=n as i32).collect(),
        start_positions: vec![7; n],
        slots: slots.iter().map(|&s| s as i32).collect(),
        block_table: (0..n as i32).collect(),
        max_blocks: 1,
        page_size: 16,
        padding: None,
    };
    let batch = DeviceBatch::upload(stream, &layout).unwrap();
    let splits = ops.deltanet_decode_splits(n, shape);
    let scale = (D as f32).powf(-0.5);
    let mut stats = Stats::default();
    for step in 0..case.steps {
        let proj_host: Vec<bf16> = (0..n * ld)
            .map(|i| {
                // a and b columns and z: gates over their useful range.
                let x = if i % ld >= shape.col_z() { 3.0 } else { 2.0 };
                bf16::from_f32(rng.uniform(-x, x))
            })
            .collect();
        let proj = stream.clone_htod(&proj_host).unwrap();
        let before: Vec<Vec<f64>> = check
            .iter()
            .map(|&s| {
                get_state(&state, slots[s])
                    .iter()
                    .map(|&v| v as f64)
                    .collect()
            })
            .collect();
        let mut out = stream.alloc_zeros::<bf16>(n * hv * D).unwrap();
        let w = DeltaNetWeights {
            conv: &conv_w,
            a_log: &a_log,
            dt_bias: &dt_bias,
            norm: &norm,
        };
        match case.path {
            Path::Fused => ops
                .deltanet_decode_fused(
                    &batch,
                    shape,
                    &proj,
                    w,
                    &mut conv_state,
                    &mut state,
                    &mut out,
                    scale,
                    EPS,
                )
                .unwrap(),
            Path::Unfused => {
                let hk = shape.qk_heads;
                let mut inputs = DeltaNetInputs {
                    q: stream.alloc_zeros(n * hk * D).unwrap(),
                    k: stream.alloc_zeros(n * hk * D).unwrap(),
                    v: stream.alloc_zeros(n * hv * D).unwrap(),
                    alpha: stream.alloc_zeros(n * hv).unwrap(),
                    beta: stream.alloc_zeros(n * hv).unwrap(),
                };
                let (cw, al, dt) = (&conv_w, &a_log, &dt_bias);
                let cs = &mut conv_state;
                ops.deltanet_conv(&batch, shape, &proj, cw, al, dt, cs, &mut inputs)
                    .unwrap();
                let mut core = stream.alloc_zeros::<bf16>(n * hv * D).unwrap();
                ops.deltanet_decode(&batch, shape, &inputs, &mut state, &mut core, scale)
                    .unwrap();
                ops.deltanet_out_norm(shape, &core, &proj, &norm, &mut out, EPS)
                    .unwrap();
            }
        }
        let got_out = stream.clone_dtoh(&out).unwrap();
        for (ci, &s) in check.iter().enumerate() {
            let x = bf16s(&proj_host[s * ld..(s + 1) * ld]);
            let got = Got {
                conv_state: get_conv(&conv_state, slots[s]),
                state: get_state(&state, slots[s]),
                out: bf16s(&got_out[s * hv * D..(s + 1) * hv * D]),
            };
            let what = format!("{shape:?} n {n} step {step} seq {s}");
            let step_in = StepInputs {
                x: &x,
                conv: &ref_conv[ci],
                state: &before[ci],
            };
            let (dtype, stats) = (case.dtype, &mut stats);
            ref_conv[ci] = check_step(shape, &weights, step_in, &got, dtype, &what, stats);
        }
    }
    for (&b, before) in bystanders.iter().zip(&bystander_before) {
        assert_eq!(
            get_conv(&conv_state, b),
            before.0,
            "bystander slot {b}: conv state"
        );
        assert!(
            get_state(&state, b) == before.1,
            "bystander slot {b}: recurrent state"
        );
    }
    println!(
        "{shape:?} {:?} {} state, n {n} ({splits} splits), {} steps: {stats}",
        case.path, case.dtype, case.steps
    );
    splits
}

fn shape(qk_heads: usize, v_heads: usize, conv_kernel: usize) -> DeltaNetShape {
    DeltaNetShape {
        qk_heads,
        v_heads,
        conv_kernel,
    }
}

#[test]
fn fused_decode_matches_the_f64_reference_on_every_split_count() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream).unwrap();
    let qwen_4b = shape(16, 32, 4);
    // The smallest batch taking each split count on this GPU, and batch 3.
    let mut sizes: Vec<usize> = [4usize, 2, 1]
        .iter()
        .filter_map(|&s| (1..=512).find(|&n| ops.deltanet_decode_splits(n, qwen_4b) == s))
        .collect();
    sizes.push(3);
    let mut used = vec![];
    for (i, &n) in sizes.iter().enumerate() {
        for dtype in [StateDtype::F32, StateDtype::Bf16] {
            let case = Case {
                shape: qwen_4b,
                dtype,
                path: Path::Fused,
                seqs: n,
                steps: 3,
                check: vec![],
            };
            used.push(run_case(&ops, &case, 40 + i as u64));
        }
    }
    used.sort();
    used.dedup();
    assert_eq!(
        used,
        vec![1, 2, 4],
        "batches {sizes:?} cover every split count"
    );
}

#[test]
fn fused_decode_matches_the_f64_reference_at_other_shapes() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream).unwrap();
    // 27B (48 value heads, groups of 3), then groups of 3 with the shortest
    // and the longest conv kernels the op takes.
    for (i, (sh, n)) in [
        (shape(16, 48, 4), 2),
        (shape(16, 48, 4), 24),
        (shape(2, 6, 2), 5),
        (shape(1, 3, 9), 2),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in [StateDtype::F32, StateDtype::Bf16] {
            let case = Case {
                shape: sh,
                dtype,
                path: Path::Fused,
                seqs: n,
                steps: 3,
                check: vec![],
            };
            run_case(&ops, &case, 60 + i as u64);
        }
    }
}

#[test]
fn fused_decode_across_two_launches_matches_the_reference() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream).unwrap();
    // 128 q/k heads: a launch covers 65536 / 128 = 512 sequences, so 513
    // take two; the sequences at both ends of each launch are compared.
    let case = Case {
        shape: shape(128, 128, 4),
        dtype: StateDtype::F32,
        path: Path::Fused,
        seqs: 513,
        steps: 2,
        check: vec![0, 1, 511, 512],
    };
    run_case(&ops, &case, 80);
}

#[test]
fn unfused_decode_step_matches_the_f64_reference_on_both_state_dtypes() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream).unwrap();
    for (i, (sh, n)) in [
        (shape(16, 32, 4), 3),
        (shape(16, 48, 4), 9),
        (shape(2, 6, 2), 5),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in [StateDtype::F32, StateDtype::Bf16] {
            let case = Case {
                shape: sh,
                dtype,
                path: Path::Unfused,
                seqs: n,
                steps: 3,
                check: vec![],
            };
            run_case(&ops, &case, 90 + i as u64);
        }
    }
}

/// The GDN prefill's state copies over a bf16 pool: slots widened exactly
/// into the packed f32 batch, and the packed f32 state rounded to nearest-
/// even bf16 into the slots (ties included), other slots untouched.
#[test]
fn bf16_state_widens_and_narrows_around_the_prefill() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream.clone()).unwrap();
    let per = 3 * 1024 + 5; // more than one block of 1024 a row
    let slots = [3i32, 0];
    let num_slots = 4;
    let mut rng = Rng::new(7);
    let pool_host: Vec<f32> = (0..num_slots * per)
        .map(|_| rng.uniform(-4.0, 4.0))
        .collect();
    let mut pool = RecurrentState::from_f32(&stream, StateDtype::Bf16, &pool_host).unwrap();
    let pool_before = pool.to_host(&stream, 0..num_slots * per).unwrap().to_f32();
    let layout = BatchLayout {
        tokens: vec![0; 2],
        cu_seqlens: vec![0, 1, 2],
        start_positions: vec![0; 2],
        slots: slots.to_vec(),
        block_table: vec![0, 1],
        max_blocks: 1,
        page_size: 16,
        padding: None,
    };
    let batch = DeviceBatch::upload(&stream, &layout).unwrap();
    let mut packed = stream.alloc_zeros::<f32>(2 * per).unwrap();
    ops.move_state(&batch, &mut pool, &mut packed, per, true)
        .unwrap();
    let widened = stream.clone_dtoh(&packed).unwrap();
    for (n, &slot) in slots.iter().enumerate() {
        let want = &pool_before[slot as usize * per..(slot as usize + 1) * per];
        assert!(
            widened[n * per..(n + 1) * per] == *want,
            "slot {slot} widened"
        );
    }
    // Final states with ties (odd multiples of half a bf16 step) and values
    // between, as the prefill would leave them.
    let last: Vec<f32> = (0..2 * per)
        .map(|i| match i % 3 {
            0 => 1.0 + 2f32.powi(-8),
            1 => -(1.0 + 3.0 * 2f32.powi(-8)),
            _ => rng.uniform(-4.0, 4.0),
        })
        .collect();
    stream.memcpy_htod(&last, &mut packed).unwrap();
    ops.move_state(&batch, &mut pool, &mut packed, per, false)
        .unwrap();
    let after = pool.to_host(&stream, 0..num_slots * per).unwrap().to_f32();
    for slot in 0..num_slots {
        let got = &after[slot * per..(slot + 1) * per];
        match slots.iter().position(|&s| s as usize == slot) {
            Some(n) => {
                for (e, (&g, &x)) in got.iter().zip(&last[n * per..(n + 1) * per]).enumerate() {
                    assert_eq!(
                        g,
                        bf16::from_f32(x).to_f32(),
                        "slot {slot} [{e}]: {x} narrowed"
                    );
                }
            }
            None => assert!(
                got == &pool_before[slot * per..(slot + 1) * per],
                "bystander {slot}"
            ),
        }
    }
}

#[test]
fn fused_decode_refuses_bad_input_before_touching_state() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let ops = ModelOps::new(stream.clone()).unwrap();
    let sh = shape(2, 4, 4);
    let (ld, n) = (sh.proj_width(), 2);
    let f = |len: usize| stream.alloc_zeros::<f32>(len).unwrap();
    let (conv_w, a_log, dt_bias, norm) = (f(sh.conv_dim() * 4), f(4), f(4), f(D));
    let w = DeltaNetWeights {
        conv: &conv_w,
        a_log: &a_log,
        dt_bias: &dt_bias,
        norm: &norm,
    };
    let mut conv_state = stream.alloc_zeros::<bf16>(3 * sh.conv_state_len()).unwrap();
    let mut state_f32 = stream
        .alloc_zeros::<f32>(3 * sh.recurrent_state_len())
        .unwrap();
    ops.fill_uniform_f32(&mut state_f32, 5, 1.0, 0.0).unwrap();
    let state_before = stream.clone_dtoh(&state_f32).unwrap();
    let mut state = RecurrentState::F32(state_f32);
    let layout = |lens: &[i32], slots: &[i32]| BatchLayout {
        tokens: vec![0; lens.iter().sum::<i32>() as usize],
        cu_seqlens: std::iter::once(0)
            .chain(lens.iter().scan(0, |a, l| {
                *a += l;
                Some(*a)
            }))
            .collect(),
        start_positions: vec![0; lens.len()],
        slots: slots.to_vec(),
        block_table: (0..lens.len() as i32).collect(),
        max_blocks: 1,
        page_size: 16,
        padding: None,
    };
    let run = |batch: &DeviceBatch, proj_len: usize, out_len: usize, cs: &mut _, st: &mut _| {
        let proj = stream.alloc_zeros::<bf16>(proj_len).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(out_len).unwrap();
        ops.deltanet_decode_fused(batch, sh, &proj, w, cs, st, &mut out, 0.1, EPS)
            .unwrap_err()
            .to_string()
    };
    let good = DeviceBatch::upload(&stream, &layout(&[1, 1], &[0, 1])).unwrap();
    let two_tokens = DeviceBatch::upload(&stream, &layout(&[2, 1], &[0, 1])).unwrap();
    let far_slot = DeviceBatch::upload(&stream, &layout(&[1, 1], &[0, 3])).unwrap();
    let out_len = n * 4 * D;
    let cases = [
        (
            run(&two_tokens, 3 * ld, 3 * 4 * D, &mut conv_state, &mut state),
            "one token per sequence",
        ),
        (
            run(&good, n * ld + 1, out_len, &mut conv_state, &mut state),
            "proj",
        ),
        (
            run(&good, n * ld, out_len - 1, &mut conv_state, &mut state),
            "out",
        ),
        (
            run(&far_slot, n * ld, out_len, &mut conv_state, &mut state),
            "conv_state",
        ),
    ];
    for (err, what) in cases {
        assert!(err.contains(what), "expected a {what} error, got: {err}");
    }
    let all = 0..state.len();
    assert!(state.to_host(&stream, all).unwrap().to_f32() == state_before);
}

/// The reference and its bounds, checked themselves: the fused kernel's
/// source run on the CPU (checks/deltanet_decode_emulation, host f32
/// arithmetic without FMA, which the bounds must also admit) must pass the
/// same checks as the GPU. `DUMP=$PWD/target/deltanet.bin
/// checks/deltanet_decode_emulation/run.sh`, then this test with
/// `DELTANET_EMULATION_DUMP` naming that file and `--ignored`.
#[test]
#[ignore = "needs the emulation's dump (DELTANET_EMULATION_DUMP)"]
fn emulated_kernel_passes_the_reference_checks() {
    let path = std::env::var("DELTANET_EMULATION_DUMP").expect("DELTANET_EMULATION_DUMP");
    let bytes = std::fs::read(&path).unwrap();
    let mut words = bytes
        .chunks_exact(4)
        .map(|c| <[u8; 4]>::try_from(c).unwrap());
    fn take(words: &mut impl Iterator<Item = [u8; 4]>, n: usize) -> Vec<[u8; 4]> {
        let v: Vec<[u8; 4]> = words.take(n).collect();
        assert_eq!(v.len(), n, "the dump ends early");
        v
    }
    let floats = |w: Vec<[u8; 4]>| -> Vec<f32> { w.into_iter().map(f32::from_le_bytes).collect() };
    let mut cases = 0;
    while words.len() > 0 {
        let head: Vec<usize> = take(&mut words, 5)
            .into_iter()
            .map(|w| u32::from_le_bytes(w) as usize)
            .collect();
        let (sh, n, steps) = (shape(head[0], head[1], head[2]), head[3], head[4]);
        let slots: Vec<usize> = take(&mut words, n)
            .into_iter()
            .map(|w| i32::from_le_bytes(w) as usize)
            .collect();
        let weights = Weights {
            conv: floats(take(&mut words, sh.conv_dim() * sh.conv_kernel)),
            a_log: floats(take(&mut words, sh.v_heads)),
            dt_bias: floats(take(&mut words, sh.v_heads)),
            norm: floats(take(&mut words, D)),
        };
        let num_slots = n + 2;
        let (cl, sl, ld) = (
            sh.conv_state_len(),
            sh.recurrent_state_len(),
            sh.proj_width(),
        );
        let to64 = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
        let mut stats = Stats::default();
        for step in 0..steps {
            let proj = floats(take(&mut words, n * ld));
            let conv_before = floats(take(&mut words, num_slots * cl));
            let state_before = floats(take(&mut words, num_slots * sl));
            let out = floats(take(&mut words, n * sh.v_heads * D));
            let conv_after = floats(take(&mut words, num_slots * cl));
            let state_after = floats(take(&mut words, num_slots * sl));
            for (s, &slot) in slots.iter().enumerate() {
                let got = Got {
                    conv_state: to64(&conv_after[slot * cl..(slot + 1) * cl]),
                    state: state_after[slot * sl..(slot + 1) * sl].to_vec(),
                    out: to64(&out[s * sh.v_heads * D..(s + 1) * sh.v_heads * D]),
                };
                let step_in = StepInputs {
                    x: &to64(&proj[s * ld..(s + 1) * ld]),
                    conv: &to64(&conv_before[slot * cl..(slot + 1) * cl]),
                    state: &to64(&state_before[slot * sl..(slot + 1) * sl]),
                };
                let what = format!("emulated {sh:?} n {n} step {step} seq {s}");
                check_step(
                    sh,
                    &weights,
                    step_in,
                    &got,
                    StateDtype::F32,
                    &what,
                    &mut stats,
                );
            }
        }
        println!("emulated {sh:?} n {n}, {steps} steps: {stats}");
        cases += 1;
    }
    assert!(cases > 0, "{path} holds no case");
}
