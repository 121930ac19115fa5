//! GPU gate of the MoE experts op (`ModelOps::moe_experts`): top-k softmax
//! routing, the device-side grouping by expert, the grouped expert GEMMs
//! (GEMV tiles on CUDA cores and on tensor cores, 64-row tensor-core tiles,
//! each forced), the weighted un-permute and
//! the direct path (at most 4 tokens: no grouping, the shared expert from
//! its weights or its output), against an f64 CPU reference of
//! transformers' qwen3_5_moe experts on exactly the bf16 inputs the GPU
//! reads. Shapes: a tiny layer (E = 8, top-2, H = 64, I = 32, a shared
//! expert of Is = 48 as the MoE fixtures have) and Qwen3.5-35B-A3B's (E =
//! 256, top-8, H = 2048, I = Is = 512), with an expert no token picks and
//! a batch where every token picks the same expert. Skips without a GPU
//! (`GDN_REQUIRE_GPU=1` makes that a failure).
//!
//! Router logits are distinct multiples of 8 / E per token (exact in bf16),
//! so no two probabilities tie and fp32 ranks them as f64 does: the
//! expert ids must match exactly. Weights: within 2e-6 relative (a few fp32
//! roundings of a ratio of exponentials). Outputs: see [`output_bound`]
//! (per element) and [`RMS_BOUND`] (over a case).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gdn_kernels::{ModelOps, MoeExperts, MoePath, MoeScratch, MoeShape, SharedExpert};
use gdn_kernels_testkit::{gpu_stream, Rng};
use half::bf16;

fn rb(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One bf16 ulp, relative, at most (7 stored fraction bits): how far two
/// roundings of nearly equal values can land apart.
const BF16_FLIP: f64 = 1.0 / 128.0;
/// Half an ulp: the RMS error allowed over a case's checked outputs.
const RMS_BOUND: f64 = 1.0 / 256.0;
/// Weights: relative error of the fp32 softmax and renormalisation.
const WEIGHT_BOUND: f64 = 2e-6;

struct Case {
    shape: MoeShape,
    tokens: usize,
    /// Every token ranks this expert first.
    favourite: Option<usize>,
    /// Every token ranks this expert last (no token picks it).
    shunned: Option<usize>,
    /// Add a gated shared expert (the shape's `shared_inter`): its output
    /// given, and on the direct path also its weights.
    shared: bool,
    /// Tokens whose outputs the f64 reference checks (all when >= tokens);
    /// ids and weights are checked for every token.
    checked: usize,
}

/// The routing the reference takes for one token: softmax in f64 over
/// all experts, the k largest (logits are distinct by construction),
/// renormalised.
fn reference_route(logits: &[bf16], k: usize) -> Vec<(usize, f64)> {
    let l: Vec<f64> = logits.iter().map(|x| x.to_f64()).collect();
    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = p.iter().sum();
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap().then(a.cmp(&b)));
    let top: Vec<(usize, f64)> = order[..k].iter().map(|&e| (e, p[e] / z)).collect();
    let s: f64 = top.iter().map(|x| x.1).sum();
    top.into_iter().map(|(e, v)| (e, v / s)).collect()
}

/// Per token, `[router_width]`: distinct logits (rank r of a seeded
/// shuffle -> (r - E/2) * 8 / E), the favourite ranked first and the
/// shunned last; with a shared expert, its gate logit (uniform in [-3, 3))
/// in column E and zeros after it.
fn router_logits(case: &Case, rng: &mut Rng) -> Vec<bf16> {
    let e = case.shape.experts;
    let width = case.shape.router_width();
    let mut out = Vec::with_capacity(case.tokens * width);
    for _ in 0..case.tokens {
        let mut rank: Vec<usize> = (0..e).collect();
        for i in (1..e).rev() {
            rank.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut place = |expert: usize, r: usize| {
            let at = rank.iter().position(|&x| x == r).unwrap();
            rank.swap(at, expert);
        };
        if let Some(f) = case.favourite {
            place(f, e - 1);
        }
        if let Some(s) = case.shunned {
            place(s, 0);
        }
        out.extend(
            rank.iter()
                .map(|&r| bf16::from_f64((r as f64 - e as f64 / 2.0) * 8.0 / e as f64)),
        );
        if width > e {
            out.push(bf16::from_f32(rng.uniform(-3.0, 3.0)));
            out.extend(std::iter::repeat_n(bf16::ZERO, width - e - 1));
        }
    }
    out
}

/// One expert's weights read back from the device, fetched on first use.
struct ExpertCache<'a> {
    stream: &'a Arc<CudaStream>,
    shape: MoeShape,
    gate_up: &'a CudaSlice<bf16>,
    down: &'a CudaSlice<bf16>,
    got: HashMap<usize, (Vec<bf16>, Vec<bf16>)>,
}

