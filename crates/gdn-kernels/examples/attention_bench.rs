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
//! `--splits rule,1,4,16` runs each kernel with the op's split rule and with
//! fixed split counts (the sweep that sets the rule). `--chunks 4220:4220`
//! times the attention of a prefill chunk (TOKENS new after START cached)
//! on FA3 and ours against its share of the whole sequence's one-piece
//! prefill (the fraction of the causal score matrix its rows hold).

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

/// Device time of one call of `run`, in microseconds: repeated for about
/// 50 ms of work (at least 5 times) after a warm-up; with the repetitions.
fn time_us(
    stream: &Arc<CudaStream>,
    mut run: impl FnMut() -> Result<(), gdn_kernels::GdnError>,
) -> Result<(f64, usize), Box<dyn std::error::Error>> {
    run()?;
    stream.synchronize()?;
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
    Ok((t0.elapsed().as_secs_f64() / reps as f64 * 1e6, reps))
}

/// One sequence: `tokens` new tokens after `start` cached ones.
fn chunk_layout(tokens: usize, start: usize) -> BatchLayout {
    let max_blocks = (start + tokens).div_ceil(PAGE);
    BatchLayout {
        tokens: vec![0; tokens],
        cu_seqlens: vec![0, tokens as i32],
        start_positions: vec![start as i32],
        slots: vec![0],
        block_table: (0..max_blocks as i32).collect(),
        max_blocks,
        page_size: PAGE,
        padding: None,
    }
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
    // `--splits rule,4,16`: the split counts each kernel runs with (`rule`:
    // the op's own choice).
    let splits: Vec<Option<usize>> = list(&args, "--splits", "rule")
        .iter()
        .map(|s| (s != "rule").then(|| s.parse().expect("a split count")))
        .collect();
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
    let bw = gdn_kernels_testkit::copy_bandwidth(&stream)?;
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
            // K and V of every key, read once at the copy's rate (a copy
            // moves 2 bytes through DRAM per byte copied, as a read of
            // `kv_bytes` moves `kv_bytes`).
            let kv_bytes = 2.0 * (batch * context * hkv * HEAD_DIM * 2) as f64;
            let floor_us = kv_bytes / bw * 1e6;
            for (name, splits) in kernels
                .iter()
                .flat_map(|k| splits.iter().map(move |s| (k, *s)))
            {
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
                ops.set_decode_splits(splits)?;
                let splits = splits.map_or("rule".to_string(), |s| s.to_string());
                let (us, reps) = time_us(&stream, || {
                    ops.attention(&device_batch, shape, &q, &k, &v, &proj, &mut out)
                })?;
                println!(
                    "{{\"batch\": {batch}, \"context\": {context}, \"kernel\": {name:?}, \"splits\": {splits:?}, \"us\": {us:.2}, \"kv_floor_us\": {floor_us:.2}, \"over_floor\": {:.2}, \"reps\": {reps}}}",
                    us / floor_us
                );
            }
        }
    }
    // Attention of a prefill chunk over a long cached prefix against its
    // share of the whole sequence's one-piece FA3 prefill (the share of the
    // causal score matrix the chunk's rows hold).
    let chunks = if args.iter().any(|a| a == "--chunks") {
        list(&args, "--chunks", "")
    } else {
        vec![]
    };
    for chunk in chunks {
        let (tokens, start) = chunk
            .split_once(':')
            .map(|(t, p)| (t.parse::<usize>(), p.parse::<usize>()))
            .ok_or("--chunks takes TOKENS:START,...")?;
        let (tokens, start) = (tokens?, start?);
        let total = start + tokens;
        let whole = chunk_layout(total, 0);
        let kv_len = whole.max_blocks * PAGE * hkv * HEAD_DIM;
        let k: CudaSlice<bf16> = stream.alloc_zeros(kv_len)?;
        let v: CudaSlice<bf16> = stream.alloc_zeros(kv_len)?;
        let share = (tokens * start) as f64 + (tokens * tokens) as f64 / 2.0;
        let share = share / ((total * total) as f64 / 2.0);
        for (name, request) in [
            ("fa3", AttentionRequest::FlashInferSm90),
            ("ours", AttentionRequest::Ours),
        ] {
            let ops = match ModelOps::with_attention(stream.clone(), request) {
                Ok(ops) => ops,
                Err(e) => {
                    println!("{{\"kernel\": {name:?}, \"error\": {:?}}}", e.to_string());
                    continue;
                }
            };
            let time = |layout: &BatchLayout| -> Result<f64, Box<dyn std::error::Error>> {
                let batch = DeviceBatch::upload(&stream, layout)?;
                let n = layout.tokens.len();
                let q: CudaSlice<bf16> = stream.alloc_zeros(n * hq * HEAD_DIM)?;
                let proj: CudaSlice<bf16> = stream.alloc_zeros(n * shape.proj_width())?;
                let mut out: CudaSlice<bf16> = stream.alloc_zeros(n * hq * HEAD_DIM)?;
                let run = || ops.attention(&batch, shape, &q, &k, &v, &proj, &mut out);
                Ok(time_us(&stream, run)?.0)
            };
            let whole_us = time(&whole)?;
            let chunk_us = time(&chunk_layout(tokens, start))?;
            println!(
                "{{\"chunk_tokens\": {tokens}, \"cached_prefix\": {start}, \"kernel\": {name:?}, \"chunk_us\": {chunk_us:.1}, \"whole_sequence_us\": {whole_us:.1}, \"share_of_whole\": {share:.3}, \"chunk_over_share\": {:.2}}}",
                chunk_us / (whole_us * share)
            );
        }
    }
    Ok(())
}
