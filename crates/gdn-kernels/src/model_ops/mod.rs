//! Semantic ops over our model kernels (`cuda/model_kernels.cu`, cubins from
//! the verified bundle): callers pass typed buffers and shapes; this module
//! alone knows kernel names, launch geometries and argument orders, and
//! checks every buffer length and index range before launching.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::bf16;

use crate::attention::select::{self, AttentionRequest, Fa3};
use crate::moe::ops::MoeFunctions;
use crate::shared::batch::DeviceBatch;
use crate::deltanet::prefill::dispatch::cubin_for;
use crate::shared::error::{invalid, During, GdnError, Op};
use crate::deltanet::oracle::HEAD_DIM;
use crate::deltanet::state::RecurrentState;

const UNIT: &str = "model_kernels";
const MAX_CONV_TAPS: usize = 8;
const MAX_GQA: usize = 8;
pub(crate) const ATTN_THREADS: u32 = 128;
/// The tensor-core decode's block: four warps, each with its own ring of
/// `stages` 8-key tiles (K and V, 8 KiB a tile).
pub(crate) const DECODE_TC_THREADS: u32 = 128;
/// Tiles in flight per warp of the tensor-core decode unless a benchmark
/// sets another ([`ModelOps::set_decode_tc_stages`]); the measured choice
/// is in docs/performance.md (decode attention against its KV-read floor).
const DECODE_TC_STAGES: usize = 3;

/// Dynamic shared memory of the tensor-core decode with `stages` tiles in
/// flight per warp (its rings; the warps' merge at the end reuses them).
pub(crate) fn decode_tc_smem(stages: usize) -> usize {
    4 * stages * 2 * 8 * 256 * 2
}
const MAX_STATIC_SHARED: usize = 48 * 1024;
/// Arrival counters of the fused DeltaNet decode: one per (sequence, q/k
/// head) of a launch; larger batches launch in chunks.
pub(crate) const FUSED_DECODE_COUNTERS: usize = 1 << 16;
/// The most sequences one launch covers (grid y).
pub(crate) const MAX_GRID_Y: usize = 65_535;

/// Shape of one Gated DeltaNet layer (head dim 128). Its fused input
/// projection has the columns `[q | k | v | z | b | a]`
/// (see [`DeltaNetShape::proj_width`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub qk_heads: usize,
    pub v_heads: usize,
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// Channels of the causal conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        (2 * self.qk_heads + self.v_heads) * HEAD_DIM
    }
    pub fn col_z(&self) -> usize {
        self.conv_dim()
    }
    pub fn col_b(&self) -> usize {
        self.col_z() + self.v_heads * HEAD_DIM
    }
    pub fn col_a(&self) -> usize {
        self.col_b() + self.v_heads
    }
    pub fn proj_width(&self) -> usize {
        self.col_a() + self.v_heads
    }
    /// Elements of one slot's conv state: `[kernel - 1, conv_dim]`.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// Elements of one slot's recurrent state: `[Hv, 128, 128]`.
    pub fn recurrent_state_len(&self) -> usize {
        self.v_heads * HEAD_DIM * HEAD_DIM
    }
    /// Whether the model kernels support this shape.
    pub fn check(&self) -> Result<(), GdnError> {
        let ok = self.qk_heads > 0
            && self.v_heads % self.qk_heads == 0
            && (2..=MAX_CONV_TAPS + 1).contains(&self.conv_kernel)
            && self.v_heads <= HEAD_DIM;
        ok.then_some(()).ok_or_else(|| {
            invalid(
                Op::DeltaNet,
                "shape",
                format!(
                    "unsupported {self:?} (Hv a multiple of Hqk and <= 128, conv kernel 2..=9)"
                ),
            )
        })
    }
}

/// Shape of one gated attention layer. Its fused projection has the columns
/// `[q_0 | gate_0 | q_1 | gate_1 | ... | k | v]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head that get RoPE.
    pub rotary_dim: usize,
}