impl ExpertCache<'_> {
    fn get(&mut self, e: usize) -> &(Vec<bf16>, Vec<bf16>) {
        let (h, i) = (self.shape.hidden, self.shape.inter);
        let (stream, gate_up, down) = (self.stream, self.gate_up, self.down);
        self.got.entry(e).or_insert_with(|| {
            let gu = stream
                .clone_dtoh(&gate_up.slice(e * 2 * i * h..(e + 1) * 2 * i * h))
                .unwrap();
            let d = stream
                .clone_dtoh(&down.slice(e * h * i..(e + 1) * h * i))
                .unwrap();
            (gu, d)
        })
    }
}

/// One expert's output for one token with HF's bf16 roundings (gate, up,
/// silu, the SwiGLU product, the down projection), and per output column
/// how far the down projection can move when the GPU's fp32 sums land
/// each bf16 rounding of the intermediate on the other neighbour:
/// sum_j |d act_j| |down[n, j]|, with |d act_j| bounded by one ulp of
/// the product, of silu(gate) (times |up|), of up (times |silu(gate)|)
/// and of gate carried through silu (|silu'| <= 1.1).
fn reference_expert(
    x: &[bf16],
    weights: &(Vec<bf16>, Vec<bf16>),
    h: usize,
    i: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (gu, d) = weights;
    let dot = |w: &[bf16], v: &[f64]| -> f64 {
        w.iter().zip(v).map(|(a, b)| a.to_f64() * b).sum::<f64>()
    };
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let (mut act, mut dact) = (vec![0f64; i], vec![0f64; i]);
    for j in 0..i {
        let g = rb(dot(&gu[j * h..(j + 1) * h], &xf));
        let u = rb(dot(&gu[(i + j) * h..(i + j + 1) * h], &xf));
        let sg = rb(silu(g));
        act[j] = rb(sg * u);
        dact[j] =
            BF16_FLIP * (act[j].abs() + u.abs() * (sg.abs() + 1.1 * g.abs()) + sg.abs() * u.abs());
    }
    let y: Vec<f64> = (0..h)
        .map(|n| rb(dot(&d[n * i..(n + 1) * i], &act)))
        .collect();
    let spread: Vec<f64> = (0..h)
        .map(|n| {
            d[n * i..(n + 1) * i]
                .iter()
                .zip(&dact)
                .map(|(w, da)| w.to_f64().abs() * da)
                .sum()
        })
        .collect();
    (y, spread)
}

/// The bound on |GPU - reference| of one output element: the GPU
/// accumulates in fp32 where the reference uses f64, so any bf16 rounding
/// may land on the other neighbour (one ulp, at most 2^-7 relative):
/// inside each expert (`spread`, [`reference_expert`]), its rounded output,
/// its bf16 routing weight and the weighted copy (3 ulp of |y|, times w),
/// the routed sum and the output (an ulp each), the shared expert's
/// sigmoid and product (2 ulp of the term). A rigorous but loose bound;
/// the sharp check is the RMS error over all checked elements, which must
/// stay within half an ulp (2^-8) of the RMS output: a wrong, missing or
/// misweighted expert moves it by about 1/sqrt(k) of the output.
fn output_bound(want: f64, routed: f64, shared: f64, terms: &[(f64, f64, f64)]) -> f64 {
    let experts: f64 = terms
        .iter()
        .map(|&(w, y, spread)| w * (3.0 * BF16_FLIP * y.abs() + spread))
        .sum();
    experts + BF16_FLIP * (want.abs() + routed.abs() + 2.0 * shared.abs()) + 1e-6
}

