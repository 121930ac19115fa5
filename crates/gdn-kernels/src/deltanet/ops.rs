//! The DeltaNet layer's ops between its two projections: conv + gates,
//! the recurrent decode step, the gated output norm, and all of them fused
//! into one kernel for decode batches where that measured faster, and the
//! state slots' copies around the GDN prefill ([`ModelOps::move_state`]).

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use crate::deltanet::oracle::HEAD_DIM;
use crate::deltanet::shape::{
    check_conv_and_gates, one_token_per_sequence, DeltaNetInputs, DeltaNetShape, DeltaNetWeights,
};
use crate::deltanet::state::RecurrentState;
use crate::model_ops::{exact, grid, i32_of, pool, ModelOps, FUSED_DECODE_COUNTERS};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{invalid, During, GdnError, Op};

/// The most sequences one launch covers (grid y).
const MAX_GRID_Y: usize = 65_535;

impl ModelOps {
    /// DeltaNet conv + SiLU + q/k L2 norm + gates for every token of the
    /// batch, reading inputs before each chunk from the slots' conv state;
    /// then advances the conv state. `proj` is `[T, shape.proj_width()]`.
    #[allow(clippy::too_many_arguments)]
    pub fn deltanet_conv(
        &self,
        batch: &DeviceBatch,
        shape: DeltaNetShape,
        proj: &CudaSlice<bf16>,
        conv_weight: &CudaSlice<f32>,
        a_log: &CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        conv_state: &mut CudaSlice<bf16>,
        out: &mut DeltaNetInputs,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::DeltaNetConv;
        shape.check()?;
        let (t, hk, hv) = (batch.num_tokens, shape.qk_heads, shape.v_heads);
        let ld = shape.proj_width();
        exact(OP, "proj", proj.len(), t * ld)?;
        check_conv_and_gates(OP, shape, conv_weight, a_log, dt_bias, conv_state, batch)?;
        out.check(OP, shape, t)?;
        let [ld_, cb, ca, hk_, hv_, kw, c] = [
            ld,
            shape.col_b(),
            shape.col_a(),
            hk,
            hv,
            shape.conv_kernel,
            shape.conv_dim(),
        ]
        .map(|x| x as i32);
        i32_of(OP, "proj", t * ld)?;
        let conv_prep = if shape.conv_kernel == 4 {
            &self.f.conv_prep_k4
        } else {
            &self.f.conv_prep
        };
        let mut b = self.stream.launch_builder(conv_prep);
        b.arg(&mut out.q).arg(&mut out.k).arg(&mut out.v);
        b.arg(&mut out.alpha).arg(&mut out.beta);
        b.arg(proj).arg(&ld_).arg(&cb).arg(&ca).arg(conv_weight);
        b.arg(&*conv_state)
            .arg(&batch.tok_seq)
            .arg(&batch.cu_seqlens);
        b.arg(&batch.seq_slot).arg(a_log).arg(dt_bias);
        let per_warp = conv_tokens_per_warp(t);
        let (t_, per_warp_) = (i32_of(OP, "tokens", t)?, per_warp as i32);
        b.arg(&hk_).arg(&hv_).arg(&kw).arg(&t_).arg(&per_warp_);
        // SAFETY: matches gdn_conv_prep(_k4); every length and slot id checked
        // above; one warp per (head group, `per_warp` tokens), 8 warps a block.
        let warps = t.div_ceil(per_warp) * (2 * hk + hv);
        unsafe { b.launch(grid(warps.div_ceil(8), 1, 256, 0)) }.during(OP)?;
        let mut b = self.stream.launch_builder(&self.f.conv_update);
        b.arg(conv_state).arg(proj).arg(&ld_).arg(&batch.cu_seqlens);
        b.arg(&batch.seq_slot).arg(&c).arg(&kw);
        // SAFETY: matches gdn_conv_state_update; runs after gdn_conv_prep on the
        // same stream, so the old state is read before it is replaced.
        unsafe { b.launch(grid(batch.num_seqs, shape.conv_dim().div_ceil(256), 256, 0)) }
            .during(OP)?;
        Ok(())
    }

