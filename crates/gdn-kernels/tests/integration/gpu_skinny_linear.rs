//! GPU gate of the skinny linear kernels (`SkinnyLinear`, m <= 16 rows)
//! at every Qwen3.5-4B linear shape and at small shapes that reach the
//! kernels' edges (a partial 16-column tile, a partial round of k), for
//! m in {1, 2, 3, 4, 8, 16}, bf16 and fp32 output, every launch
//! configuration, against an f64 CPU matmul of exactly the bf16 inputs.
//! cuBLAS is held to the same bound (the bound is fair to an fp32
//! accumulation). Rows of y past m must stay untouched. Also the operands
//! the kernels refuse. Skips without a GPU (`GDN_REQUIRE_GPU=1` makes that a
//! failure).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gdn_kernels::{Gemm, GemmOutput, GemmShape, SkinnyConfig};
use gdn_kernels_testkit::{gpu_stream, Rng};
use half::bf16;

/// (label, n, k): the 4B's linear layers (out_proj and o_proj share
/// 4096 -> 2560) and edge shapes.
const SHAPES: [(&str, usize, usize); 9] = [
    ("deltanet in_proj", 12352, 2560),
    ("out_proj / o_proj", 2560, 4096),
    ("attention qkv", 10240, 2560),
    ("mlp gate_up", 18432, 2560),
    ("mlp down", 2560, 9216),
    ("lm_head", 248320, 2560),
    ("edge: one partial tile, one step", 7, 8),
    ("edge: partial tile, partial round", 37, 200),
    ("edge: many tiles, partial round", 1000, 2568),
];
const ROWS: [usize; 6] = [1, 2, 3, 4, 8, 16];
/// Columns compared on shapes too wide for a full f64 reference.
const SAMPLED_COLUMNS: usize = 3000;
/// Error bound: fp32 accumulation over k products of bf16 values is good
/// to a few ulp of the largest partial sum; 2e-6 of sum |x w| is ~30 ulp
/// of fp32 there and ~100x below the effect of a single dropped product.
const ACC_BOUND: f64 = 2e-6;
/// One bf16 rounding of the output (relative, a full ulp: 2^-8).
const BF16_ROUNDING: f64 = 1.0 / 256.0;
/// Exact in bf16 too (12345 would round to 12352 and fail the check).
const SENTINEL: f32 = 12288.0;

fn random_bf16(rng: &mut Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
        .collect()
}