impl AttentionShape {
    pub fn col_k(&self) -> usize {
        self.q_heads * 2 * self.head_dim
    }
    pub fn proj_width(&self) -> usize {
        self.col_k() + 2 * self.kv_heads * self.head_dim
    }
    /// Elements of one KV-cache page for one of K or V: `[page, Hkv, D]`.
    pub fn page_len(&self, page_size: usize) -> usize {
        page_size * self.kv_heads * self.head_dim
    }
    /// Whether the model kernels support this shape.
    pub fn check(&self) -> Result<(), GdnError> {
        let ok = self.kv_heads > 0
            && self.q_heads % self.kv_heads == 0
            && self.q_heads / self.kv_heads <= MAX_GQA
            && matches!(self.head_dim, 32 | 64 | 128 | 256)
            && self.rotary_dim % 2 == 0
            && self.rotary_dim <= self.head_dim;
        ok.then_some(()).ok_or_else(|| {
            invalid(Op::Attention, "shape", format!("unsupported {self:?} (head dim 32/64/128/256, GQA group <= 8, even rotary dim)"))
        })
    }
}

/// Dynamic shared memory of attention_prefill_impl: Q per warp, K and V
/// tiles, S, P and O scratch per warp.
pub(crate) fn prefill_attention_smem(shape: AttentionShape) -> usize {
    let (group, d) = (shape.q_heads / shape.kv_heads.max(1), shape.head_dim);
    group * 16 * d * 2 + 2 * 32 * d * 2 + group * 16 * 32 * (4 + 2) + group * 16 * 16 * 4
}

/// Exact length check: `what` must hold `want` elements.
pub(crate) fn exact(op: Op, what: &'static str, have: usize, want: usize) -> Result<(), GdnError> {
    if have == want {
        Ok(())
    } else {
        Err(invalid(
            op,
            what,
            format!("expected {want} elements, got {have}"),
        ))
    }
}

/// A pool of `per_slot`-sized slots must hold every slot the batch uses.
pub(crate) fn pool(
    op: Op,
    what: &'static str,
    len: usize,
    per_slot: usize,
    max_id: usize,
) -> Result<(), GdnError> {
    if per_slot == 0 || len % per_slot != 0 || len / per_slot <= max_id {
        return Err(invalid(
            op,
            what,
            format!("{len} elements is not a whole number of {per_slot}-element slots covering id {max_id}"),
        ));
    }
    Ok(())
}

/// `x` (the size `what`) as a kernel's i32 argument.
pub(crate) fn i32_of(op: Op, what: &'static str, x: usize) -> Result<i32, GdnError> {
    i32::try_from(x).map_err(|_| invalid(op, what, format!("{x} exceeds i32")))
}

/// How many blocks share one sequence's keys in decode attention: about
/// 32 keys a block (8 a warp; never fewer than 16), at most 64 blocks
/// (attention_combine's limit), and no more than about 4096 blocks in all
/// (beyond that a larger batch fills the GPU by itself).
/// Why 32 keys: a warp walks its keys one after another (a warp-wide dot
/// product per key and query head), so the chain, not bandwidth, sets the
/// time: fewer, longer chains (the old rule, >= 128 keys a block and at most
/// 16 blocks) left a small batch's decode attention latency-bound (ncu
/// profile of one batch-1 decode step: docs/results/h200-2026-12-01/
/// `ncu-decode-b1-one-step.tsv`).
pub(crate) fn decode_splits(keys: usize, sequences_x_kv_heads: usize) -> usize {
    let most = 4096usize.div_ceil(sequences_x_kv_heads.max(1));
    keys.div_ceil(32).min(64).min(most).max(1)
}

/// The tensor-core decode's split count for `keys` (the batch's bound:
/// a captured graph's tier) over `sequences_x_kv_heads` rows, and the
/// least keys a split takes (`min_share`: the kernel leaves the splits past
/// a shorter row's keys empty rather than cutting them finer).
///
/// Measured on the H200 over splits 1..=64 (docs/performance.md, decode
/// attention against its KV-read floor): from 64 rows (16 sequences of the
/// 4B) up the best share is about 512 keys at every batch and context;
/// smaller batches are latency-bound and do best with about 128 blocks of
/// at least 64 keys.
pub(crate) fn decode_tc_splits(keys: usize, sequences_x_kv_heads: usize) -> (usize, usize) {
    let rows = sequences_x_kv_heads.max(1);
    let streaming = keys.div_ceil(512);
    let filling = keys.div_ceil(64).min(128usize.div_ceil(rows));
    let splits = streaming.max(filling).clamp(1, 64);
    let min_share = if rows >= 64 { 512 } else { 64 };
    (splits, min_share)
}