    /// One recurrent step for a batch of single tokens, in place on the
    /// recurrent state slots (`[slots, Hv, 128, 128]`, f32 math on either
    /// storage dtype).
    pub fn deltanet_decode(
        &self,
        batch: &DeviceBatch,
        shape: DeltaNetShape,
        inputs: &DeltaNetInputs,
        state: &mut RecurrentState,
        out: &mut CudaSlice<bf16>,
        scale: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::DeltaNetDecode;
        shape.check()?;
        one_token_per_sequence(OP, batch)?;
        let (n, hk, hv) = (batch.num_seqs, shape.qk_heads, shape.v_heads);
        pool(
            OP,
            "state",
            state.len(),
            shape.recurrent_state_len(),
            batch.max_slot,
        )?;
        inputs.check(OP, shape, n)?;
        if n > 65_535 {
            return Err(invalid(
                OP,
                "batch",
                format!("{n} sequences exceed the launch grid (65535)"),
            ));
        }
        exact(OP, "out", out.len(), n * hv * HEAD_DIM)?;
        let (hk_, hv_) = (hk as i32, hv as i32);
        let func = match state {
            RecurrentState::F32(_) => &self.f.decode_step,
            RecurrentState::Bf16(_) => &self.f.decode_step_bf16,
        };
        let mut b = self.stream.launch_builder(func);
        b.arg(out);
        match state {
            RecurrentState::F32(s) => b.arg(s),
            RecurrentState::Bf16(s) => b.arg(s),
        };
        b.arg(&batch.seq_slot);
        b.arg(&inputs.q).arg(&inputs.k).arg(&inputs.v);
        b.arg(&inputs.alpha)
            .arg(&inputs.beta)
            .arg(&hk_)
            .arg(&hv_)
            .arg(&scale);
        // Four blocks per (sequence, head), 32 value rows each.
        let mut cfg = grid(hv, n, 256, 0);
        cfg.grid_dim.2 = 4;
        // SAFETY: matches gdn_decode_step(_bf16) (the state's element type
        // picked the kernel); lengths and slots checked.
        unsafe { b.launch(cfg) }.during(OP)?;
        Ok(())
    }

