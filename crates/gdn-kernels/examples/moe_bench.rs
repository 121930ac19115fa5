//! The routed experts of a Qwen3.5-35B-A3B MoE layer (E = 256, top-8,
//! H = 2048, I = 512, random bf16 weights and router logits; no shared
//! expert) on the expert paths of `ModelOps::moe_experts` (the direct path
//! at T <= 4), at decode batches (T = 1, 2, 4, 8, 32, 64, 128), mixed
//! steps (256, 512) and prefill chunks (T = 1024, 8192), against the memory
//! floor of the weights the batch touches: the distinct experts in its
//! routing (counted on the host from the op's ids after a run) times one
//! expert's gate_up and down bytes, plus x and out, at the device's copy
//! bandwidth (`gdn_kernels_testkit::copy_bandwidth`). The table sets the
//! direct / GEMV / tensor-core rule in `model_ops/moe.rs`
//! (docs/performance.md).
//!
//! Each timing is a CUDA graph of calls cycling through `LAYERS` layers'
//! weights and routings (the touched experts of one layer fit the L2; a
//! decode step reads each layer's once), CUDA events around graph
//! launches, median of 5. Run (about a minute on an H200, 7 GiB):
//! `cargo run --release -p gdn-kernels --example moe_bench`

use std::collections::BTreeSet;

use cudarc::driver::CudaSlice;
use gdn_kernels::{moe_path, ModelOps, MoeExperts, MoePath, MoeScratch, MoeShape};
use gdn_kernels_testkit::{copy_bandwidth, gpu_stream, time_graph};
use half::bf16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const SHAPE: MoeShape = MoeShape {
    experts: 256,
    top_k: 8,
    hidden: 2048,
    inter: 512,
    shared_inter: 0,
};
const TOKENS: [usize; 11] = [1, 2, 4, 8, 32, 64, 128, 256, 512, 1024, 8192];
/// Weight sets cycled through (4 x 1.6 GB: well past the 50 MB L2).
const LAYERS: usize = 4;
const TIMED_LAUNCHES: usize = 5;

struct Layer {
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
}

fn main() -> Res<()> {
    let Some(default) = gpu_stream() else {
        return Ok(());
    };
    // A stream of its own: the legacy default stream cannot be captured,
    // and every timing below is a captured graph (which also shows the op
    // is graph-safe).
    let stream = default.context().new_stream()?;
    // One stream, no cross-stream hazards, as in the model: cudarc's
    // per-buffer events would only tie the captures to uncaptured work.
    // SAFETY: every buffer of this program is used on `stream` alone.
    unsafe { stream.context().disable_event_tracking() };
    let ops = ModelOps::new(stream.clone())?;
    let bandwidth = copy_bandwidth(&stream)?;
    let (h, i, k) = (SHAPE.hidden, SHAPE.inter, SHAPE.top_k);
    let expert_bytes = 3 * h * i * 2;
    let layers: Vec<Layer> = (0..LAYERS)
        .map(|l| -> Res<Layer> {
            let mut gate_up = stream.alloc_zeros::<bf16>(SHAPE.gate_up_len())?;
            let mut down = stream.alloc_zeros::<bf16>(SHAPE.down_len())?;
            let scale = (3.0 / h as f32).sqrt();
            ops.fill_uniform_bf16(&mut gate_up, 10 + l as u64, scale, 0.0)?;
            ops.fill_uniform_bf16(&mut down, 20 + l as u64, (3.0 / i as f32).sqrt(), 0.0)?;
            Ok(Layer { gate_up, down })
        })
        .collect::<Res<_>>()?;
    let max_t = *TOKENS.iter().max().unwrap();
    let mut scratch = MoeScratch::new(&stream, SHAPE, max_t)?;
    println!(
        "copy bandwidth {:.0} GB/s (bytes moved); expert weights {:.2} MB each",
        bandwidth / 1e9,
        expert_bytes as f64 / 1e6
    );
    println!(
        "{:>6} {:>10} {:>8} {:>10} {:>10} {:>7} {:>8} {:>6}",
        "T", "path", "experts", "us", "floor_us", "x_floor", "TFLOP/s", "rule"
    );
    for &t in &TOKENS {
        let mut x = stream.alloc_zeros::<bf16>(t * h)?;
        ops.fill_uniform_bf16(&mut x, 1, 1.0, 0.0)?;
        let mut out = stream.alloc_zeros::<bf16>(t * h)?;
        let logits: Vec<CudaSlice<bf16>> = (0..LAYERS)
            .map(|l| -> Res<CudaSlice<bf16>> {
                let mut g = stream.alloc_zeros::<bf16>(t * SHAPE.experts)?;
                ops.fill_uniform_bf16(&mut g, 100 + l as u64, 3.0, 0.0)?;
                Ok(g)
            })
            .collect::<Res<_>>()?;
        // Distinct experts each layer's routing touches.
        let mut touched = 0usize;
        for (l, layer) in layers.iter().enumerate() {
            let experts = MoeExperts {
                gate_up: &layer.gate_up,
                down: &layer.down,
            };
            ops.moe_experts(
                &x,
                &logits[l],
                experts,
                None,
                &mut scratch,
                &mut out,
                MoePath::Auto,
            )?;
            let ids = stream.clone_dtoh(&scratch.ids().slice(..t * k))?;
            touched += ids.iter().collect::<BTreeSet<_>>().len();
        }
        let touched_per_layer = touched as f64 / LAYERS as f64;
        let bytes = touched_per_layer * expert_bytes as f64 + 2.0 * (t * h * 2) as f64;
        let floor_us = bytes / bandwidth * 1e6;
        let flops = 2.0 * (t * k) as f64 * 3.0 * (h * i) as f64;
        let rule = moe_path(t, SHAPE);
        let direct = (t <= gdn_kernels::MOE_DIRECT_MAX_TOKENS).then_some(MoePath::Direct);
        let grouped = [MoePath::Gemv, MoePath::GemvTensorCore, MoePath::TensorCore];
        for path in direct.into_iter().chain(grouped) {
            let ms = time_graph(&stream, 2 * LAYERS, TIMED_LAUNCHES, &mut |c| {
                let (l, layer) = (c % LAYERS, &layers[c % LAYERS]);
                let experts = MoeExperts {
                    gate_up: &layer.gate_up,
                    down: &layer.down,
                };
                ops.moe_experts(&x, &logits[l], experts, None, &mut scratch, &mut out, path)?;
                Ok(())
            })?;
            let us = ms as f64 * 1e3;
            println!(
                "{t:>6} {:>10} {touched_per_layer:>8.1} {us:>10.1} {floor_us:>10.1} {:>7.2} {:>8.1} {:>6}",
                format!("{path:?}"),
                us / floor_us,
                flops / (us * 1e-6) / 1e12,
                if rule == path { "<-" } else { "" }
            );
        }
    }
    Ok(())
}