fn run_case(stream: &Arc<CudaStream>, ops: &ModelOps, case: &Case, seed: u64) {
    let s = case.shape;
    assert_eq!(case.shared, s.shared_inter > 0);
    let (e, k, h, i, t) = (s.experts, s.top_k, s.hidden, s.inter, case.tokens);
    let (is, width) = (s.shared_inter, s.router_width());
    let mut rng = Rng::new(seed);
    let logits_host = router_logits(case, &mut rng);
    let x_host: Vec<bf16> = (0..t * h)
        .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
        .collect();
    let shared_host: Vec<bf16> = (0..t * h)
        .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
        .collect();
    let logits = stream.clone_htod(&logits_host).unwrap();
    let x = stream.clone_htod(&x_host).unwrap();
    let shared_out = stream.clone_htod(&shared_host).unwrap();
    let mut gate_up = stream.alloc_zeros::<bf16>(s.gate_up_len()).unwrap();
    let mut down = stream.alloc_zeros::<bf16>(s.down_len()).unwrap();
    // Uniform weights scaled so that the projections stay near unit size.
    let (gu_scale, d_scale) = ((3.0 / h as f32).sqrt() * 2.0, (3.0 / i as f32).sqrt() * 4.0);
    ops.fill_uniform_bf16(&mut gate_up, seed ^ 1, gu_scale, 0.0)
        .unwrap();
    ops.fill_uniform_bf16(&mut down, seed ^ 2, d_scale, 0.0)
        .unwrap();
    // The shared expert's weights (one more expert of width Is).
    let (mut shared_gu, mut shared_d) = (
        stream.alloc_zeros::<bf16>((2 * is * h).max(1)).unwrap(),
        stream.alloc_zeros::<bf16>((h * is).max(1)).unwrap(),
    );
    if case.shared {
        ops.fill_uniform_bf16(&mut shared_gu, seed ^ 3, gu_scale, 0.0)
            .unwrap();
        let sd_scale = (3.0 / is as f32).sqrt() * 4.0;
        ops.fill_uniform_bf16(&mut shared_d, seed ^ 4, sd_scale, 0.0)
            .unwrap();
    }
    let shared_weights = (
        stream.clone_dtoh(&shared_gu).unwrap(),
        stream.clone_dtoh(&shared_d).unwrap(),
    );
    let mut scratch = MoeScratch::new(stream, s, t + 3).unwrap();
    let experts = MoeExperts {
        gate_up: &gate_up,
        down: &down,
    };

    // The reference routing, checked for every token.
    let routes: Vec<Vec<(usize, f64)>> = (0..t)
        .map(|r| reference_route(&logits_host[r * width..r * width + e], k))
        .collect();
    if let Some(sh) = case.shunned {
        assert!(routes.iter().all(|r| r.iter().all(|&(x, _)| x != sh)));
    }
    if let Some(fav) = case.favourite {
        assert!(routes.iter().all(|r| r[0].0 == fav));
    }
    let checked: Vec<usize> = if case.checked >= t {
        (0..t).collect()
    } else {
        (0..case.checked)
            .map(|j| j * (t - 1) / (case.checked - 1))
            .collect()
    };
    let mut cache = ExpertCache {
        stream,
        shape: s,
        gate_up: &gate_up,
        down: &down,
        got: HashMap::new(),
    };
    // Per checked token: the routed experts' sums and, per column, each
    // expert's (bf16 weight, output, spread).
    type Terms = Vec<Vec<(f64, f64, f64)>>;
    let mut routed_ref: Vec<(usize, Vec<f64>, Terms)> = Vec::new();
    for &r in &checked {
        let xr = &x_host[r * h..(r + 1) * h];
        let mut routed = vec![0f64; h];
        let mut terms: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); h];
        for &(ex, w) in &routes[r] {
            let (y, spread) = reference_expert(xr, cache.get(ex), h, i);
            let wb = rb(w);
            for n in 0..h {
                routed[n] += rb(y[n] * wb);
                terms[n].push((wb, y[n], spread[n]));
            }
        }
        routed_ref.push((r, routed, terms));
    }
    // Reference output and per-element bound per checked token, the shared
    // expert given as its output (`from_weights` false) or its weights.
    let want_for = |from_weights: bool| -> Vec<(usize, Vec<f64>, Vec<f64>)> {
        routed_ref
            .iter()
            .map(|(r, routed, terms)| {
                let r = *r;
                let g = match case.shared {
                    true => rb(sigmoid(logits_host[r * width + e].to_f64())),
                    false => 0.0,
                };
                let (sh, sh_spread) = if from_weights {
                    reference_expert(&x_host[r * h..(r + 1) * h], &shared_weights, h, is)
                } else {
                    let given = shared_host[r * h..(r + 1) * h].iter();
                    (given.map(|v| v.to_f64()).collect(), vec![0f64; h])
                };
                let mut out = vec![0f64; h];
                let mut bound = vec![0f64; h];
                for n in 0..h {
                    let shared = if case.shared { rb(g * sh[n]) } else { 0.0 };
                    out[n] = if case.shared {
                        rb(rb(routed[n]) + shared)
                    } else {
                        rb(routed[n])
                    };
                    // A shared output the GPU computed adds its own
                    // roundings, as a routed expert's do.
                    let own = if from_weights && case.shared {
                        g * (BF16_FLIP * sh[n].abs() + sh_spread[n])
                    } else {
                        0.0
                    };
                    bound[n] = output_bound(out[n], routed[n], shared, &terms[n]) + own;
                }
                (r, out, bound)
            })
            .collect()
    };
    let (want_given, want_weights) = (want_for(false), want_for(true));

    let direct = t <= gdn_kernels::MOE_DIRECT_MAX_TOKENS;
    let mut runs = vec![
        (MoePath::Gemv, false),
        (MoePath::GemvTensorCore, false),
        (MoePath::TensorCore, false),
        (MoePath::Auto, direct),
    ];
    if direct {
        runs.extend([(MoePath::Direct, false), (MoePath::Direct, true)]);
    }
    for (path, from_weights) in runs {
        // Without a shared expert there is nothing to give by weights.
        let from_weights = from_weights && case.shared;
        let shared = case.shared.then_some(if from_weights {
            SharedExpert::Weights(MoeExperts {
                gate_up: &shared_gu,
                down: &shared_d,
            })
        } else {
            SharedExpert::Output(&shared_out)
        });
        let want = if from_weights {
            &want_weights
        } else {
            &want_given
        };
        let mut out = stream.alloc_zeros::<bf16>(t * h).unwrap();
        let ran = ops
            .moe_experts(&x, &logits, experts, shared, &mut scratch, &mut out, path)
            .unwrap();
        if path == MoePath::Auto {
            assert_eq!(ran, gdn_kernels::moe_path(t, s));
        } else {
            assert_eq!(ran, path);
        }
        let ids = stream.clone_dtoh(scratch.ids()).unwrap();
        let weights = stream.clone_dtoh(scratch.weights()).unwrap();
        for (r, route) in routes.iter().enumerate() {
            for (slot, &(ex, w)) in route.iter().enumerate() {
                let (gi, gw) = (ids[r * k + slot], weights[r * k + slot] as f64);
                assert_eq!(gi as usize, ex, "{s:?} T {t} token {r} slot {slot}");
                assert!(
                    (gw - w).abs() <= WEIGHT_BOUND * w,
                    "{s:?} T {t} token {r} slot {slot}: weight {gw}, want {w}"
                );
            }
        }
        let got = stream.clone_dtoh(&out).unwrap();
        let (mut sq_err, mut sq_want, mut worst) = (0f64, 0f64, 0f64);
        for (r, out_ref, bound) in want {
            for n in 0..h {
                let (have, w) = (got[r * h + n].to_f64(), out_ref[n]);
                let err = (have - w).abs();
                assert!(
                    err <= bound[n],
                    "{path:?} (shared weights: {from_weights}) {s:?} T {t} token {r} column {n}: got {have}, want {w} (bound {})",
                    bound[n]
                );
                sq_err += err * err;
                sq_want += w * w;
                worst = worst.max(err / bound[n]);
            }
        }
        let rms_ratio = (sq_err / sq_want.max(1e-300)).sqrt();
        assert!(
            rms_ratio <= RMS_BOUND,
            "{path:?} {s:?} T {t}: RMS error {rms_ratio} of the RMS output, above half a bf16 ulp"
        );
        eprintln!(
            "{ran:?} (shared weights: {from_weights}) E {e} k {k} H {h} I {i} Is {is} T {t}: worst error {worst:.3} of its bound, RMS {rms_ratio:.2e}"
        );
    }
}

