//! GPU gate of the MLP's gate/up projection + SwiGLU (`Gemm::gate_up_swiglu`):
//! the fused kernel (quack's SM90 GEMM with the SwiGLU epilogue, bundle unit
//! `dsl_quack_sm90`) and the unfused route (GEMM + `silu_mul_bf16`), each
//! against an f64 CPU computation from exactly the bf16 inputs, at the 4B's
//! shape (inter 9216, k 2560) and at edge shapes (partial tiles in m, n and
//! k). The fused kernel must not write past the m rows it was given. Also:
//! the route the rule takes, and the operands the fused kernel refuses.
//! On GPUs other than SM 9.0 only the unfused route is checked and forcing
//! the fused one must be an error. Skips without a GPU (`GDN_REQUIRE_GPU=1`
//! makes that a failure).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gdn_kernels::{
    ErrorKind, Gemm, GemmShape, ModelOps, SwigluGemm, SwigluRequest, SwigluRoute,
    SWIGLU_FUSED_MIN_ROWS,
};
use gdn_kernels_testkit::{gpu_stream, Rng};
use half::bf16;

/// fp32 accumulation over k products of bf16 values: 2e-6 of sum |x w| is
/// ~30 ulp of fp32 at the largest partial sum and ~100x below the effect of
/// a dropped product (as in gpu_skinny_linear).
const ACC_BOUND: f64 = 2e-6;
/// One rounding to bf16: half an ulp, which is at most 2^-8 of the value
/// (at the bottom of a binade, where an ulp is 2^-7 of it).
const BF16_ROUNDING: f64 = 1.0 / 256.0;
/// The fused epilogue's sigmoid uses the approximate ex2 and reciprocal
/// (~2^-22 relative each); 1e-5 relative leaves room and is ~400x below an
/// ulp of bf16.
const APPROX_ACTIVATION: f64 = 1e-5;
/// Exact in bf16.
const SENTINEL: f32 = 12288.0;

fn random_bf16(rng: &mut Rng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.uniform(-scale, scale)))
        .collect()
}

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

fn silu_derivative(g: f64) -> f64 {
    let s = 1.0 / (1.0 + (-g).exp());
    s * (1.0 + g * (1.0 - s))
}

/// f64 (g, sum |x w_g|, u, sum |x w_u|) for `rows` x `cols` of the output.
fn reference(
    x: &[bf16],
    w: &[bf16],
    inter: usize,
    k: usize,
    rows: &[usize],
    cols: &[usize],
) -> Vec<[f64; 4]> {
    let dot = |r: usize, n: usize| {
        let (xr, wr) = (&x[r * k..(r + 1) * k], &w[n * k..(n + 1) * k]);
        xr.iter().zip(wr).fold((0f64, 0f64), |(s, a), (p, q)| {
            let v = p.to_f64() * q.to_f64();
            (s + v, a + v.abs())
        })
    };
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(32);
    let chunk = rows.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = rows
            .chunks(chunk)
            .map(|rs| {
                s.spawn(move || {
                    let mut out = Vec::with_capacity(rs.len() * cols.len());
                    for &r in rs {
                        for &c in cols {
                            let (g, ga) = dot(r, c);
                            let (u, ua) = dot(r, inter + c);
                            out.push([g, ga, u, ua]);
                        }
                    }
                    out
                })
            })
            .collect();
        parts.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// The error bound of one output: the GEMM's accumulation carried through
/// the activation, the output rounding, and (`eager`: the unfused route, as
/// PyTorch eager) the roundings of g, u and silu(g) to bf16 before the
/// product.
fn bound([g, ga, u, ua]: [f64; 4], eager: bool) -> f64 {
    let want = silu(g) * u;
    let (dg, du) = (ACC_BOUND * ga, ACC_BOUND * ua);
    let mut b = silu_derivative(g).abs() * dg * u.abs() + silu(g).abs() * du;
    b += want.abs() * (BF16_ROUNDING + APPROX_ACTIVATION);
    if eager {
        let through_g = (silu_derivative(g) * g * u).abs();
        b += BF16_ROUNDING * (through_g + 2.0 * (silu(g) * u).abs());
    }
    b + 1e-30
}

/// Compares the sampled outputs; returns the worst error / bound.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    got: &[bf16],
    want: &[[f64; 4]],
    inter: usize,
    rows: &[usize],
    cols: &[usize],
    eager: bool,
) -> f64 {
    let mut worst = 0f64;
    for (ri, &r) in rows.iter().enumerate() {
        for (ci, &c) in cols.iter().enumerate() {
            let ref_ = want[ri * cols.len() + ci];
            let v = silu(ref_[0]) * ref_[2];
            let g = got[r * inter + c].to_f64();
            let (err, b) = ((g - v).abs(), bound(ref_, eager));
            assert!(
                g.is_finite() && err <= b,
                "{what}: out[{r}, {c}] = {g}, want {v} (g {:.4}, u {:.4}; error {err:.3e} > bound {b:.3e})",
                ref_[0],
                ref_[2]
            );
            worst = worst.max(err / b);
        }
    }
    worst
}