    /// DeltaNet output norm: per value head `w * o / rms(o) * silu(z)`, z from `proj`.
    pub fn deltanet_out_norm(
        &self,
        shape: DeltaNetShape,
        o: &CudaSlice<bf16>,
        proj: &CudaSlice<bf16>,
        weight: &CudaSlice<f32>,
        out: &mut CudaSlice<bf16>,
        eps: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::DeltaNetOutNorm;
        let hv = shape.v_heads;
        let t = o.len() / (hv * HEAD_DIM).max(1);
        exact(OP, "o", o.len(), t * hv * HEAD_DIM)?;
        exact(OP, "proj", proj.len(), t * shape.proj_width())?;
        exact(OP, "weight", weight.len(), HEAD_DIM)?;
        exact(OP, "out", out.len(), o.len())?;
        let rows = t * hv;
        let [ld, cz, rows_, hv_] = [shape.proj_width(), shape.col_z(), rows, hv].map(|x| x as i32);
        let mut b = self.stream.launch_builder(&self.f.gated_rmsnorm);
        b.arg(out).arg(o).arg(proj).arg(&ld).arg(&cz).arg(weight);
        b.arg(&rows_).arg(&hv_).arg(&eps);
        // SAFETY: matches gated_rmsnorm_bf16; one warp per row, 8 rows per block.
        unsafe { b.launch(grid(rows.div_ceil(8), 1, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// Blocks per (sequence, value head) of [`ModelOps::deltanet_decode_fused`]
    /// for a batch of `num_seqs`: the fewest of 1, 2, 4 that still give
    /// every multiprocessor 4 blocks, so that at small batches the state's
    /// loads spread over the whole GPU and at large ones the q/k conv, which
    /// every block of a (sequence, q/k head) recomputes, runs fewer times.
    /// The threshold is not tuned: at 2 splits the fused op measured slower
    /// than the unfused ops ([`ModelOps::deltanet_decode_fused_pays`]).
    pub fn deltanet_decode_splits(&self, num_seqs: usize, shape: DeltaNetShape) -> usize {
        let heads = num_seqs * shape.v_heads;
        [1, 2, 4]
            .into_iter()
            .find(|s| heads * s >= 4 * self.multiprocessors)
            .unwrap_or(4)
    }

    /// Whether a decode batch of `num_seqs` should take
    /// [`ModelOps::deltanet_decode_fused`] rather than the four unfused ops:
    /// unless the split rule gives 2 (batches of 9 to 16 sequences on the 4B
    /// and the H200). The fused op made decode steps faster at 4 splits
    /// (batch 1) and at 1 split (batch 64) and slower at 2 splits (batch 16)
    /// on the 4B (graphs, context 1024, fused and unfused binaries
    /// alternating twice:
    /// `docs/results/h200-2026-12-01-s2/qwen35_bench-decode-fused-deltanet-old-new.jsonl`).
    pub fn deltanet_decode_fused_pays(&self, num_seqs: usize, shape: DeltaNetShape) -> bool {
        self.deltanet_decode_splits(num_seqs, shape) != 2
    }

    /// The whole DeltaNet mixer between its two projections for a batch of
    /// single tokens, in one kernel: the conv of the new inputs over each
    /// slot's conv state with SiLU, q/k L2 norm and the gates (as
    /// [`ModelOps::deltanet_conv`]), the advanced conv state, the
    /// recurrent step in place on the state slots (as
    /// [`ModelOps::deltanet_decode`]) and the gated output norm (as
    /// [`ModelOps::deltanet_out_norm`], `eps`), into `out` (`[N, Hv, 128]`).
    /// `proj` is `[N, shape.proj_width()]`; state layouts are the unfused
    /// ops' (`[slots, kernel - 1, conv_dim]` bf16, `[slots, Hv, 128, 128]`
    /// in the state's dtype).
    #[allow(clippy::too_many_arguments)]
    pub fn deltanet_decode_fused(
        &self,
        batch: &DeviceBatch,
        shape: DeltaNetShape,
        proj: &CudaSlice<bf16>,
        weights: DeltaNetWeights,
        conv_state: &mut CudaSlice<bf16>,
        state: &mut RecurrentState,
        out: &mut CudaSlice<bf16>,
        scale: f32,
        eps: f32,
    ) -> Result<(), GdnError> {
        const OP: Op = Op::DeltaNetDecodeFused;
        shape.check()?;
        one_token_per_sequence(OP, batch)?;
        let (n, hk, hv) = (batch.num_seqs, shape.qk_heads, shape.v_heads);
        let ld = shape.proj_width();
        exact(OP, "proj", proj.len(), n * ld)?;
        let (conv, a_log, dt_bias) = (weights.conv, weights.a_log, weights.dt_bias);
        check_conv_and_gates(OP, shape, conv, a_log, dt_bias, conv_state, batch)?;
        exact(OP, "norm_weight", weights.norm.len(), HEAD_DIM)?;
        pool(
            OP,
            "state",
            state.len(),
            shape.recurrent_state_len(),
            batch.max_slot,
        )?;
        exact(OP, "out", out.len(), n * hv * HEAD_DIM)?;
        let splits = self.deltanet_decode_splits(n, shape);
        let by_splits = match state {
            RecurrentState::F32(_) => &self.f.decode_fused,
            RecurrentState::Bf16(_) => &self.f.decode_fused_bf16,
        };
        let func = &by_splits[splits.trailing_zeros() as usize];
        let [ld_, cz, cb, ca, hk_, hv_, kw] = [
            ld,
            shape.col_z(),
            shape.col_b(),
            shape.col_a(),
            hk,
            hv,
            shape.conv_kernel,
        ]
        .map(|x| x as i32);
        // A launch covers as many sequences as the grid and the arrival
        // counters (one per sequence and q/k head) allow.
        let per_launch = (FUSED_DECODE_COUNTERS / hk).min(MAX_GRID_Y);
        let mut seq0 = 0;
        while seq0 < n {
            let count = per_launch.min(n - seq0);
            let first = i32_of(OP, "batch", seq0)?;
            let mut b = self.stream.launch_builder(func);
            b.arg(&mut *out);
            match &mut *state {
                RecurrentState::F32(s) => b.arg(s),
                RecurrentState::Bf16(s) => b.arg(s),
            };
            b.arg(&mut *conv_state).arg(&self.fused_arrivals);
            b.arg(proj).arg(&ld_).arg(&cz).arg(&cb).arg(&ca);
            b.arg(weights.conv)
                .arg(weights.a_log)
                .arg(weights.dt_bias)
                .arg(weights.norm);
            b.arg(&batch.seq_slot).arg(&first);
            b.arg(&hk_).arg(&hv_).arg(&kw).arg(&scale).arg(&eps);
            let mut cfg = grid(hv, count, 256, 0);
            cfg.grid_dim.2 = splits as u32;
            // SAFETY: matches gdn_decode_fused(_bf16)_s{splits} (the state's
            // element type picked the kernel); every length and
            // slot id checked above; 256 threads (one per q|k channel of a
            // head group); `count * hk` arrival counters, all zero between
            // launches on this stream.
            unsafe { b.launch(cfg) }.during(OP)?;
            seq0 += count;
        }
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
}

/// Tokens a warp of `gdn_conv_prep` takes for a batch of `tokens` (at most
/// 32: the warp's lanes hold its tokens' sequence lookups): one below 256
/// tokens, so that a decode batch keeps every warp in flight at once, then
/// one more for every 128 tokens. The sliding window reads each input row
/// once a warp plus `kw - 1` rows at its start, so longer runs save re-reads
/// while enough warps stay in flight to cover the memory latency (8k tokens:
/// 32 a warp, 16,384 warps for the 4B). Three other rules (a token more per
/// 256 or per 64 tokens, or at most 16) measured within the run-to-run
/// spread of this one at 512 to 8192 tokens (the kernel is bound by its
/// instructions, not by how its rows are shared out), so this one stayed
/// (docs/results/h200-2026-12-01-s5/
/// `qwen35_bench-conv-tokens-per-warp-variants.jsonl`).
fn conv_tokens_per_warp(tokens: usize) -> usize {
    (tokens / 128).clamp(1, 32)
}
