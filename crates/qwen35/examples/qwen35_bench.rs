//! Benchmark (not a test) of the GPU runtime on a full-size Qwen3.5 with
//! random weights generated on the device (`--preset 4b`, the default, or
//! `--preset 35b-a3b`, the MoE model): prefill throughput at 1k and 8k
//! tokens, decode step latency at batch 1, 16 and 64, peak GPU memory, next to
//! the roofline from this GPU's measured copy bandwidth and bf16 GEMM rate.
//! Decode lines also carry the full memory floor of a step (the weights it
//! reads, every sequence's KV at the context, and its recurrent + conv state
//! read and written) at the measured copy bandwidth, and the step's ratio to
//! it. A MoE step reads only the routed experts its rows touch: the floor
//! counts the expected distinct experts under uniform routing
//! (`qwen35_testkit::floor`, docs/performance.md). Prints one JSON object per
//! line. Run on the GPU machine:
//!
//!     cargo run --release -p qwen35 --example qwen35_bench
//!     cargo run --release -p qwen35 --example qwen35_bench -- --preset 35b-a3b
//!
//! Decode steps run at `--contexts` tokens per sequence (default 1024; the
//! sequences stand at that length without a prefill: their KV and state are
//! whatever the cache holds, which does not change a step's time; each row
//! decodes a different token, so a MoE batch routes row by row as real
//! traffic does; a (batch, context) whose KV would not fit the GPU is
//! skipped). Logits stay on the device (`LogitsTo::DeviceOnly`): sampling is
//! not part of the forward.
//! Slots and pages are handed out by the test kit's stand-in for the
//! engine's allocator (`qwen35_testkit::alloc`).
//! Arguments (optional) pick parts: `prefill`, `decode`, `mixed` (default:
//! all), and `--decode-batches 1,16,64`, `--prefill-lens 1024,8192` (the
//! prompt lengths to time; the server's TTFT breakdown passes the lengths
//! its tokenizer gave), `--swiglu unfused,auto` (the MLP gate/up + SwiGLU
//! routes each prefill length is timed with, in that order: side by side in
//! one run; default `auto`), `--preset 4b|35b-a3b` (the random model's
//! config), `--model DIR` (a Hugging Face checkpoint's weights and config
//! instead of a preset: the served model's own), `--state-dtype
//! auto|float32|bfloat16` (the recurrent state's storage, as the server's
//! `--mamba-ssm-cache-dtype`; the memory floor follows it). `mixed` times a step of decode rows
//! plus one 512-token prefill chunk against the two run as separate steps
//! (eagerly, both): a mixed step should cost what its parts cost.

use std::time::Instant;

use cudarc::driver::{sys, CudaSlice, CudaStream, DriverError};
use engine::{PageId, SlotId};
use gdn_kernels::{Gemm, GemmShape};
use half::bf16;
use qwen35::gpu::{GpuModel, GpuOptions, LogitsTo};
use qwen35::{Config, LayerType, RowLogits};
use qwen35_testkit::alloc::{SeqId, Seqs};
use qwen35_testkit::floor::MlpParams;

const PAGE: usize = 64;

/// `--preset`'s random models: the flag's value, the name the model line
/// prints, the `config.json` text.
const PRESETS: [(&str, &str, &str); 2] = [
    ("4b", "Qwen3.5-4B", qwen35::config::QWEN35_4B_TEXT),
    (
        "35b-a3b",
        "Qwen3.5-35B-A3B",
        qwen35::config::QWEN35_35B_A3B_TEXT,
    ),
];

fn used_bytes() -> usize {
    let (free, total) = cudarc::driver::result::mem_get_info().expect("mem_get_info");
    total - free
}

/// Hands the device memory pool's unused reservations back to the driver,
/// so that `mem_get_info` counts them as free. The model keeps what the
/// pool reserved (`qwen35::gpu::keep_pool_memory`), and the caches of
/// earlier (batch, context) pairs are pool allocations too: without this,
/// their freed memory would stay reserved and a larger cache would look as
/// if it did not fit (next to the 35B-A3B's weights, the largest decode
/// caches could be skipped for it).
fn trim_pool(stream: &CudaStream) -> Result<(), DriverError> {
    stream.synchronize()?;
    let ctx = stream.context();
    ctx.bind_to_thread()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver calls on this context's device pool after the
    // stream drained, so no allocation is in flight; `pool` outlives them.
    unsafe {
        sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()).result()?;
        sys::cuMemPoolTrimTo(pool, 0).result()?;
    }
    Ok(())
}