/// Rows and columns compared: all of a small shape; both ends and a random
/// spread of a large one (an f64 reference of every 4B output would take
/// minutes).
fn sample(rng: &mut Rng, n: usize, edge: usize, spread: usize) -> Vec<usize> {
    if n <= 2 * edge + spread {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..edge).chain(n - edge..n).collect();
    v.extend((0..spread).map(|_| (rng.next_u64() % n as u64) as usize));
    v.sort_unstable();
    v.dedup();
    v
}

struct Case {
    label: &'static str,
    m: usize,
    inter: usize,
    k: usize,
}

const CASES: [Case; 6] = [
    Case {
        label: "4B, one prefill chunk",
        m: 1024,
        inter: 9216,
        k: 2560,
    },
    Case {
        label: "4B, partial m tile",
        m: 1500,
        inter: 9216,
        k: 2560,
    },
    Case {
        label: "4B, a decode row",
        m: 1,
        inter: 9216,
        k: 2560,
    },
    Case {
        label: "4B, decode batch",
        m: 17,
        inter: 9216,
        k: 2560,
    },
    Case {
        label: "edge: partial tiles in m, n and k",
        m: 130,
        inter: 200,
        k: 136,
    },
    Case {
        label: "edge: one row, one k step",
        m: 1,
        inter: 8,
        k: 8,
    },
];

fn setup() -> Option<(Arc<CudaStream>, Gemm, ModelOps, bool)> {
    let stream = gpu_stream()?;
    let gemm = Gemm::new(stream.clone()).unwrap();
    let ops = ModelOps::new(stream.clone()).unwrap();
    let sm90 = stream.context().compute_capability().unwrap() == (9, 0);
    Some((stream, gemm, ops, sm90))
}

#[test]
fn fused_and_unfused_routes_match_f64() {
    let Some((stream, mut gemm, ops, sm90)) = setup() else {
        return;
    };
    let mut rng = Rng::new(0x5a16);
    let routes: &[(SwigluRequest, SwigluRoute, bool)] = if sm90 {
        &[
            (SwigluRequest::Fused, SwigluRoute::Fused, false),
            (SwigluRequest::Unfused, SwigluRoute::Unfused, true),
        ]
    } else {
        &[(SwigluRequest::Unfused, SwigluRoute::Unfused, true)]
    };
    for case in &CASES {
        let Case { label, m, inter, k } = *case;
        // g and u of order one: the activation's curved part is exercised.
        let w_host = random_bf16(&mut rng, 2 * inter * k, 2.0 / (k as f32).sqrt());
        let x_host = random_bf16(&mut rng, m * k, 1.0);
        let rows = sample(&mut rng, m, 16, 48);
        let cols = sample(&mut rng, inter, 64, 700);
        let want = reference(&x_host, &w_host, inter, k, &rows, &cols);
        let x = stream.clone_htod(&x_host).unwrap();
        let w = stream.clone_htod(&w_host).unwrap();
        for &(request, route, eager) in routes {
            gemm.set_swiglu_request(request);
            let mut out = stream
                .clone_htod(&vec![bf16::from_f32(SENTINEL); m * inter])
                .unwrap();
            let took = gemm
                .gate_up_swiglu(&ops, &x, &w, &mut out, GemmShape::new(m, inter, k))
                .unwrap();
            assert_eq!(took, route, "{label}");
            let got = stream.clone_dtoh(&out).unwrap();
            let what = format!("{label} (m {m}, inter {inter}, k {k}) {route:?}");
            let worst = check(&what, &got, &want, inter, &rows, &cols, eager);
            eprintln!(
                "{what}: {} outputs compared, worst error / bound {worst:.3}",
                rows.len() * cols.len()
            );
        }
    }
}

