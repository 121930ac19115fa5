//! Benchmark (not a test) of decode attention against its KV-read floor:
//! one attention layer of a decode step (one query token a sequence, every
//! sequence at the same context, 64-token pages) on each kernel, timed on
//! the device, next to the time the GPU needs to read that layer's K and V
//! once at its measured copy bandwidth. Prints one JSON object per line.
//! Run on the GPU machine:
//!
//!     cargo run --release -p gdn-kernels --example attention_bench -- \
//!         --batches 1,16,64,128,256 --contexts 1024,8192,32768 \
//!         --kernels ours,tc2,tc3,fa3 --heads 16/4
//!
//! Kernels: `ours` (the CUDA-core split decode, the fallback), `tc2` / `tc3`
//! (the tensor-core split-KV decode with 2 or 3 tiles in flight per warp),
//! `fa3` (FlashInfer's SM90 paged prefill kernel run on decode rows; it
//! plans on the host at every call, so it cannot be replayed from a CUDA
//! graph: timed eagerly, host planning included). `--heads Q/KV` picks the
//! head layout (Qwen3.5-4B 16/4, 27B 24/4, 35B-A3B 16/2); head dim 256.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gdn_kernels::{AttentionRequest, AttentionShape, BatchLayout, DeviceBatch, ModelOps};
use half::bf16;

const PAGE: usize = 64;
const HEAD_DIM: usize = 256;

fn list(args: &[String], flag: &str, default: &str) -> Vec<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, String::as_str)
        .split(',')
        .map(str::to_string)
        .collect()
}

/// Device copy bandwidth (bytes read + written per second).
fn copy_bandwidth(stream: &Arc<CudaStream>) -> Result<f64, Box<dyn std::error::Error>> {
    let bytes = 4usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    stream.memcpy_dtod(&src, &mut dst)?;
    stream.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..5 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    stream.synchronize()?;
    Ok(5.0 * 2.0 * bytes as f64 / t0.elapsed().as_secs_f64())
}

/// A decode batch of `batch` sequences at `context` cached keys each (the
/// query is the token at position `context - 1`), pages interleaved across
/// sequences as a running server's pool hands them out.
fn decode_layout(batch: usize, context: usize) -> BatchLayout {
    let max_blocks = context.div_ceil(PAGE);
    let mut block_table = Vec::with_capacity(batch * max_blocks);
    for s in 0..batch {
        block_table.extend((0..max_blocks).map(|b| (b * batch + s) as i32));
    }
    BatchLayout {
        tokens: vec![0; batch],
        cu_seqlens: (0..=batch as i32).collect(),
        start_positions: vec![context as i32 - 1; batch],
        slots: (0..batch as i32).collect(),
        block_table,
        max_blocks,
        page_size: PAGE,
        padding: None,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num =
        |v: Vec<String>| -> Vec<usize> { v.iter().map(|x| x.parse().expect("number")).collect() };
    let batches = num(list(&args, "--batches", "1,16,64,128,256"));
    let contexts = num(list(&args, "--contexts", "1024,8192,32768"));
    let kernels = list(&args, "--kernels", "ours,tc2,tc3,fa3");
    let heads = list(&args, "--heads", "16/4");
    let (hq, hkv) = match heads[0].split_once('/') {
        Some((q, kv)) => (q.parse::<usize>()?, kv.parse::<usize>()?),
        None => return Err("--heads takes Q/KV, e.g. 16/4".into()),
    };
    let shape = AttentionShape {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: HEAD_DIM,
        rotary_dim: 64,
    };
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let bw = copy_bandwidth(&stream)?;
    println!(
        "{{\"gpu\": {:?}, \"copy_bandwidth_gbs\": {:.0}, \"heads\": \"{hq}/{hkv}\", \"head_dim\": {HEAD_DIM}, \"page\": {PAGE}}}",
        ctx.name()?,
        bw / 1e9
    );
    for &context in &contexts {
        for &batch in &batches {
            let layout = decode_layout(batch, context);
            let pages = batch * layout.max_blocks;
            let kv_len = pages * PAGE * hkv * HEAD_DIM;
            let k: CudaSlice<bf16> = stream.alloc_zeros(kv_len)?;
            let v: CudaSlice<bf16> = stream.alloc_zeros(kv_len)?;
            let q: CudaSlice<bf16> = stream.alloc_zeros(batch * hq * HEAD_DIM)?;
            let proj: CudaSlice<bf16> = stream.alloc_zeros(batch * shape.proj_width())?;
            let mut out: CudaSlice<bf16> = stream.alloc_zeros(batch * hq * HEAD_DIM)?;
            let device_batch = DeviceBatch::upload(&stream, &layout)?;
            // K and V of every key, once.
            let kv_bytes = 2.0 * (batch * context * hkv * HEAD_DIM * 2) as f64;
            let floor_us = kv_bytes / (bw / 2.0) * 1e6;
            for name in &kernels {
                let (request, stages) = match name.as_str() {
                    "ours" => (AttentionRequest::Ours, None),
                    "tc2" => (AttentionRequest::DecodeTensorCore, Some(2)),
                    "tc3" => (AttentionRequest::DecodeTensorCore, Some(3)),
                    "fa3" => (AttentionRequest::FlashInferSm90, None),
                    other => return Err(format!("unknown kernel {other:?}").into()),
                };
                let mut ops = match ModelOps::with_attention(stream.clone(), request) {
                    Ok(ops) => ops,
                    Err(e) => {
                        println!("{{\"kernel\": {name:?}, \"error\": {:?}}}", e.to_string());
                        continue;
                    }
                };
                if let Some(s) = stages {
                    ops.set_decode_tc_stages(s)?;
                }
                let mut run = || ops.attention(&device_batch, shape, &q, &k, &v, &proj, &mut out);
                run()?;
                stream.synchronize()?;
                // Enough repetitions for about 50 ms of work, at least 5.
                let t0 = Instant::now();
                run()?;
                stream.synchronize()?;
                let once = t0.elapsed().as_secs_f64();
                let reps = ((0.05 / once) as usize).clamp(5, 2000);
                let t0 = Instant::now();
                for _ in 0..reps {
                    run()?;
                }
                stream.synchronize()?;
                let us = t0.elapsed().as_secs_f64() / reps as f64 * 1e6;
                println!(
                    "{{\"batch\": {batch}, \"context\": {context}, \"kernel\": {name:?}, \"us\": {us:.2}, \"kv_floor_us\": {floor_us:.2}, \"over_floor\": {:.2}, \"reps\": {reps}}}",
                    us / floor_us
                );
            }
        }
    }
    Ok(())
}