pub(crate) fn grid(x: usize, y: usize, threads: u32, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

pub(crate) struct Functions {
    pub(crate) embedding: CudaFunction,
    pub(crate) add_rmsnorm: CudaFunction,
    pub(crate) add_rmsnorm_vec8: CudaFunction,
    pub(crate) conv_prep: CudaFunction,
    /// The same kernel for 4-tap conv kernels (Qwen3.5's), kw a constant.
    pub(crate) conv_prep_k4: CudaFunction,
    pub(crate) conv_update: CudaFunction,
    pub(crate) decode_step: CudaFunction,
    pub(crate) decode_step_bf16: CudaFunction,
    pub(crate) gated_rmsnorm: CudaFunction,
    /// By blocks per (sequence, value head): 1, 2, 4; f32 and bf16 state.
    pub(crate) decode_fused: [CudaFunction; 3],
    pub(crate) decode_fused_bf16: [CudaFunction; 3],
    pub(crate) attn_prep: CudaFunction,
    /// By head dim 32, 64, 128, 256: one token per block (decode) and
    /// tensor-core query tiles (prefill).
    pub(crate) attention: [CudaFunction; 4],
    /// The same decode kernels for GQA groups <= 4 (half the registers).
    pub(crate) attention_g4: [CudaFunction; 4],
    pub(crate) attention_prefill: [CudaFunction; 4],
    /// The tensor-core decode with 2 and 3 tiles in flight per warp.
    pub(crate) attention_decode_tc: [CudaFunction; 2],
    pub(crate) attention_combine: CudaFunction,
    pub(crate) attention_gate: CudaFunction,
    pub(crate) silu_mul: CudaFunction,
    pub(crate) copy_f32: CudaFunction,
    pub(crate) copy_bf16: CudaFunction,
    /// A bf16 state's slots to an f32 packed batch and back.
    pub(crate) widen_bf16: CudaFunction,
    pub(crate) narrow_f32: CudaFunction,
    pub(crate) fill_bf16: CudaFunction,
    pub(crate) fill_f32: CudaFunction,
    pub(crate) moe: MoeFunctions,
}

/// The DeltaNet per-token inputs the conv step produces and the prefill /
/// decode steps consume.
pub struct DeltaNetInputs {
    /// `[T, Hqk, 128]`, L2-normalised.
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    /// `[T, Hv, 128]`.
    pub v: CudaSlice<bf16>,
    /// `[T, Hv]`: linear decay `exp(g)` and write strength `sigmoid(b)`.
    pub alpha: CudaSlice<f32>,
    pub beta: CudaSlice<f32>,
}

/// The weights of one DeltaNet layer that the fused decode reads besides
/// its projection.
#[derive(Clone, Copy)]
pub struct DeltaNetWeights<'a> {
    /// `[conv_dim, conv_kernel]`.
    pub conv: &'a CudaSlice<f32>,
    /// `[Hv]` each.
    pub a_log: &'a CudaSlice<f32>,
    pub dt_bias: &'a CudaSlice<f32>,
    /// `[128]`: the gated output norm's weight.
    pub norm: &'a CudaSlice<f32>,
}

/// Our model kernels, loaded for one stream's device.
pub struct ModelOps {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) f: Functions,
    pub(crate) _module: Arc<CudaModule>,
    pub(crate) sm: u32,
    pub(crate) multiprocessors: usize,
    /// The fused decode's arrival counters: zero between launches (each
    /// launch's last blocks reset theirs), so launches on this stream,
    /// captured or not, share them.
    pub(crate) fused_arrivals: CudaSlice<u32>,
    pub(crate) attention_request: AttentionRequest,
    /// Tiles in flight per warp of the tensor-core decode (2 or 3).
    pub(crate) decode_tc_stages: usize,
    /// A fixed split count for decode attention instead of the rule (a
    /// benchmark knob).
    pub(crate) decode_splits_override: Option<usize>,
    /// FlashInfer's FA3 attention, when this GPU runs it and the request
    /// allows it (see `attention::select`).
    pub(crate) fa3: Option<Fa3>,
}

