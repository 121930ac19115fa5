//! Few-row linear layers on the GPU: cuBLAS and every configuration of our
//! skinny kernels side by side on the Qwen3.5-4B shapes at m = 1, 2, 4, 8,
//! 16, plus the bandwidth of a plain device-to-device copy in the same run
//! (the floor a weight stream can reach).
//!
//! Each timing is a CUDA graph of back-to-back calls (decode steps run as
//! graphs, so host launch costs are out of the figure) cycling through
//! copies of the weights that together exceed the L2 (a decode step reads
//! every weight once: it never finds them in L2); CUDA events around graph
//! launches, median of 5. GB/s counts the bytes a call must move: w, x and
//! y once. The outputs of cuBLAS and of the best skinny configuration are
//! compared (max |difference| over max |cuBLAS|).
//!
//! Prints JSON lines on stdout: `copy`, one `linear` per (shape, m, path),
//! one `best` per (shape, m), and one `step` per m (the 4B's 129 decode
//! GEMMs summed by layer count). Run:
//! `cargo run --release -p gdn-kernels --example skinny_bench`; with
//! `--preset 35b-a3b` the same on Qwen3.5-35B-A3B's dense GEMMs (its
//! mixers, router, shared expert and its gate, lm_head).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream, ValidAsZeroBits};
use gdn_kernels::{Gemm, GemmOutput, GemmShape, ModelOps, SkinnyConfig};
use gdn_kernels_testkit::{gpu_stream, time_graph};
use half::bf16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// (label, n, k, fp32 output, calls per 4B decode step).
const SHAPES: [(&str, usize, usize, bool, usize); 6] = [
    ("deltanet_in_proj", 12352, 2560, false, 24),
    ("out_proj_o_proj", 2560, 4096, false, 32),
    ("attention_qkv", 10240, 2560, false, 8),
    ("mlp_gate_up", 18432, 2560, false, 32),
    ("mlp_down", 2560, 9216, false, 32),
    ("lm_head", 248320, 2560, true, 1),
];
/// The same for Qwen3.5-35B-A3B (30 DeltaNet and 10 attention layers, a
/// router and a shared expert in each of the 40). The router's 264 rows
/// are its 256 experts, the shared expert's gate and 7 zero rows
/// (`MoeShape::router_width`). The shared expert's two GEMMs run from 5
/// rows up (at 1-4 the MoE op's direct path runs it); the step sum counts
/// them at every m.
const SHAPES_35B_A3B: [(&str, usize, usize, bool, usize); 7] = [
    ("deltanet_in_proj", 12352, 2048, false, 30),
    ("out_proj_o_proj", 2048, 4096, false, 40),
    ("attention_qkv", 9216, 2048, false, 10),
    ("router_and_shared_gate", 264, 2048, false, 40),
    ("shared_gate_up", 1024, 2048, false, 40),
    ("shared_down", 2048, 512, false, 40),
    ("lm_head", 248320, 2048, true, 1),
];
const ROWS: [usize; 5] = [1, 2, 4, 8, 16];
/// Weight bytes each timed graph cycles through (the H200's L2 is 50 MB).
const ROTATION_BYTES: usize = 512 << 20;
const COPY_BYTES: usize = 4 << 30;
const COPIES: usize = 5;
const TIMED_LAUNCHES: usize = 5;