const TINY: MoeShape = MoeShape {
    experts: 8,
    top_k: 2,
    hidden: 64,
    inter: 32,
    shared_inter: 0,
};
const QWEN35_35B_A3B: MoeShape = MoeShape {
    experts: 256,
    top_k: 8,
    hidden: 2048,
    inter: 512,
    shared_inter: 0,
};

/// `shape` with a shared expert of width `is`.
const fn with_shared(shape: MoeShape, is: usize) -> MoeShape {
    MoeShape {
        shared_inter: is,
        ..shape
    }
}

#[test]
fn moe_experts_match_the_f64_reference() {
    let Some(stream) = gpu_stream() else { return };
    let ops = ModelOps::new(stream.clone()).unwrap();
    let case = |shape, tokens, checked| Case {
        shape,
        tokens,
        favourite: None,
        shunned: None,
        shared: false,
        checked,
    };
    let cases = [
        case(TINY, 1, 1),
        Case {
            shared: true,
            ..case(with_shared(TINY, 48), 3, 3)
        },
        Case {
            shared: true,
            ..case(with_shared(TINY, 48), 9, 9)
        },
        Case {
            shunned: Some(5),
            ..case(TINY, 17, 17)
        },
        case(TINY, 300, 300),
        Case {
            favourite: Some(2),
            ..case(TINY, 300, 300)
        },
        case(QWEN35_35B_A3B, 1, 1),
        Case {
            shared: true,
            ..case(with_shared(QWEN35_35B_A3B, 512), 1, 1)
        },
        Case {
            shared: true,
            ..case(with_shared(QWEN35_35B_A3B, 512), 4, 4)
        },
        Case {
            shared: true,
            ..case(with_shared(QWEN35_35B_A3B, 512), 8, 8)
        },
        Case {
            favourite: Some(77),
            ..case(QWEN35_35B_A3B, 64, 16)
        },
        Case {
            shunned: Some(0),
            ..case(QWEN35_35B_A3B, 1000, 12)
        },
    ];
    for (n, c) in cases.iter().enumerate() {
        run_case(&stream, &ops, c, 0x3e0 + n as u64);
    }
}

