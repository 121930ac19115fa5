//! The ops outside any one family (`cuda/model_norms.cuh`,
//! `cuda/model_elementwise.cuh`): the embedding lookup, add + RMSNorm, the
//! last-token gather and the random fills of benchmarks.

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use super::{exact, grid, i32_of, ModelOps, MAX_STATIC_SHARED};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{invalid, During, GdnError, Op};

impl ModelOps {
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