#[test]
fn fused_kernel_writes_only_its_rows() {
    let Some((stream, _gemm, _ops, sm90)) = setup() else {
        return;
    };
    if !sm90 {
        eprintln!("skipped: the fused kernel runs on SM 9.0 only");
        return;
    }
    let fused = SwigluGemm::new(stream.clone())
        .unwrap()
        .expect("SM 9.0 loads the fused kernel");
    let mut rng = Rng::new(7);
    // m = 130: the second 128-row tile is mostly past m.
    let (m, inter, k) = (130, 200, 136);
    let x = stream
        .clone_htod(&random_bf16(&mut rng, (m + 126) * k, 1.0))
        .unwrap();
    let w = stream
        .clone_htod(&random_bf16(&mut rng, 2 * inter * k, 0.2))
        .unwrap();
    let mut out: CudaSlice<bf16> = stream
        .clone_htod(&vec![bf16::from_f32(SENTINEL); (m + 126) * inter])
        .unwrap();
    fused
        .run(&x, &w, &mut out, GemmShape::new(m, inter, k))
        .unwrap();
    let got = stream.clone_dtoh(&out).unwrap();
    assert!(got[..m * inter].iter().any(|v| v.to_f32() != SENTINEL));
    let past = got[m * inter..].iter().position(|v| v.to_f32() != SENTINEL);
    assert_eq!(
        past,
        None,
        "row {:?} past m written",
        past.map(|i| m + i / inter)
    );
}

#[test]
fn the_rule_routes_prefill_to_the_fused_kernel_and_refuses_what_it_cannot_run() {
    let Some((stream, mut gemm, ops, sm90)) = setup() else {
        return;
    };
    let (inter, k) = (9216, 2560);
    let w: CudaSlice<bf16> = stream.alloc_zeros(2 * inter * k).unwrap();
    for m in [
        1,
        17,
        SWIGLU_FUSED_MIN_ROWS - 1,
        SWIGLU_FUSED_MIN_ROWS,
        4096,
    ] {
        let x: CudaSlice<bf16> = stream.alloc_zeros(m * k).unwrap();
        let out: CudaSlice<bf16> = stream.alloc_zeros(m * inter).unwrap();
        let want = if sm90 && m >= SWIGLU_FUSED_MIN_ROWS {
            SwigluRoute::Fused
        } else {
            SwigluRoute::Unfused
        };
        assert_eq!(
            gemm.swiglu_route(&x, &w, &out, GemmShape::new(m, inter, k))
                .unwrap(),
            want,
            "m {m}"
        );
    }
    // Forced fused: refused, with a reason, where it cannot run.
    gemm.set_swiglu_request(SwigluRequest::Fused);
    let (m, k_odd) = (1024, 2564);
    let x: CudaSlice<bf16> = stream.alloc_zeros(m * k_odd).unwrap();
    let w_odd: CudaSlice<bf16> = stream.alloc_zeros(2 * inter * k_odd).unwrap();
    let mut out: CudaSlice<bf16> = stream.alloc_zeros(m * inter).unwrap();
    let e = gemm
        .gate_up_swiglu(&ops, &x, &w_odd, &mut out, GemmShape::new(m, inter, k_odd))
        .unwrap_err();
    match (e.kind(), sm90) {
        (ErrorKind::InvalidArgument { message, .. }, true) => {
            assert!(message.contains("multiples of 8"), "{e}")
        }
        (ErrorKind::Unsupported { .. }, false) => {}
        _ => panic!("unexpected error {e}"),
    }
    // Auto takes such operands unfused, and a short weight is refused by both.
    gemm.set_swiglu_request(SwigluRequest::Auto);
    let took = gemm
        .gate_up_swiglu(&ops, &x, &w_odd, &mut out, GemmShape::new(m, inter, k_odd))
        .unwrap();
    assert_eq!(took, SwigluRoute::Unfused);
    let e = gemm
        .gate_up_swiglu(&ops, &x, &w, &mut out, GemmShape::new(m, inter, k_odd))
        .unwrap_err();
    assert!(e.to_string().contains("W_gate"), "{e}");
}