/// Device-to-device copy bandwidth measured as `qwen35_bench` does (its
/// decode floor uses it): 5 plain copies of 4 GiB on the stream, timed with
/// events. Not in a graph: the harness's graph of 1 GiB memcpy nodes
/// measured well below the plain copies `qwen35_bench` times (its `copy`
/// line in docs/results/h200-2026-12-01/`skinny_harness-d98e9bf.jsonl`).
fn copy_bandwidth(stream: &Arc<CudaStream>) -> Res<()> {
    let src = stream.alloc_zeros::<u8>(COPY_BYTES)?;
    let mut dst = stream.alloc_zeros::<u8>(COPY_BYTES)?;
    stream.memcpy_dtod(&src, &mut dst)?;
    let ctx = stream.context();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    a.record(stream)?;
    for _ in 0..COPIES {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    b.record(stream)?;
    b.synchronize()?;
    let ms = a.elapsed_ms(&b)? / COPIES as f32;
    let s = ms as f64 * 1e-3;
    println!(
        "{{\"kind\": \"copy\", \"bytes\": {COPY_BYTES}, \"ms\": {ms:.4}, \"gbps_read_plus_write\": {:.1}, \"gbps_read\": {:.1}}}",
        2.0 * COPY_BYTES as f64 / s / 1e9,
        COPY_BYTES as f64 / s / 1e9
    );
    Ok(())
}

/// A path under test: cuBLAS (`None`) or a skinny configuration.
fn call<O: GemmOutput>(
    gemm: &Gemm,
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    y: &mut CudaSlice<O>,
    (m, n, k): (usize, usize, usize),
    config: Option<SkinnyConfig>,
) -> Res<()> {
    match config {
        Some(c) => gemm.linear_skinny(x, w, y, GemmShape::new(m, n, k), c)?,
        None => gemm.linear_cublas(x, w, y, GemmShape::new(m, n, k))?,
    }
    Ok(())
}

fn name(config: Option<SkinnyConfig>) -> String {
    config.map_or("cublas".into(), |c| {
        format!("skinny_w{}_u{}", c.warps, c.k_unroll)
    })
}

/// Times every path on one (shape, m); prints its lines; returns (cuBLAS
/// ms, best skinny ms).
#[allow(clippy::too_many_arguments)]
fn bench_rows<O: GemmOutput + ValidAsZeroBits + Copy + Into<f64>>(
    stream: &Arc<CudaStream>,
    gemm: &Gemm,
    label: &str,
    weights: &[CudaSlice<bf16>],
    x: &CudaSlice<bf16>,
    dims: (usize, usize, usize),
    out: &str,
) -> Res<(f32, f32)> {
    let (m, n, k) = dims;
    let mut y = stream.alloc_zeros::<O>(m * n)?;
    let bytes = (n * k + m * k) * 2 + m * n * std::mem::size_of::<O>();
    // Enough calls that a graph moves >= 1 GB and cycles the copies.
    let calls = weights.len().max((1usize << 30).div_ceil(bytes)).min(256);
    let mut paths: Vec<Option<SkinnyConfig>> = vec![None];
    paths.extend(
        SkinnyConfig::all()
            .into_iter()
            .filter(|c| c.check(m).is_ok())
            .map(Some),
    );
    let heuristic = SkinnyConfig::heuristic(n, k);
    let (mut cublas_ms, mut best) = (f32::NAN, (f32::INFINITY, None));
    let mut heuristic_ms = f32::NAN;
    for path in paths {
        let ms = time_graph(stream, calls, TIMED_LAUNCHES, &mut |i| {
            call(gemm, x, &weights[i % weights.len()], &mut y, dims, path)
        });
        let ms = match ms {
            Ok(ms) => ms,
            Err(e) => {
                println!(
                    "{{\"kind\": \"linear\", \"shape\": \"{label}\", \"m\": {m}, \"path\": \"{}\", \"error\": {:?}}}",
                    name(path),
                    e.to_string()
                );
                continue;
            }
        };
        println!(
            "{{\"kind\": \"linear\", \"shape\": \"{label}\", \"m\": {m}, \"n\": {n}, \"k\": {k}, \"out\": \"{out}\", \"path\": \"{}\", \"ms\": {ms:.5}, \"gbps\": {:.1}}}",
            name(path),
            bytes as f64 / (ms as f64 * 1e-3) / 1e9
        );
        match path {
            None => cublas_ms = ms,
            Some(c) => {
                if ms < best.0 {
                    best = (ms, Some(c));
                }
                if c == heuristic {
                    heuristic_ms = ms;
                }
            }
        }
    }
    // The best configuration's output against cuBLAS's.
    let mut diff = f64::NAN;
    if let (_, Some(c)) = best {
        call(gemm, x, &weights[0], &mut y, dims, None)?;
        let want = stream.clone_dtoh(&y)?;
        call(gemm, x, &weights[0], &mut y, dims, Some(c))?;
        let got = stream.clone_dtoh(&y)?;
        let scale = want.iter().map(|&v| v.into().abs()).fold(0f64, f64::max);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a.into() - b.into()).abs())
            .fold(0f64, f64::max);
        diff = worst / scale.max(f64::MIN_POSITIVE);
    }
    let gbps = |ms: f32| bytes as f64 / (ms as f64 * 1e-3) / 1e9;
    println!(
        "{{\"kind\": \"best\", \"shape\": \"{label}\", \"m\": {m}, \"n\": {n}, \"k\": {k}, \"cublas_ms\": {cublas_ms:.5}, \"cublas_gbps\": {:.1}, \"skinny_ms\": {:.5}, \"skinny_gbps\": {:.1}, \"skinny_config\": \"{}\", \"heuristic_config\": \"{}\", \"heuristic_ms\": {heuristic_ms:.5}, \"speedup_vs_cublas\": {:.3}, \"max_rel_diff_vs_cublas\": {diff:.2e}}}",
        gbps(cublas_ms),
        best.0,
        gbps(best.0),
        name(best.1),
        name(Some(heuristic)),
        cublas_ms / best.0
    );
    Ok((cublas_ms, best.0))
}