/// A different token for each row of a decode step: rows with one token
/// and zeroed state would route alike and touch only one row's experts.
fn row_tokens(rows: usize) -> Vec<[u32; 1]> {
    (0..rows as u32)
        .map(|r| [(r * 7919) % 200_000 + 10])
        .collect()
}

/// `flag`'s comma list (default `auto`), each name with what `parse` makes
/// of it, in order.
fn modes<T>(args: &[String], flag: &str, parse: impl Fn(&str) -> T) -> Vec<(String, T)> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or("auto", String::as_str)
        .split(',')
        .map(|m| (m.to_string(), parse(m)))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let part = |p: &str| {
        !args
            .iter()
            .any(|a| a == "prefill" || a == "decode" || a == "mixed")
            || args.iter().any(|a| a == p)
    };
    let batches: Vec<usize> = args
        .iter()
        .position(|a| a == "--decode-batches")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.split(',')
                .map(|b| b.parse().expect("batch size"))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 16, 64]);
    let prefill_lens: Vec<usize> = args
        .iter()
        .position(|a| a == "--prefill-lens")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.split(',')
                .map(|n| n.parse().expect("prefill length"))
                .collect()
        })
        .unwrap_or_else(|| vec![1024, 8192]);
    let swiglu_modes = modes(&args, "--swiglu", |m| match m {
        "auto" => gdn_kernels::SwigluRequest::Auto,
        "unfused" => gdn_kernels::SwigluRequest::Unfused,
        "fused" => gdn_kernels::SwigluRequest::Fused,
        _ => panic!("--swiglu takes auto, unfused or fused, got {m:?}"),
    });
    let contexts: Vec<usize> = args
        .iter()
        .position(|a| a == "--contexts")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(|n| n.parse().expect("context")).collect())
        .unwrap_or_else(|| vec![1024]);
    // `--attention auto,ours`: each decode (batch, context) is timed with
    // these attention kernels in turn, side by side.
    let attention_modes = modes(&args, "--attention", |m| match m {
        "auto" => gdn_kernels::AttentionRequest::Auto,
        "ours" => gdn_kernels::AttentionRequest::Ours,
        "tc" => gdn_kernels::AttentionRequest::DecodeTensorCore,
        _ => panic!("--attention takes auto, ours or tc, got {m:?}"),
    });
    // `--moe auto,gemv`: each decode (batch, context) of a MoE model is
    // timed with these expert kernels in turn (`gemv`, the CUDA-core GEMV
    // tiles, is what decode ran before the direct and tensor-core GEMV
    // paths).
    let moe_modes = modes(&args, "--moe", |m| match m {
        "auto" => gdn_kernels::MoePath::Auto,
        "direct" => gdn_kernels::MoePath::Direct,
        "gemv" => gdn_kernels::MoePath::Gemv,
        "gemv_tc" => gdn_kernels::MoePath::GemvTensorCore,
        "tc" => gdn_kernels::MoePath::TensorCore,
        _ => panic!("--moe takes auto, direct, gemv, gemv_tc or tc, got {m:?}"),
    });
    let model_dir = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let state_dtype: qwen35::StateDtypeRequest = args
        .iter()
        .position(|a| a == "--state-dtype")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(qwen35::StateDtypeRequest::Auto), |v| v.parse())?;
    let preset_arg = args
        .iter()
        .position(|a| a == "--preset")
        .and_then(|i| args.get(i + 1));
    if preset_arg.is_some() && model_dir.is_some() {
        return Err("--preset picks a random model; --model DIR reads its own config".into());
    }
    let preset = preset_arg.map_or("4b", String::as_str);
    let &(_, preset_name, preset_config) = PRESETS
        .iter()
        .find(|(flag, _, _)| *flag == preset)
        .ok_or_else(|| format!("--preset takes 4b or 35b-a3b, got {preset:?}"))?;
    let options = GpuOptions {
        state_dtype,
        ..GpuOptions::default()
    };
    let stream = GpuModel::default_stream()?;
    let ctx = stream.context().clone();
    let name = ctx.name()?;
    let base = used_bytes();
    let mut peak = base;
    let note = |p: &mut usize| *p = (*p).max(used_bytes());

    // 1. Machine rates: device copy bandwidth and the bf16 GEMM rate.
    let copy_bw = gdn_kernels_testkit::copy_bandwidth(&stream)?;
    let gemm = Gemm::new(stream.clone())?;
    let n = 8192;
    let a: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    let w: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    let mut y: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    gemm.linear(&a, &w, &mut y, GemmShape::new(n, n, n))?;
    stream.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..10 {
        gemm.linear(&a, &w, &mut y, GemmShape::new(n, n, n))?;
    }
    stream.synchronize()?;
    let gemm_rate = 10.0 * 2.0 * (n as f64).powi(3) / t0.elapsed().as_secs_f64();
    drop((a, w, y));
    println!(
        "{{\"gpu\": {name:?}, \"copy_bandwidth_gbs\": {:.0}, \"bf16_gemm_tflops\": {:.0}}}",
        copy_bw / 1e9,
        gemm_rate / 1e12
    );

    // 2. The model.
    let (mut model, model_name) = match &model_dir {
        Some(dir) => {
            let config = Config::from_file(&dir.join("config.json"))?;
            let weights = qwen35::Weights::open(dir)?;
            let name = format!("{} ({})", dir.display(), config.architecture());
            let model = GpuModel::load(config, &weights, stream.clone(), options)?;
            (model, name)
        }
        None => {
            let config = Config::from_json(preset_config)?;
            let model = GpuModel::random(config, 7, stream.clone(), options)?;
            (model, format!("{preset_name} (random bf16 weights)"))
        }
    };
    let c = model.config.clone();
    stream.synchronize()?;
    note(&mut peak);
    let weights = used_bytes() - base;
    // Matrix parameters a token multiplies by (all but the embedding table;
    // the lm_head, tied or not, is counted once per step, for the one row
    // that gets logits). A MoE layer counts its router, shared expert and
    // gate, and the token's top-k experts.
    let (h, v) = (c.hidden_size, c.vocab_size);
    // The model's own fused projection widths (gdn_kernels shapes).
    let dn = gdn_kernels::DeltaNetShape {
        qk_heads: c.linear_num_key_heads,
        v_heads: c.linear_num_value_heads,
        conv_kernel: c.linear_conv_kernel_dim,
    };
    let attn = gdn_kernels::AttentionShape {
        q_heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim(),
    };
    let mixer = |t: &LayerType| match t {
        LayerType::Linear => h * dn.proj_width() + dn.v_heads * gdn_kernels::HEAD_DIM * h,
        LayerType::Full => h * attn.proj_width() + attn.q_heads * attn.head_dim * h,
    };
    let mixer_params: usize = c.layer_types.iter().map(mixer).sum();
    let mlp = MlpParams::of(&c);
    let layers = c.num_hidden_layers;
    let params_per_token = mixer_params + layers * mlp.per_token();
    // Weight bytes a decode step of `batch` rows reads: every matrix but the
    // routed experts once, plus the experts the rows touch (none when dense).
    let weight_bytes_read = |batch: usize| {
        2.0 * ((mixer_params + layers * mlp.always + v * h) as f64
            + layers as f64 * mlp.routed_read(batch))
    };
    println!(
        "{{\"model\": {model_name:?}, \"gdn_backend\": \"{}\", \"weights_gib\": {:.2}, \"matrix_params_per_token\": {params_per_token}}}",
        model.gdn_backend(),
        weights as f64 / (1u64 << 30) as f64
    );

    // 3. Prefill: one sequence, logits for its last token.
    let prefill_lens: &[usize] = if part("prefill") { &prefill_lens } else { &[] };
    for (&len, (mode, request)) in prefill_lens
        .iter()
        .flat_map(|l| swiglu_modes.iter().map(move |m| (l, m)))
    {
        model.set_swiglu_request(*request);
        let tokens: Vec<u32> = (0..len as u32).map(|t| (t * 7919) % 200_000 + 10).collect();
        let mut times = vec![];
        // The first run warms up; best and median of the other five.
        for _ in 0..6 {
            let mut cache = model.new_cache(1, len.div_ceil(PAGE) + 1, PAGE)?;
            let mut seqs = Seqs::all_of(&cache);
            let id = seqs.add();
            stream.synchronize()?;
            let t0 = Instant::now();
            seqs.step_to(
                &mut model,
                &mut cache,
                &[(id, &tokens)],
                RowLogits::Last,
                LogitsTo::DeviceOnly,
            )?;
            times.push(t0.elapsed().as_secs_f64());
            note(&mut peak);
        }
        let best = times[1..].iter().cloned().fold(f64::MAX, f64::min);
        let mut timed = times[1..].to_vec();
        timed.sort_by(f64::total_cmp);
        let median = timed[timed.len() / 2];
        let flops = 2.0 * params_per_token as f64 * len as f64;
        println!(
            "{{\"prefill_tokens\": {len}, \"swiglu\": {mode:?}, \"ms\": {:.2}, \"median_ms\": {:.2}, \"tokens_per_s\": {:.0}, \"gemm_roofline_ms\": {:.2}, \"fraction_of_roofline\": {:.2}}}",
            best * 1e3,
            median * 1e3,
            len as f64 / best,
            flops / gemm_rate * 1e3,
            flops / gemm_rate / best
        );
    }

    // Decode and mixed steps run the default rule.
    model.set_swiglu_request(gdn_kernels::SwigluRequest::Auto);
    let (slot_bytes, page_bytes) = model.slot_and_page_bytes(PAGE);

    // 4. Decode: `batch` sequences at `context` tokens each, one token per
    // step.
    let decode_batches = if part("decode") { batches } else { vec![] };
    for &context in &contexts {
        for &batch in &decode_batches {
            let settings = attention_modes.iter().flat_map(|a| {
                moe_modes
                    .iter()
                    .flat_map(move |m| [(a, m, false), (a, m, true)])
            });
            for ((attention, request), (moe, moe_path), graphs) in settings {
                model.set_attention_request(*request)?;
                model.set_moe_path(*moe_path);
                let pages = batch * ((context + 64).div_ceil(PAGE) + 1);
                trim_pool(&stream)?;
                let (free, _) = cudarc::driver::result::mem_get_info()?;
                let need = (pages + 1) * page_bytes + (batch + 1) * slot_bytes;
                if need + (4usize << 30) > free {
                    println!(
                        "{{\"decode_batch\": {batch}, \"context\": {context}, \"cuda_graphs\": {graphs}, \"skipped\": \"the KV cache needs {:.1} GiB, {:.1} GiB free\"}}",
                        need as f64 / (1u64 << 30) as f64,
                        free as f64 / (1u64 << 30) as f64
                    );
                    continue;
                }
                // One more slot and page: the graphs' padding rows.
                let mut cache = model.new_cache(batch + 1, pages + 1, PAGE)?;
                if graphs {
                    model.capture_decode_graphs(
                        &mut cache,
                        &[batch],
                        context + 64,
                        SlotId(batch as u32),
                        PageId(pages as u32),
                    )?;
                }
                let mut seqs = Seqs::new(batch, pages, PAGE);
                let ids: Vec<_> = (0..batch).map(|_| seqs.add()).collect();
                for &id in &ids {
                    seqs.skip_to(id, context);
                }
                let mut forward = |step: &[(SeqId, &[u32])]| {
                    seqs.step_to(
                        &mut model,
                        &mut cache,
                        step,
                        RowLogits::Last,
                        LogitsTo::DeviceOnly,
                    )
                    .map(drop)
                };
                let toks = row_tokens(batch);
                let step: Vec<_> = ids.iter().zip(&toks).map(|(id, t)| (*id, &t[..])).collect();
                // Warm-up.
                let warm = (0..3).try_for_each(|_| forward(&step));
                if let Err(e) = warm {
                    println!(
                        "{{\"decode_batch\": {batch}, \"context\": {context}, \"cuda_graphs\": {graphs}, \"error\": {:?}}}",
                        e.to_string()
                    );
                    continue;
                }
                let steps = 20;
                let t0 = Instant::now();
                for _ in 0..steps {
                    forward(&step)?;
                }
                let dt = t0.elapsed().as_secs_f64() / steps as f64;
                note(&mut peak);
                let weight_bytes = weight_bytes_read(batch);
                let roofline = weight_bytes / copy_bw;
                // The full floor (the decode goal of docs/performance.md): a
                // step must also read every sequence's KV and read and write
                // its recurrent and conv state.
                let per_seq = context * page_bytes / PAGE + 2 * slot_bytes;
                let floor = (weight_bytes + (batch * per_seq) as f64) / copy_bw;
                let kv_floor = (batch * context * page_bytes / PAGE) as f64 / copy_bw;
                // MoE only: the expected distinct experts per layer.
                let experts = match c.moe {
                    Some(_) => format!(
                        ", \"experts_touched_per_layer\": {:.1}",
                        mlp.experts_touched(batch)
                    ),
                    None => String::new(),
                };
                println!(
                    "{{\"decode_batch\": {batch}, \"cuda_graphs\": {graphs}, \"context\": {context}, \"attention\": {attention:?}, \"moe\": {moe:?}, \"state_dtype\": \"{}\", \"step_ms\": {:.3}, \"tokens_per_s\": {:.0}, \"weights_roofline_ms\": {:.3}, \"fraction_of_roofline\": {:.2}, \"kv_floor_ms\": {:.3}, \"memory_floor_ms\": {:.3}, \"step_over_floor\": {:.2}{experts}}}",
                    model.state_dtype(),
                    dt * 1e3,
                    batch as f64 / dt,
                    roofline * 1e3,
                    roofline / dt,
                    kv_floor * 1e3,
                    floor * 1e3,
                    dt / floor
                );
            }
        }
    }
    model.set_attention_request(gdn_kernels::AttentionRequest::Auto)?;
    model.set_moe_path(gdn_kernels::MoePath::Auto);
    // 5. Mixed steps: `batch` decode rows at a 1024-token context plus a 512-token chunk
    // of a new sequence, against the decode step and the prefill alone.
    const CONTEXT: usize = 1024;
    let mixed_batches: &[usize] = if part("mixed") { &[16, 64] } else { &[] };
    for &batch in mixed_batches {
        let chunk: Vec<u32> = (0..512u32).map(|t| (t * 13) % 200_000 + 10).collect();
        let reps = 5;
        // Each rep: one decode step per layout, one fresh chunk sequence.
        let per_seq = (CONTEXT + 3 * reps + 8).div_ceil(PAGE) + 1;
        let pages = (batch + 3 * reps) * per_seq.max(chunk.len().div_ceil(PAGE) + 1);
        let mut cache = model.new_cache(batch + 3 * reps, pages, PAGE)?;
        let mut seqs = Seqs::new(batch + 3 * reps, pages, PAGE);
        let ids: Vec<_> = (0..batch).map(|_| seqs.add()).collect();
        let prompt: Vec<u32> = (0..CONTEXT as u32)
            .map(|t| (t * 31) % 200_000 + 10)
            .collect();
        let mut forward = |seqs: &mut Seqs, step: &[(SeqId, &[u32])]| {
            seqs.step_to(
                &mut model,
                &mut cache,
                step,
                RowLogits::Last,
                LogitsTo::DeviceOnly,
            )
            .map(drop)
        };
        for group in ids.chunks(8) {
            let step: Vec<_> = group.iter().map(|id| (*id, prompt.as_slice())).collect();
            forward(&mut seqs, &step)?;
        }
        let toks = row_tokens(batch);
        let decode: Vec<_> = ids.iter().zip(&toks).map(|(id, t)| (*id, &t[..])).collect();
        let (mut t_decode, mut t_prefill, mut t_mixed) = (vec![], vec![], vec![]);
        for _ in 0..reps {
            let t0 = Instant::now();
            forward(&mut seqs, &decode)?;
            t_decode.push(t0.elapsed().as_secs_f64());
            let fresh = seqs.add();
            let t0 = Instant::now();
            forward(&mut seqs, &[(fresh, &chunk)])?;
            t_prefill.push(t0.elapsed().as_secs_f64());
            let fresh = seqs.add();
            let mut mixed = decode.clone();
            mixed.push((fresh, &chunk));
            let t0 = Instant::now();
            forward(&mut seqs, &mixed)?;
            t_mixed.push(t0.elapsed().as_secs_f64());
        }
        // The first rep warms up.
        let best = |v: &[f64]| v[1..].iter().cloned().fold(f64::MAX, f64::min);
        let (d, p, m) = (best(&t_decode), best(&t_prefill), best(&t_mixed));
        println!(
            "{{\"mixed_decode_rows\": {batch}, \"prefill_chunk\": {}, \"context\": {CONTEXT}, \"decode_ms\": {:.3}, \"prefill_ms\": {:.3}, \"mixed_ms\": {:.3}, \"mixed_over_parts\": {:.2}}}",
            chunk.len(),
            d * 1e3,
            p * 1e3,
            m * 1e3,
            m / (d + p)
        );
        note(&mut peak);
    }
    println!(
        "{{\"peak_gpu_memory_gib\": {:.2}, \"baseline_gib\": {:.2}}}",
        peak as f64 / (1u64 << 30) as f64,
        base as f64 / (1u64 << 30) as f64
    );
    Ok(())
}
