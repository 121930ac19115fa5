//! GDN prefill benchmark on the GPU: the FlashInfer bundle path (as shipped
//! and with our value-dimension split, `flashinfer-vsplit`), the CuTe DSL
//! SM90 kernels (non-CP and context-parallel) and the portable fallback,
//! through the same `GdnPrefill::run` the model uses. A backend the GPU
//! cannot run is reported as skipped.
//! CUDA events around each call, warm-up first, median of the timed runs.
//! Prints one JSON object per (shape, backend) on stdout.
//!
//! Run: `cargo run --release -p gdn-kernels --example gdn_bench [LABEL...]`
//! (with labels, only the shapes whose label contains one of them, e.g.
//! `1x1024`).

use gdn_kernels::{BackendRequest, GdnGeometry, GdnPrefill};
use gdn_kernels_testkit::{gpu_stream, Problem};

/// (label, Hqk, Hv, sequence lengths)
const SHAPES: &[(&str, usize, usize, &[usize])] = &[
    // The 4B's GDN layers in a 512- and a 1024-token prefill.
    ("4B 1x512", 16, 32, &[512]),
    ("4B 1x1024", 16, 32, &[1024]),
    ("4B 1x2048", 16, 32, &[2048]),
    ("4B 1x8192", 16, 32, &[8192]),
    ("4B 1x65536", 16, 32, &[65536]),
    ("4B 4x2048", 16, 32, &[2048; 4]),
    ("4B 8x8192", 16, 32, &[8192; 8]),
    ("27B 1x8192", 16, 48, &[8192]),
];

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(stream) = gpu_stream() else {
        return Ok(());
    };
    let ctx = stream.context().clone();
    eprintln!(
        "bundle FlashInfer cubins: {}",
        gdn_kernels::flashinfer_cubin_identity()
    );
    let only: Vec<String> = std::env::args().skip(1).collect();
    let picked = SHAPES
        .iter()
        .filter(|(label, ..)| only.is_empty() || only.iter().any(|o| label.contains(o.as_str())));
    for &(label, hq, hv, lens) in picked {
        let g = GdnGeometry {
            num_qk_heads: hq,
            num_v_heads: hv,
            head_dim: 128,
        };
        let p = Problem::random(1, g, lens, false);
        let mut d = p.upload(&stream)?;
        for request in [
            BackendRequest::Auto,
            BackendRequest::FlashInfer,
            BackendRequest::CuteDslSm90,
            BackendRequest::CuteDslSm90Cp,
            BackendRequest::Portable,
            // Last in each shape: never run before, and a device fault would
            // poison the context for the backends after it.
            BackendRequest::FlashInferVsplit,
        ] {
            let mut op = match GdnPrefill::new(stream.clone(), g, request) {
                Ok(op) => op,
                Err(e) => {
                    println!("{{\"shape\": \"{label}\", \"backend\": \"{request:?}\", \"skipped\": {:?}}}", e.to_string());
                    continue;
                }
            };
            // A backend that fails at run time is reported, not fatal: the
            // other backends' numbers still come out of the same run.
            let mut time = || -> Result<Vec<f32>, Box<dyn std::error::Error>> {
                for _ in 0..3 {
                    d.run(&mut op)?;
                }
                stream.synchronize()?;
                let mut times = vec![];
                let started = std::time::Instant::now();
                while times.len() < 10
                    || (times.len() < 200 && started.elapsed().as_secs_f32() < 2.0)
                {
                    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
                    a.record(&stream)?;
                    d.run(&mut op)?;
                    b.record(&stream)?;
                    b.synchronize()?;
                    times.push(a.elapsed_ms(&b)?);
                }
                Ok(times)
            };
            match time() {
                Ok(times) => println!(
                    "{{\"shape\": \"{label}\", \"backend\": \"{}\", \"median_ms\": {:.4}, \"min_ms\": {:.4}, \"runs\": {}}}",
                    if request == BackendRequest::Auto {
                        format!("auto ({})", op.last_backend())
                    } else {
                        op.backend().to_string()
                    },
                    median(times.clone()),
                    times.iter().cloned().fold(f32::INFINITY, f32::min),
                    times.len()
                ),
                Err(e) => println!(
                    "{{\"shape\": \"{label}\", \"backend\": \"{}\", \"error\": {:?}}}",
                    op.backend(),
                    e.to_string()
                ),
            }
        }
    }
    Ok(())
}