fn main() -> Res<()> {
    let Some(default) = gpu_stream() else {
        return Ok(());
    };
    // A stream of our own: the legacy default stream cannot be captured
    // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on the H200).
    let stream = default.context().new_stream()?;
    let started = std::time::Instant::now();
    // One stream, no cross-stream hazards: cudarc's per-buffer events would
    // only add work to the captured graphs.
    // SAFETY: every buffer of this program is used on `stream` alone.
    unsafe { stream.context().disable_event_tracking() };
    let ops = ModelOps::new(stream.clone())?;
    let gemm = Gemm::new(stream.clone())?;
    if gemm.skinny().is_none() {
        return Err("the bundle has no skinny_linear cubin for this GPU".into());
    }
    copy_bandwidth(&stream)?;
    let args: Vec<String> = std::env::args().collect();
    let shapes: &[(&str, usize, usize, bool, usize)] = match args
        .iter()
        .position(|a| a == "--preset")
        .map(|i| args.get(i + 1))
    {
        None => &SHAPES,
        Some(Some(p)) if p == "4b" => &SHAPES,
        Some(Some(p)) if p == "35b-a3b" => &SHAPES_35B_A3B,
        Some(p) => return Err(format!("--preset takes 4b or 35b-a3b, got {p:?}").into()),
    };
    let gemms: usize = shapes.iter().map(|s| s.4).sum();
    // Per m: (cuBLAS, best skinny) summed over a decode step's GEMMs.
    let mut step = vec![(0f64, 0f64); ROWS.len()];
    for &(label, n, k, f32_out, per_step) in shapes {
        let copies = ROTATION_BYTES.div_ceil(n * k * 2).max(1);
        let mut weights = Vec::new();
        for c in 0..copies {
            let mut w = stream.alloc_zeros::<bf16>(n * k)?;
            ops.fill_uniform_bf16(&mut w, 7 + c as u64, 0.05, 0.0)?;
            weights.push(w);
        }
        let mut x = stream.alloc_zeros::<bf16>(16 * k)?;
        ops.fill_uniform_bf16(&mut x, 3, 1.0, 0.0)?;
        for (i, &m) in ROWS.iter().enumerate() {
            let dims = (m, n, k);
            let (c, s) = if f32_out {
                bench_rows::<f32>(&stream, &gemm, label, &weights, &x, dims, "f32")?
            } else {
                bench_rows::<bf16>(&stream, &gemm, label, &weights, &x, dims, "bf16")?
            };
            step[i].0 += c as f64 * per_step as f64;
            step[i].1 += s.min(c) as f64 * per_step as f64;
        }
    }
    for (i, &m) in ROWS.iter().enumerate() {
        println!(
            "{{\"kind\": \"step\", \"m\": {m}, \"gemms\": {gemms}, \"cublas_ms\": {:.4}, \"best_of_both_ms\": {:.4}}}",
            step[i].0, step[i].1
        );
    }
    eprintln!("skinny_bench: {:.1} s", started.elapsed().as_secs_f32());
    Ok(())
}
