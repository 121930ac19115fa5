//! The attention layer's ops besides attention itself (`run.rs`): the q/k
//! norm with RoPE and the paged KV write, the kernel `attention::select`
//! picks for a batch (ours or FlashInfer's FA3), and the decode kernels'
//! benchmark knobs.

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use crate::attention::select::{self, AttentionKernel};
use crate::attention::shape::AttentionShape;
use crate::model_ops::{exact, grid, i32_of, pool, ModelOps};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{invalid, During, GdnError, Op};

impl ModelOps {
    /// q/k norm and RoPE for every token; q to `q_out` (`[T, Hq, D]`), k and v
    /// into the KV-cache pages (`[pages, page_size, Hkv, D]` each).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prep(
        &self,
        batch: &DeviceBatch,
        shape: AttentionShape,
        proj: &CudaSlice<bf16>,
        q_norm: &CudaSlice<f32>,
        k_norm: &CudaSlice<f32>,
        inv_freq: &CudaSlice<f32>,
        q_out: &mut CudaSlice<bf16>,
        k_cache: &mut CudaSlice<bf16>,
        v_cache: &mut CudaSlice<bf16>,
        eps: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::AttentionPrep;
        shape.check()?;
        let (t, d) = (batch.num_tokens, shape.head_dim);
        exact(OP, "proj", proj.len(), t * shape.proj_width())?;
        exact(OP, "q_norm", q_norm.len(), d)?;
        exact(OP, "k_norm", k_norm.len(), d)?;
        exact(OP, "inv_freq", inv_freq.len(), shape.rotary_dim / 2)?;
        exact(OP, "q_out", q_out.len(), t * shape.q_heads * d)?;
        let page = shape.page_len(batch.page_size);
        pool(OP, "k_cache", k_cache.len(), page, batch.max_page)?;
        exact(OP, "v_cache", v_cache.len(), k_cache.len())?;
        let [ld, rh, mb, ps, hq, hkv] = [
            shape.proj_width(),
            shape.rotary_dim / 2,
            batch.max_blocks,
            batch.page_size,
            shape.q_heads,
            shape.kv_heads,
        ]
        .map(|x| x as i32);
        let mut b = self.stream.launch_builder(&self.f.attn_prep);
        b.arg(q_out).arg(k_cache).arg(v_cache).arg(proj).arg(&ld);
        b.arg(q_norm).arg(k_norm).arg(inv_freq).arg(&rh);
        b.arg(&batch.positions)
            .arg(&batch.tok_seq)
            .arg(&batch.block_table);
        b.arg(&mb).arg(&ps).arg(&hq).arg(&hkv).arg(&eps);
        let heads = shape.q_heads + shape.kv_heads;
        let per_warp = attn_prep_heads_per_warp(t, heads);
        let (d_, t_, per_warp_) = (d as i32, i32_of(OP, "tokens", t)?, per_warp as i32);
        b.arg(&d_).arg(&t_).arg(&per_warp_);
        // SAFETY: matches attn_prep; pages and lengths checked, head dim at
        // most 256 (shape.check); one warp per (token, run of `per_warp`
        // heads), 8 a block.
        let warps = t * heads.div_ceil(per_warp);
        unsafe { b.launch(grid(warps.div_ceil(8), 1, 256, 0)) }.during(OP)?;
        Ok(())
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

    /// The kernel [`ModelOps::attention`] runs for this batch and shape (an
    /// error when a forced kernel cannot take it).
    pub fn attention_kernel(
        &self,
        batch: &DeviceBatch,
        shape: AttentionShape,
    ) -> Result<AttentionKernel, GdnError> {
        select::choose(
            self.attention_request,
            self.fa3.as_ref(),
            batch,
            shape.head_dim,
            shape.q_heads / shape.kv_heads.max(1),
        )
    }
}

/// Heads an `attn_prep` warp takes for a batch of `tokens`: all of a token's
/// `heads` once the batch has a warp for every resident warp slot of an H200
/// (132 SMs x 32 warps at the kernel's 64 registers, about 4096), fewer for
/// shorter batches, down to one a warp (decode), so that every batch spreads
/// over about as many warps as the GPU holds. A warp computes its token's
/// RoPE angles and KV page once for all of its heads.
fn attn_prep_heads_per_warp(tokens: usize, heads: usize) -> usize {
    const RESIDENT_WARPS: usize = 4096;
    // Degenerate calls (no tokens or heads) get one head a warp; runs >= 1.
    let heads = heads.max(1);
    let runs = RESIDENT_WARPS.div_ceil(tokens.max(1)).min(heads);
    heads.div_ceil(runs)
}

#[cfg(test)]
mod tests {
    use super::attn_prep_heads_per_warp;

    #[test]
    fn attn_prep_runs_cover_every_head_and_fill_the_gpu() {
        // Qwen3.5-4B: 16 q + 4 kv heads.
        assert_eq!(attn_prep_heads_per_warp(1, 20), 1);
        assert_eq!(attn_prep_heads_per_warp(64, 20), 1);
        assert_eq!(attn_prep_heads_per_warp(1024, 20), 5);
        assert_eq!(attn_prep_heads_per_warp(8192, 20), 20);
        for tokens in [1, 7, 100, 300, 512, 1000, 2048, 4097, 65536] {
            let per_warp = attn_prep_heads_per_warp(tokens, 20);
            assert!((1..=20).contains(&per_warp));
            // At least half the GPU's warp slots busy (rounding the run up
            // can halve the runs), or one head a warp already.
            assert!(per_warp == 1 || 2 * tokens * 20usize.div_ceil(per_warp) >= 4096);
        }
    }
}
