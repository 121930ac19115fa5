//! [`ModelOps::attention`]: one checked call, then the launch of the kernel
//! [`ModelOps::attention_kernel`] picks: FlashInfer's FA3 and the gate, our
//! split-KV decode (CUDA cores or tensor cores) and its combine, or our
//! prefill query tiles.

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use crate::attention::select::{self, AttentionKernel};
use crate::attention::shape::{
    decode_splits, decode_tc_smem, decode_tc_splits, prefill_attention_smem, AttentionShape,
    ATTN_THREADS, DECODE_TC_THREADS,
};
use crate::model_ops::{exact, grid, pool, ModelOps};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{During, ErrorKind, GdnError, Op};

const OP: Op = Op::Attention;

/// The operands of one [`ModelOps::attention`] call, checked, and the
/// launch arguments every kernel of the call shares.
struct AttentionCall<'a> {
    batch: &'a DeviceBatch,
    shape: AttentionShape,
    q: &'a CudaSlice<bf16>,
    k_cache: &'a CudaSlice<bf16>,
    v_cache: &'a CudaSlice<bf16>,
    proj: &'a CudaSlice<bf16>,
    /// The head dim's kernel among those for 32, 64, 128 and 256.
    which: usize,
    scale: f32,
    ld: i32,
    mb: i32,
    ps: i32,
    hq: i32,
    hkv: i32,
}

impl<'a> AttentionCall<'a> {
    /// Checks the shape and every operand's length (`out_len`: the output's)
    /// against the batch.
    fn new(
        batch: &'a DeviceBatch,
        shape: AttentionShape,
        [q, k_cache, v_cache, proj]: [&'a CudaSlice<bf16>; 4],
        out_len: usize,
    ) -> Result<Self, GdnError> {
        shape.check()?;
        let (t, d) = (batch.num_tokens, shape.head_dim);
        exact(OP, "q", q.len(), t * shape.q_heads * d)?;
        exact(OP, "proj", proj.len(), t * shape.proj_width())?;
        exact(OP, "out", out_len, t * shape.q_heads * d)?;
        pool(
            OP,
            "k_cache",
            k_cache.len(),
            shape.page_len(batch.page_size),
            batch.max_page,
        )?;
        exact(OP, "v_cache", v_cache.len(), k_cache.len())?;
        let [ld, mb, ps, hq, hkv] = [
            shape.proj_width(),
            batch.max_blocks,
            batch.page_size,
            shape.q_heads,
            shape.kv_heads,
        ]
        .map(|x| x as i32);
        Ok(AttentionCall {
            batch,
            shape,
            q,
            k_cache,
            v_cache,
            proj,
            which: (d / 32).trailing_zeros() as usize,
            scale: (d as f32).powf(-0.5),
            ld,
            mb,
            ps,
            hq,
            hkv,
        })
    }
}

impl ModelOps {
    /// Causal attention of every token over its sequence's cached positions
    /// `0..=position`, times `sigmoid(gate)` from `proj`; `out` is `[T, Hq * D]`.
    /// The kernel is [`ModelOps::attention_kernel`]'s choice.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        batch: &DeviceBatch,
        shape: AttentionShape,
        q: &CudaSlice<bf16>,
        k_cache: &CudaSlice<bf16>,
        v_cache: &CudaSlice<bf16>,
        proj: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), GdnError> {
        // 1. Check the operands (before anything is chosen or launched).
        let call = AttentionCall::new(batch, shape, [q, k_cache, v_cache, proj], out.len())?;
        // 2. The kernel for this batch (an error when a forced one cannot
        //    take it).
        let kernel = self.attention_kernel(batch, shape)?;
        // 3. Its launches: FA3 and the gate; the decode kernels for one
        //    token a sequence; the prefill query tiles otherwise.
        if kernel == AttentionKernel::FlashInferSm90 {
            return self.attention_fa3(&call, out);
        }
        if batch.num_tokens == batch.num_seqs {
            let tensor_cores = kernel == AttentionKernel::DecodeTensorCore;
            return self.attention_decode(&call, tensor_cores, out);
        }
        self.attention_prefill(&call, out)
    }