/// The error `moe_experts` gives for these operands (it must refuse them),
/// with an output as long as `x`.
fn refusal(
    ops: &ModelOps,
    x: &CudaSlice<bf16>,
    logits: &CudaSlice<bf16>,
    experts: MoeExperts<'_>,
    shared: Option<SharedExpert<'_>>,
    scratch: &mut MoeScratch,
    path: MoePath,
) -> String {
    let mut out = ops.stream().alloc_zeros::<bf16>(x.len()).unwrap();
    ops.moe_experts(x, logits, experts, shared, scratch, &mut out, path)
        .unwrap_err()
        .to_string()
}

#[test]
fn moe_experts_are_bit_reproducible_and_refuse_bad_operands() {
    let Some(stream) = gpu_stream() else { return };
    let ops = ModelOps::new(stream.clone()).unwrap();
    let s = TINY;
    let t = 40;
    let mut gate_up = stream.alloc_zeros::<bf16>(s.gate_up_len()).unwrap();
    let mut down = stream.alloc_zeros::<bf16>(s.down_len()).unwrap();
    let mut x = stream.alloc_zeros::<bf16>(t * s.hidden).unwrap();
    let mut logits = stream.alloc_zeros::<bf16>(t * s.experts).unwrap();
    ops.fill_uniform_bf16(&mut gate_up, 1, 0.2, 0.0).unwrap();
    ops.fill_uniform_bf16(&mut down, 2, 0.2, 0.0).unwrap();
    ops.fill_uniform_bf16(&mut x, 3, 1.0, 0.0).unwrap();
    ops.fill_uniform_bf16(&mut logits, 4, 2.0, 0.0).unwrap();
    let experts = MoeExperts {
        gate_up: &gate_up,
        down: &down,
    };
    let mut scratch = MoeScratch::new(&stream, s, t).unwrap();
    for path in [MoePath::Gemv, MoePath::GemvTensorCore, MoePath::TensorCore] {
        let runs: Vec<Vec<u16>> = (0..3)
            .map(|_| {
                let mut out = stream.alloc_zeros::<bf16>(t * s.hidden).unwrap();
                ops.moe_experts(&x, &logits, experts, None, &mut scratch, &mut out, path)
                    .unwrap();
                let v = stream.clone_dtoh(&out).unwrap();
                v.iter().map(|b| b.to_bits()).collect()
            })
            .collect();
        assert_eq!(runs[0], runs[1], "{path:?}");
        assert_eq!(runs[0], runs[2], "{path:?}");
    }
    // More tokens than the scratch holds; logits of the wrong width; the
    // direct path past its bound.
    let big_x = stream.alloc_zeros::<bf16>((t + 1) * s.hidden).unwrap();
    let big_logits = stream.alloc_zeros::<bf16>((t + 1) * s.experts).unwrap();
    let short_logits = stream.alloc_zeros::<bf16>(t * s.experts - 1).unwrap();
    for (x, logits, path, want) in [
        (&big_x, &big_logits, MoePath::Auto, "at most 40"),
        (&x, &short_logits, MoePath::Auto, "router_logits"),
        (&x, &logits, MoePath::Direct, "direct path takes at most"),
    ] {
        let err = refusal(&ops, x, logits, experts, None, &mut scratch, path);
        assert!(err.contains(want), "{err}");
    }

    // A shape with a shared expert: the direct and the GEMV path give the
    // same bits (the same dot products in the same order; the shared
    // expert's output given to both); its weights only on the direct path;
    // a missing shared operand refused.
    let s = with_shared(TINY, 48);
    let t = 3;
    let mut x = stream.alloc_zeros::<bf16>(t * s.hidden).unwrap();
    let mut logits = stream.alloc_zeros::<bf16>(t * s.router_width()).unwrap();
    let mut shared_out = stream.alloc_zeros::<bf16>(t * s.hidden).unwrap();
    ops.fill_uniform_bf16(&mut x, 5, 1.0, 0.0).unwrap();
    ops.fill_uniform_bf16(&mut logits, 6, 2.0, 0.0).unwrap();
    ops.fill_uniform_bf16(&mut shared_out, 7, 1.0, 0.0).unwrap();
    let mut scratch = MoeScratch::new(&stream, s, t).unwrap();
    let mut bits = Vec::new();
    for path in [MoePath::Gemv, MoePath::Direct] {
        let mut out = stream.alloc_zeros::<bf16>(t * s.hidden).unwrap();
        let shared = Some(SharedExpert::Output(&shared_out));
        ops.moe_experts(&x, &logits, experts, shared, &mut scratch, &mut out, path)
            .unwrap();
        let v = stream.clone_dtoh(&out).unwrap();
        bits.push(v.iter().map(|b| b.to_bits()).collect::<Vec<u16>>());
    }
    assert_eq!(bits[0], bits[1], "direct and GEMV paths differ");
    let shared_gu = stream.alloc_zeros::<bf16>(2 * 48 * s.hidden).unwrap();
    let shared_d = stream.alloc_zeros::<bf16>(48 * s.hidden).unwrap();
    let weights = SharedExpert::Weights(MoeExperts {
        gate_up: &shared_gu,
        down: &shared_d,
    });
    let err = refusal(
        &ops,
        &x,
        &logits,
        experts,
        Some(weights),
        &mut scratch,
        MoePath::Gemv,
    );
    assert!(err.contains("direct path only"), "{err}");
    let err = refusal(
        &ops,
        &x,
        &logits,
        experts,
        None,
        &mut scratch,
        MoePath::Direct,
    );
    assert!(err.contains("disagree"), "{err}");
}