impl ModelOps {
    /// The ops with [`AttentionRequest::Auto`].
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        Self::with_attention(stream, AttentionRequest::Auto)
    }

    /// The ops with the attention kernel chosen by `request` (tests force
    /// each kernel with it; the rule is in `attention/select.rs`).
    pub fn with_attention(
        stream: Arc<CudaStream>,
        request: AttentionRequest,
    ) -> Result<Self, GdnError> {
        const OP: Op = Op::ModelKernels;
        let fa3 = select::probe(&stream, request)?;
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().during(OP)?;
        let (sm, cubin) = cubin_for(UNIT, cc).map_err(|why| why.into_error(OP))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .during(OP)?;
        let l = |name: &str| module.load_function(name).during(OP);
        let f = Functions {
            embedding: l("embedding_bf16")?,
            add_rmsnorm: l("add_rmsnorm_bf16")?,
            add_rmsnorm_vec8: l("add_rmsnorm_vec8_bf16")?,
            conv_prep: l("gdn_conv_prep")?,
            conv_prep_k4: l("gdn_conv_prep_k4")?,
            conv_update: l("gdn_conv_state_update")?,
            decode_step: l("gdn_decode_step")?,
            decode_step_bf16: l("gdn_decode_step_bf16")?,
            gated_rmsnorm: l("gated_rmsnorm_bf16")?,
            decode_fused: [
                l("gdn_decode_fused_s1")?,
                l("gdn_decode_fused_s2")?,
                l("gdn_decode_fused_s4")?,
            ],
            decode_fused_bf16: [
                l("gdn_decode_fused_bf16_s1")?,
                l("gdn_decode_fused_bf16_s2")?,
                l("gdn_decode_fused_bf16_s4")?,
            ],
            attn_prep: l("attn_prep")?,
            attention: [
                l("attention_d1")?,
                l("attention_d2")?,
                l("attention_d4")?,
                l("attention_d8")?,
            ],
            attention_g4: [
                l("attention_g4_d1")?,
                l("attention_g4_d2")?,
                l("attention_g4_d4")?,
                l("attention_g4_d8")?,
            ],
            attention_decode_tc: [l("attention_decode_tc_s2")?, l("attention_decode_tc_s3")?],
            attention_combine: l("attention_combine")?,
            attention_gate: l("attention_gate_bf16")?,
            attention_prefill: [
                l("attention_prefill_d32")?,
                l("attention_prefill_d64")?,
                l("attention_prefill_d128")?,
                l("attention_prefill_d256")?,
            ],
            silu_mul: l("silu_mul_bf16")?,
            copy_f32: l("copy_rows_f32")?,
            copy_bf16: l("copy_rows_bf16")?,
            widen_bf16: l("copy_rows_bf16_to_f32")?,
            narrow_f32: l("copy_rows_f32_to_bf16")?,
            fill_bf16: l("fill_uniform_bf16")?,
            fill_f32: l("fill_uniform_f32")?,
            moe: MoeFunctions {
                topk_softmax: l("moe_topk_softmax")?,
                route: l("moe_route")?,
                gemv_gate_up: l("moe_gemv_gate_up")?,
                gemv_down: l("moe_gemv_down")?,
                gemv_mma_gate_up: l("moe_gemv_mma_gate_up")?,
                gemv_mma_down: l("moe_gemv_mma_down")?,
                gemm_gate_up: l("moe_gemm_gate_up")?,
                gemm_down: l("moe_gemm_down")?,
                combine: l("moe_combine")?,
                direct_gate_up: l("moe_direct_gate_up")?,
                direct_down_combine: l("moe_direct_down_combine")?,
            },
        };
        let multiprocessors = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during(OP)? as usize;
        let fused_arrivals = stream
            .alloc_zeros::<u32>(FUSED_DECODE_COUNTERS)
            .during(OP)?;
        Ok(ModelOps {
            stream,
            f,
            _module: module,
            sm,
            multiprocessors,
            fused_arrivals,
            attention_request: request,
            fa3,
            decode_tc_stages: DECODE_TC_STAGES,
            decode_splits_override: None,
        })
    }

    /// Tiles in flight per warp of the tensor-core decode (2 or 3): a
    /// benchmark knob (`attention_bench` times both); the default is the
    /// measured choice.
    pub fn set_decode_tc_stages(&mut self, stages: usize) -> Result<(), GdnError> {
        if !(2..=3).contains(&stages) {
            return Err(invalid(
                Op::Attention,
                "stages",
                format!("{stages}: the tensor-core decode is built with 2 or 3"),
            ));
        }
        self.decode_tc_stages = stages;
        Ok(())
    }

    /// Splits every decode attention launch into exactly `splits` (1..=64)
    /// key ranges instead of the rule's count, or back to the rule with
    /// `None`: a benchmark knob (`attention_bench --splits` sweeps it to
    /// set the rule).
    pub fn set_decode_splits(&mut self, splits: Option<usize>) -> Result<(), GdnError> {
        if let Some(s) = splits {
            if !(1..=64).contains(&s) {
                return Err(invalid(
                    Op::Attention,
                    "splits",
                    format!("{s}: decode attention takes 1 to 64 splits"),
                ));
            }
        }
        self.decode_splits_override = splits;
        Ok(())
    }

    /// Everything about a model's shapes the ops would otherwise only refuse
    /// mid-step (after earlier layers changed state): the DeltaNet and
    /// attention shapes, the norm width, and the prefill attention's shared
    /// memory against this GPU's opt-in limit.
    pub fn check_model(
        &self,
        hidden: usize,
        deltanet: DeltaNetShape,
        attention: AttentionShape,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::CheckModel;
        deltanet.check()?;
        attention.check()?;
        if hidden == 0 || hidden * 4 > MAX_STATIC_SHARED {
            return Err(invalid(
                OP,
                "hidden",
                format!("size {hidden} outside 1..=12288"),
            ));
        }
        let need = prefill_attention_smem(attention);
        let have = self.stream.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        ).during(OP)? as usize;
        if need > have {
            return Err(invalid(
                OP,
                "attention",
                format!(
                    "prefill attention needs {need} bytes of shared memory per block (head dim {}, GQA group {}); this GPU allows {have}",
                    attention.head_dim,
                    attention.q_heads / attention.kv_heads
                ),
            ));
        }
        Ok(())
    }

    /// The SM version of the cubin in use.
    pub fn cubin_sm(&self) -> u32 {
        self.sm
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `out[t] = table[token t]` for the batch's tokens; the batch's token
    /// ids (bounded when it was built) are checked against the table's rows.
    pub fn embedding(
        &self,
        batch: &DeviceBatch,
        table: &CudaSlice<bf16>,
        hidden: usize,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::Embedding;
        let vocab = table.len() / hidden.max(1);
        if hidden == 0 || table.len() != vocab * hidden {
            return Err(invalid(
                OP,
                "table",
                format!("{} elements is not [V, {hidden}]", table.len()),
            ));
        }
        if batch.max_token >= vocab {
            return Err(invalid(
                OP,
                "batch",
                format!("token id {} >= vocab size {vocab}", batch.max_token),
            ));
        }
        exact(OP, "out", out.len(), batch.num_tokens * hidden)?;
        let h = i32_of(OP, "hidden", hidden)?;
        let mut b = self.stream.launch_builder(&self.f.embedding);
        b.arg(out).arg(table).arg(&batch.tokens).arg(&h);
        // SAFETY: matches embedding_bf16(out, table, ids, hidden); ids < vocab.
        unsafe { b.launch(grid(batch.num_tokens, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// `residual += delta` (if any, rounded to bf16), then
    /// `out = residual / rms * (1 + weight)` per row of `hidden`.
    pub fn add_rmsnorm(
        &self,
        residual: &mut CudaSlice<bf16>,
        delta: Option<&CudaSlice<bf16>>,
        weight: &CudaSlice<f32>,
        out: &mut CudaSlice<bf16>,
        hidden: usize,
        eps: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::AddRmsNorm;
        exact(OP, "weight", weight.len(), hidden)?;
        let rows = residual.len() / hidden.max(1);
        exact(OP, "residual", residual.len(), rows * hidden)?;
        exact(OP, "out", out.len(), rows * hidden)?;
        if let Some(d) = delta {
            exact(OP, "delta", d.len(), rows * hidden)?;
        }
        if hidden * 4 > MAX_STATIC_SHARED || rows == 0 {
            return Err(invalid(
                OP,
                "hidden",
                format!("{hidden} / rows {rows} out of range"),
            ));
        }
        let (h, null) = (i32_of(OP, "hidden", hidden)?, 0u64);
        // Rows of 8-element vectors (every Qwen3.5 size) keep their values in
        // registers, one thread per 8; others take the strided loop over
        // shared memory (model_kernels.cu says why both exist).
        let vec8 = hidden % 8 == 0 && hidden / 8 <= 1024;
        let (func, cfg) = if vec8 {
            let threads = (hidden / 8).next_multiple_of(32) as u32;
            (&self.f.add_rmsnorm_vec8, grid(rows, 1, threads, 0))
        } else {
            (&self.f.add_rmsnorm, grid(rows, 1, 256, hidden * 4))
        };
        let mut b = self.stream.launch_builder(func);
        b.arg(out).arg(residual);
        match delta {
            Some(d) => b.arg(d),
            None => b.arg(&null),
        };
        b.arg(weight).arg(&h).arg(&eps);
        // SAFETY: matches add_rmsnorm_bf16 / add_rmsnorm_vec8_bf16 (same
        // arguments); lengths checked; the strided kernel gets hidden floats
        // of shared memory; the vec8 one needs 16-byte aligned rows, which
        // hidden % 8 == 0 and whole allocations give.
        unsafe { b.launch(cfg) }.during(OP)?;
        Ok(())
    }

    /// SwiGLU: `out[r] = silu(gate_up[r, :I]) * gate_up[r, I:]`.
    pub fn silu_mul(
        &self,
        gate_up: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
        inter: usize,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::SiluMul;
        let rows = out.len() / inter.max(1);
        exact(OP, "out", out.len(), rows * inter)?;
        exact(OP, "gate_up", gate_up.len(), rows * 2 * inter)?;
        let (r, i) = (rows as i64, i32_of(OP, "inter", inter)?);
        let mut b = self.stream.launch_builder(&self.f.silu_mul);
        b.arg(out).arg(gate_up).arg(&r).arg(&i);
        // SAFETY: matches silu_mul_bf16; 8 columns a thread, 2048 a block,
        // every row's blocks in one grid dimension.
        let blocks = rows * inter.div_ceil(2048);
        i32_of(OP, "blocks", blocks)?;
        unsafe { b.launch(grid(blocks, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// Copies each sequence's recurrent state slot into a packed f32
    /// `[N, per_slot]` buffer (`to_packed`: the GDN prefill's initial
    /// state), or back (its final state). A bf16 pool is widened on the way
    /// out and rounded to nearest-even bf16 on the way back: the prefill
    /// kernels read and write f32 states only.
    pub fn move_state(
        &self,
        batch: &DeviceBatch,
        pool_buf: &mut RecurrentState,
        packed: &mut CudaSlice<f32>,
        per_slot: usize,
        to_packed: bool,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::MoveState;
        pool(OP, "pool", pool_buf.len(), per_slot, batch.max_slot)?;
        exact(OP, "packed", packed.len(), batch.num_seqs * per_slot)?;
        let (w, null) = (per_slot as i64, 0u64);
        let func = match (&*pool_buf, to_packed) {
            (RecurrentState::F32(_), _) => &self.f.copy_f32,
            (RecurrentState::Bf16(_), true) => &self.f.widen_bf16,
            (RecurrentState::Bf16(_), false) => &self.f.narrow_f32,
        };
        let mut b = self.stream.launch_builder(func);
        if to_packed {
            b.arg(packed).arg(&null);
            match &*pool_buf {
                RecurrentState::F32(p) => b.arg(p),
                RecurrentState::Bf16(p) => b.arg(p),
            };
            b.arg(&batch.seq_slot);
        } else {
            match pool_buf {
                RecurrentState::F32(p) => b.arg(p),
                RecurrentState::Bf16(p) => b.arg(p),
            };
            b.arg(&batch.seq_slot).arg(&*packed).arg(&null);
        }
        b.arg(&w);
        // SAFETY: matches copy_rows_f32 / copy_rows_bf16_to_f32 /
        // copy_rows_f32_to_bf16 (picked by the pool's element type and the
        // direction); slot ids checked against the pool.
        unsafe { b.launch(grid(batch.num_seqs, per_slot.div_ceil(1024), 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// `out[s] = src[last token of sequence s]`, rows of `width` (the rows
    /// the lm_head needs).
    pub fn gather_last_tokens(
        &self,
        batch: &DeviceBatch,
        src: &CudaSlice<bf16>,
        width: usize,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::GatherLastTokens;
        exact(OP, "src", src.len(), batch.num_tokens * width)?;
        exact(OP, "out", out.len(), batch.num_seqs * width)?;
        let (w, null) = (width as i64, 0u64);
        let mut b = self.stream.launch_builder(&self.f.copy_bf16);
        b.arg(out).arg(&null).arg(src).arg(&batch.last_rows).arg(&w);
        // SAFETY: matches copy_rows_bf16; last rows lie inside the batch.
        unsafe { b.launch(grid(batch.num_seqs, width.div_ceil(1024), 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// Fills with `offset + scale * u`, `u` uniform in [-1, 1) from a hash
    /// of (seed, index): random weights for benchmarks.
    pub fn fill_uniform_bf16(
        &self,
        buf: &mut CudaSlice<bf16>,
        seed: u64,
        scale: f32,
        offset: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::FillUniform;
        let n = buf.len() as i64;
        let mut b = self.stream.launch_builder(&self.f.fill_bf16);
        b.arg(buf).arg(&n).arg(&seed).arg(&scale).arg(&offset);
        // SAFETY: matches fill_uniform_bf16 (grid-stride loop over n).
        unsafe { b.launch(grid(1024, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// [`ModelOps::fill_uniform_bf16`] for f32 buffers.
    pub fn fill_uniform_f32(
        &self,
        buf: &mut CudaSlice<f32>,
        seed: u64,
        scale: f32,
        offset: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::FillUniform;
        let n = buf.len() as i64;
        let mut b = self.stream.launch_builder(&self.f.fill_f32);
        b.arg(buf).arg(&n).arg(&seed).arg(&scale).arg(&offset);
        // SAFETY: matches fill_uniform_f32 (grid-stride loop over n).
        unsafe { b.launch(grid(1024, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_splits, decode_tc_splits};

    #[test]
    fn decode_tc_splits_follow_the_measured_shares() {
        // (keys, rows) -> the split count the H200 sweep found best.
        for (keys, rows, want) in [
            (1024, 4, 16),
            (8192, 4, 32),
            (1024, 64, 2),
            (8192, 64, 16),
            (1024, 512, 2),
            (8192, 512, 16),
            (8192, 1024, 16),
        ] {
            assert_eq!(
                decode_tc_splits(keys, rows).0,
                want,
                "{keys} keys, {rows} rows"
            );
        }
        for keys in 1..=70_000usize {
            for rows in [1usize, 4, 8, 63, 64, 1024] {
                let (splits, min_share) = decode_tc_splits(keys, rows);
                assert!(
                    (1..=64).contains(&splits),
                    "{keys} keys, {rows} rows: {splits}"
                );
                assert!(min_share == 64 || min_share == 512);
                // Every key has a split: the shares cover the keys.
                assert!(splits * keys.div_ceil(splits).max(min_share) >= keys);
            }
        }
    }

    #[test]
    fn decode_splits_keep_their_bounds_for_every_batch_and_context() {
        for keys in 1..=5000 {
            for rows in [1usize, 3, 4, 16, 64, 256, 512, 1024, 4096] {
                let s = decode_splits(keys, rows);
                assert!(
                    (1..=64).contains(&s),
                    "{keys} keys, {rows} rows: {s} splits"
                );
                if s > 1 {
                    // A split's share (ceil(keys / splits)) is never below
                    // 16 keys (4 a warp): the rule asks for 32, rounded.
                    assert!(keys.div_ceil(s) >= 16, "{keys} keys: {s} splits");
                    assert!(
                        rows * s <= 4096 + rows,
                        "{keys} keys, {rows} rows: {s} splits"
                    );
                }
            }
        }
        // A short context stays in one block; one sequence deep in a
        // context spreads over many.
        assert_eq!(decode_splits(32, 4), 1);
        assert!(decode_splits(1024, 4) >= 16);
    }
}