    /// FlashInfer's FA3 paged prefill into `out`, then our gate over it.
    fn attention_fa3(&self, c: &AttentionCall, out: &mut CudaSlice<bf16>) -> Result<(), GdnError> {
        let (t, d) = (c.batch.num_tokens, c.shape.head_dim);
        let fa3 = self.fa3.as_ref().expect("chosen only when set up");
        select::launch(
            fa3,
            &self.stream,
            c.batch,
            c.shape.q_heads,
            c.shape.kv_heads,
            c.q,
            c.k_cache,
            c.v_cache,
            out,
            c.scale,
        )?;
        let d_ = d as i32;
        let mut b = self.stream.launch_builder(&self.f.attention_gate);
        b.arg(out).arg(c.proj).arg(&c.ld).arg(&c.hq).arg(&d_);
        // SAFETY: matches attention_gate_bf16; out [T, Hq, D] and proj
        // [T, ld] checked by AttentionCall::new; 8 values a thread, 2048 a
        // block.
        let blocks_per_token = (c.shape.q_heads * d).div_ceil(2048);
        unsafe { b.launch(grid(t, blocks_per_token, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// Decode: one query per sequence; long contexts are split
    /// (flash-decoding) so a small batch still fills the GPU, and the
    /// splits' partials are combined by a second kernel.
    fn attention_decode(
        &self,
        c: &AttentionCall,
        tensor_cores: bool,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), GdnError> {
        let (t, d, shape) = (c.batch.num_tokens, c.shape.head_dim, c.shape);
        let keys = c.batch.max_position + 1;
        let rows = t * shape.kv_heads;
        let (splits, min_share) = match self.decode_splits_override {
            Some(splits) => (splits, 1),
            None if tensor_cores => decode_tc_splits(keys, rows),
            None => (decode_splits(keys, rows), 1),
        };
        let parts = t * shape.q_heads * splits;
        let null = 0u64;
        let ws = if splits > 1 {
            // SAFETY: fully written by the split kernel before the combine reads it.
            Some(unsafe {
                (
                    self.stream.alloc::<f32>(parts * 2).during(OP)?,
                    self.stream.alloc::<f32>(parts * d).during(OP)?,
                )
            })
        } else {
            None
        };
        let (decode, threads, smem) = if tensor_cores {
            let stages = self.decode_tc_stages;
            let func = &self.f.attention_decode_tc[stages - 2];
            let smem = decode_tc_smem(stages);
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .during(OP)?;
            (func, DECODE_TC_THREADS, smem)
        } else if shape.q_heads / shape.kv_heads <= 4 {
            (&self.f.attention_g4[c.which], ATTN_THREADS, 0)
        } else {
            (&self.f.attention[c.which], ATTN_THREADS, 0)
        };
        let mut b = self.stream.launch_builder(decode);
        b.arg(&mut *out)
            .arg(c.q)
            .arg(c.k_cache)
            .arg(c.v_cache)
            .arg(c.proj)
            .arg(&c.ld);
        b.arg(&c.batch.positions)
            .arg(&c.batch.tok_seq)
            .arg(&c.batch.block_table);
        b.arg(&c.mb).arg(&c.ps).arg(&c.hq).arg(&c.hkv).arg(&c.scale);
        match &ws {
            Some((ml, acc)) => b.arg(ml).arg(acc),
            None => b.arg(&null).arg(&null),
        };
        let min_share = min_share as i32;
        if tensor_cores {
            b.arg(&min_share);
        }
        let mut cfg = grid(t, shape.kv_heads, threads, smem);
        cfg.grid_dim.2 = splits as u32;
        // SAFETY: matches attention_d{D/32} and attention_decode_tc_s*
        // (the same arguments, the latter's with min_share last; only
        // for head dim 256 and groups <= 8, which attention_kernel
        // checked, with the shared memory decode_tc_smem gives); pages
        // and lengths checked; the
        // workspace holds [T, Hq, splits] partials when splits > 1.
        unsafe { b.launch(cfg) }.during(OP)?;
        if let Some((ml, acc)) = &ws {
            let splits_ = splits as i32;
            let mut b = self.stream.launch_builder(&self.f.attention_combine);
            b.arg(out)
                .arg(ml)
                .arg(acc)
                .arg(c.proj)
                .arg(&c.ld)
                .arg(&c.hq)
                .arg(&splits_);
            // SAFETY: matches attention_combine; block = head dim (>= 32:
            // its first warp weighs up to 64 splits, the most
            // `decode_splits` gives).
            unsafe { b.launch(grid(t, shape.q_heads, d as u32, 0)) }.during(OP)?;
        }
        Ok(())
    }

    /// Prefill: tensor-core query tiles; shared memory as laid out in
    /// attention_prefill_impl (Q per warp, K and V tiles, S, P, O scratch).
    fn attention_prefill(
        &self,
        c: &AttentionCall,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), GdnError> {
        let (d, shape, batch) = (c.shape.head_dim, c.shape, c.batch);
        let group = shape.q_heads / shape.kv_heads;
        let smem = prefill_attention_smem(shape);
        let func = &self.f.attention_prefill[c.which];
        func.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| {
            GdnError::new(
                OP,
                ErrorKind::Unsupported {
                    backend: "attention_prefill",
                    reason: format!("{smem} bytes of shared memory for head dim {d}, GQA group {group}: {e}"),
                },
            )
        })?;
        let mut b = self.stream.launch_builder(func);
        b.arg(out)
            .arg(c.q)
            .arg(c.k_cache)
            .arg(c.v_cache)
            .arg(c.proj)
            .arg(&c.ld);
        b.arg(&batch.tiles)
            .arg(&batch.positions)
            .arg(&batch.tok_seq)
            .arg(&batch.block_table);
        b.arg(&c.mb).arg(&c.ps).arg(&c.hq).arg(&c.hkv).arg(&c.scale);
        // SAFETY: matches attention_prefill_d{D}; pages and lengths checked;
        // block = 32 * group threads (one warp per query head of the group).
        unsafe {
            b.launch(grid(
                batch.num_tiles,
                shape.kv_heads,
                32 * group as u32,
                smem,
            ))
        }
        .during(OP)?;
        Ok(())
    }
}