/// f64 `y[r, c]` and `sum_k |x w|` for every row of x and the given columns.
fn reference(x: &[bf16], w: &[bf16], m: usize, k: usize, cols: &[usize]) -> Vec<(f64, f64)> {
    let xf: Vec<f64> = x[..m * k].iter().map(|v| v.to_f64()).collect();
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(32);
    let chunk = cols.len().div_ceil(threads).max(1);
    // Column-major over (column, row) per chunk, then transposed.
    let parts: Vec<Vec<(f64, f64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = cols
            .chunks(chunk)
            .map(|cs| {
                let xf = &xf;
                s.spawn(move || {
                    let mut out = Vec::with_capacity(cs.len() * m);
                    let mut wr = vec![0f64; k];
                    for &c in cs {
                        for (d, v) in wr.iter_mut().zip(&w[c * k..(c + 1) * k]) {
                            *d = v.to_f64();
                        }
                        for r in 0..m {
                            let xr = &xf[r * k..(r + 1) * k];
                            let (mut sum, mut abs) = (0f64, 0f64);
                            for (a, b) in xr.iter().zip(&wr) {
                                sum += a * b;
                                abs += (a * b).abs();
                            }
                            out.push((sum, abs));
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let flat: Vec<(f64, f64)> = parts.into_iter().flatten().collect();
    let mut out = vec![(0.0, 0.0); m * cols.len()];
    for (ci, _) in cols.iter().enumerate() {
        for r in 0..m {
            out[r * cols.len() + ci] = flat[ci * m + r];
        }
    }
    out
}

/// Compares rows 0..m of `got` ([m + 1, n], row m the sentinel row) on
/// `cols`; returns the worst error relative to its bound.
fn check<O: Copy + Into<f64>>(
    what: &str,
    got: &[O],
    want: &[(f64, f64)],
    m: usize,
    n: usize,
    cols: &[usize],
    bf16_out: bool,
) -> f64 {
    let mut worst = 0f64;
    for r in 0..m {
        for (ci, &c) in cols.iter().enumerate() {
            let g: f64 = got[r * n + c].into();
            let (v, abs) = want[r * cols.len() + ci];
            let bound = ACC_BOUND * abs
                + if bf16_out {
                    BF16_ROUNDING * v.abs()
                } else {
                    0.0
                };
            let err = (g - v).abs();
            assert!(
                g.is_finite() && err <= bound,
                "{what}: y[{r}, {c}] = {g}, want {v} (error {err:.3e} > bound {bound:.3e})"
            );
            worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
        }
    }
    for c in 0..n {
        let g: f64 = got[m * n + c].into();
        assert_eq!(
            g, SENTINEL as f64,
            "{what}: row {m} (past m) written at column {c}"
        );
    }
    worst
}

struct Bufs {
    x: CudaSlice<bf16>,
    y16: CudaSlice<bf16>,
    y32: CudaSlice<f32>,
}

fn fresh_outputs(
    stream: &Arc<CudaStream>,
    m: usize,
    n: usize,
) -> (CudaSlice<bf16>, CudaSlice<f32>) {
    let y16 = stream
        .clone_htod(&vec![bf16::from_f32(SENTINEL); (m + 1) * n])
        .unwrap();
    let y32 = stream.clone_htod(&vec![SENTINEL; (m + 1) * n]).unwrap();
    (y16, y32)
}

fn call<O: GemmOutput>(
    gemm: &Gemm,
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    y: &mut CudaSlice<O>,
    (m, n, k): (usize, usize, usize),
    config: Option<SkinnyConfig>,
) -> Result<(), gdn_kernels::GdnError> {
    match config {
        Some(c) => gemm.linear_skinny(x, w, y, GemmShape::new(m, n, k), c),
        None => gemm.linear_cublas(x, w, y, GemmShape::new(m, n, k)),
    }
}

/// One call per output type (`config` None: cuBLAS), both compared; returns
/// the worst error relative to its bound.
#[allow(clippy::too_many_arguments)]
fn run_and_check(
    gemm: &Gemm,
    what: &str,
    b: &mut Bufs,
    w: &CudaSlice<bf16>,
    dims: (usize, usize, usize),
    cols: &[usize],
    want: &[(f64, f64)],
    config: Option<SkinnyConfig>,
) -> f64 {
    let stream = gemm_stream(b);
    let (m, n, _) = dims;
    call(gemm, &b.x, w, &mut b.y16, dims, config).unwrap_or_else(|e| panic!("{what} bf16: {e}"));
    call(gemm, &b.x, w, &mut b.y32, dims, config).unwrap_or_else(|e| panic!("{what} f32: {e}"));
    let g16: Vec<f32> = stream
        .clone_dtoh(&b.y16)
        .unwrap()
        .iter()
        .map(|v| v.to_f32())
        .collect();
    let g32 = stream.clone_dtoh(&b.y32).unwrap();
    let e16 = check(&format!("{what} bf16"), &g16, want, m, n, cols, true);
    let e32 = check(&format!("{what} f32"), &g32, want, m, n, cols, false);
    // The next call must write every element again.
    let (y16, y32) = fresh_outputs(&stream, m, n);
    b.y16 = y16;
    b.y32 = y32;
    e16.max(e32)
}

fn gemm_stream(b: &Bufs) -> Arc<CudaStream> {
    b.x.stream().clone()
}

#[test]
fn skinny_linear_matches_f64_on_every_4b_shape_row_count_and_config() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let gemm = Gemm::new(stream.clone()).unwrap();
    assert!(
        gemm.skinny().is_some(),
        "the bundle has no skinny_linear cubin for this GPU"
    );
    let mut rng = Rng::new(0x5eed);
    for (si, &(label, n, k)) in SHAPES.iter().enumerate() {
        let w_host = random_bf16(&mut rng, n * k);
        let w = stream.clone_htod(&w_host).unwrap();
        let cols: Vec<usize> = if n <= 20_000 {
            (0..n).collect()
        } else {
            // Both ends (the first and the last tiles) and a random spread.
            let mut c: Vec<usize> = (0..64).chain(n - 64..n).collect();
            c.extend((0..SAMPLED_COLUMNS).map(|_| (rng.next_u64() % n as u64) as usize));
            c.sort_unstable();
            c.dedup();
            c
        };
        let mut worst_skinny = 0f64;
        let mut worst_cublas = 0f64;
        for &m in &ROWS {
            // One row more than m: the kernels must not read it into y.
            let x_host = random_bf16(&mut rng, (m + 1) * k);
            let want = reference(&x_host, &w_host, m, k, &cols);
            let (y16, y32) = fresh_outputs(&stream, m, n);
            let mut b = Bufs {
                x: stream.clone_htod(&x_host).unwrap(),
                y16,
                y32,
            };
            let dims = (m, n, k);
            let what = format!("cuBLAS {label} m={m}");
            let e = run_and_check(&gemm, &what, &mut b, &w, dims, &cols, &want, None);
            worst_cublas = worst_cublas.max(e);
            let mut configs: Vec<SkinnyConfig> = SkinnyConfig::all()
                .into_iter()
                .filter(|c| c.check(m).is_ok())
                .collect();
            configs.push(SkinnyConfig::heuristic(n, k));
            for config in configs {
                let what = format!("skinny {label} m={m} {config:?}");
                let e = run_and_check(&gemm, &what, &mut b, &w, dims, &cols, &want, Some(config));
                worst_skinny = worst_skinny.max(e);
            }
        }
        eprintln!(
            "shape {si} {label} ({n} x {k}, {} columns compared): worst error / bound: skinny {worst_skinny:.3}, cuBLAS {worst_cublas:.3}",
            cols.len()
        );
    }
}

#[test]
fn skinny_linear_refuses_what_it_cannot_run() {
    let Some(stream) = gpu_stream() else {
        return;
    };
    let gemm = Gemm::new(stream.clone()).unwrap();
    let c = SkinnyConfig {
        warps: 4,
        k_unroll: 4,
    };
    let (n, k) = (32usize, 64usize);
    let x = stream.alloc_zeros::<bf16>(17 * k + 8).unwrap();
    let w = stream.alloc_zeros::<bf16>(n * k).unwrap();
    let mut y = stream.alloc_zeros::<f32>(17 * n).unwrap();
    let err = |r: Result<(), gdn_kernels::GdnError>| r.unwrap_err().to_string();
    // 17 rows: past the kernels' 16.
    let e = err(gemm.linear_skinny(&x, &w, &mut y, GemmShape::new(17, n, k), c));
    assert!(e.contains("m = 17"), "{e}");
    // x one element off 16-byte alignment.
    let xs = x.slice(1..);
    let e = err(gemm.linear_skinny(&xs, &w, &mut y, GemmShape::new(2, n, k), c));
    assert!(e.contains("aligned"), "{e}");
    // k not a multiple of 8 (w still exactly [n, k]).
    let w12 = stream.alloc_zeros::<bf16>(n * 12).unwrap();
    let e = err(gemm.linear_skinny(&x, &w12, &mut y, GemmShape::new(2, n, 12), c));
    assert!(e.contains("multiple of 8"), "{e}");
    // w not [n, k]; y too short.
    let e = err(gemm.linear_skinny(&x, &w, &mut y, GemmShape::new(2, n + 1, k), c));
    assert!(e.contains("is not ["), "{e}");
    let e = err(gemm.linear_skinny(&x, &w, &mut y, GemmShape::new(17, n, k), c));
    assert!(e.contains("m = 17") || e.contains("y: has"), "{e}");
    // A configuration the kernels lack.
    let bad = SkinnyConfig {
        warps: 4,
        k_unroll: 8,
    };
    let e = err(gemm.linear_skinny(&x, &w, &mut y, GemmShape::new(9, n, k), bad));
    assert!(e.contains("k_unroll 8"), "{e}");
    // Nothing was launched: y is still zero.
    assert!(stream.clone_dtoh(&y).unwrap().iter().all(|&v| v == 0.0));
}
