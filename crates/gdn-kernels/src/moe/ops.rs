//! The routed experts of a Qwen3.5 MoE layer (transformers' qwen3_5_moe):
//! top-k softmax routing, the grouping of (token, slot) pairs by expert,
//! the grouped expert GEMMs with SwiGLU, and the weighted un-permute plus
//! the gated shared expert (`cuda/model_moe.cuh` has the kernels and their
//! rounding). The caller computes the router logits, with the shared
//! expert's gate logit as one more column ([`MoeShape::router_width`]), and,
//! except on the direct path, the shared expert with its dense ops.
//!
//! Graph-safe: the grouping is planned on the device into a
//! [`MoeScratch`] allocated once for the largest batch, and every launch's
//! grid is sized from the batch's token count alone, so a captured graph
//! replays with any routing.

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use crate::model_ops::{exact, grid, ModelOps};
use crate::moe::scratch::{tile_bound, MoeScratch, GEMV_TILE_ROWS};
use crate::moe::shape::{moe_path, MoePath, MOE_DIRECT_MAX_TOKENS};
use crate::shared::error::{invalid, During, GdnError, Op};

const OP: Op = Op::MoeExperts;

/// Output columns of a GEMV block: 8 warps of 2.
const GEMV_BLOCK_COLS: usize = 16;
/// Output columns of a tensor-core GEMV block: 4 warps of 16.
const GEMV_MMA_BLOCK_COLS: usize = 64;
/// Rows and columns of a tensor-core tile (`moe_gemm_*`'s kMoeTcRows and
/// kMoeTcCols).
const TC_TILE_ROWS: usize = 64;
const TC_TILE_COLS: usize = 64;
/// Tokens per block of the top-k kernel (a warp each).
const TOPK_TOKENS_PER_BLOCK: usize = 8;

/// All experts' weights of one layer (see [`MoeShape`](crate::MoeShape)
/// for the layouts).
#[derive(Clone, Copy)]
pub struct MoeExperts<'a> {
    pub gate_up: &'a CudaSlice<bf16>,
    pub down: &'a CudaSlice<bf16>,
}

/// The shared expert of a layer whose
/// [`MoeShape::shared_inter`](crate::MoeShape::shared_inter) is set, which
/// [`ModelOps::moe_experts`] adds as `sigmoid(gate) * out`, the gate logit
/// from the router logits' column E.
#[derive(Clone, Copy)]
pub enum SharedExpert<'a> {
    /// Its output `[T, H]`, computed by the caller (any path).
    Output(&'a CudaSlice<bf16>),
    /// Its weights, `gate_up` `[2 Is, H]` and `down` `[H, Is]`: the op runs
    /// it inside its own kernels ([`MoePath::Direct`] only).
    Weights(MoeExperts<'a>),
}

impl ModelOps {
    /// The routed experts of a MoE layer for `T = x.len() / H` tokens:
    /// `out[t] = sum_s w[t, s] * down_e(silu(gate_e x[t]) * up_e x[t])`
    /// over the token's top-k experts `e` of softmax over the first E
    /// columns of `router_logits[t]` (`[T, shape.router_width()]`, bf16,
    /// from the caller's router GEMM), the weights renormalised to sum 1;
    /// plus `sigmoid(router_logits[t, E]) * shared` where the shape has a
    /// shared expert (`shared` must then be given, and only then). `x` and
    /// `out` are `[T, H]`. Runs the kernels `path` names ([`moe_path`]'s
    /// choice for [`MoePath::Auto`]; [`SharedExpert::Weights`] only on
    /// [`MoePath::Direct`]) and returns which ran. Leaves the routing in
    /// `scratch` ([`MoeScratch::ids`], [`MoeScratch::weights`]). `out` is
    /// the layer's delta, as the dense MLP's down projection is: the caller
    /// adds it to the residual with [`ModelOps::add_rmsnorm`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts(
        &self,
        x: &CudaSlice<bf16>,
        router_logits: &CudaSlice<bf16>,
        experts: MoeExperts<'_>,
        shared: Option<SharedExpert<'_>>,
        scratch: &mut MoeScratch,
        out: &mut CudaSlice<bf16>,
        path: MoePath,
    ) -> Result<MoePath, GdnError> {
        // 0. Check every operand and settle the path.
        let (t, path) = check_moe_call(x, router_logits, experts, shared, scratch, out, path)?;
        if t == 0 {
            return Ok(path);
        }
        // 1. Top-k softmax per token.
        self.moe_topk(router_logits, scratch, t)?;
        if path == MoePath::Direct {
            return self.moe_direct(x, router_logits, experts, shared, scratch, out, t);
        }
        // 2. Group the pairs by expert into tiles of the path's rows.
        let (tile_rows, block_cols) = match path {
            MoePath::Gemv => (GEMV_TILE_ROWS, GEMV_BLOCK_COLS),
            MoePath::GemvTensorCore => (GEMV_TILE_ROWS, GEMV_MMA_BLOCK_COLS),
            _ => (TC_TILE_ROWS, TC_TILE_COLS),
        };
        self.moe_route(scratch, t, tile_rows)?;
        // 3. gate_up + SwiGLU, then down, over the tile list.
        self.moe_expert_gemms(x, experts, scratch, t, path, tile_rows, block_cols)?;
        // 4. Weighted un-permute (+ the gated shared expert).
        self.moe_combine(router_logits, shared, scratch, out, t)?;
        Ok(path)
    }

    /// Step 1 of [`ModelOps::moe_experts`]: each of the `t` tokens' top-k
    /// experts and renormalised weights into `scratch`.
    fn moe_topk(
        &self,
        router_logits: &CudaSlice<bf16>,
        scratch: &mut MoeScratch,
        t: usize,
    ) -> Result<(), GdnError> {
        let shape = scratch.shape;
        let [t_, e_, k_, width_] =
            [t, shape.experts, shape.top_k, shape.router_width()].map(|v| v as i32);
        let mut b = self.stream.launch_builder(&self.f.moe.topk_softmax);
        b.arg(router_logits).arg(&width_).arg(&t_).arg(&e_).arg(&k_);
        b.arg(&mut scratch.ids).arg(&mut scratch.weights);
        // SAFETY: matches moe_topk_softmax(logits, stride, tokens, experts,
        // top_k, ids, weights); logits hold T rows of `width` >= E, ids and
        // weights at least T k (T <= max_tokens); E <= 512 and k <= min(16,
        // E) (shape.check).
        let blocks = t.div_ceil(TOPK_TOKENS_PER_BLOCK);
        unsafe { b.launch(grid(blocks, 1, 32 * TOPK_TOKENS_PER_BLOCK as u32, 0)) }.during(OP)?;
        Ok(())
    }

    /// Step 2: the `t k` (token, slot) pairs grouped by expert into a tile
    /// list of runs of at most `tile_rows`.
    fn moe_route(
        &self,
        scratch: &mut MoeScratch,
        t: usize,
        tile_rows: usize,
    ) -> Result<(), GdnError> {
        let shape = scratch.shape;
        let [pairs_, e_, tile_rows_] =
            [t * shape.top_k, shape.experts, tile_rows].map(|v| v as i32);
        let mut b = self.stream.launch_builder(&self.f.moe.route);
        b.arg(&scratch.ids).arg(&pairs_).arg(&e_).arg(&tile_rows_);
        b.arg(&mut scratch.sorted_pair).arg(&mut scratch.pair_row);
        b.arg(&mut scratch.tile_expert).arg(&mut scratch.tile_row);
        b.arg(&mut scratch.tile_end).arg(&mut scratch.num_tiles);
        // SAFETY: matches moe_route; ids are the top-k kernel's (< E); the
        // tile list holds tile_bound(pairs, 8, E) entries, at least what
        // any routing of these pairs in tiles of >= 8 rows writes; one
        // block of 1024 threads (the kernel's scan assumes it).
        unsafe { b.launch(grid(1, 1, 1024, 0)) }.during(OP)?;
        Ok(())
    }

    /// Step 3: gate_up with SwiGLU into the permuted rows, then down, on
    /// the kernels of `path` over step 2's tile list.
    #[allow(clippy::too_many_arguments)]
    fn moe_expert_gemms(
        &self,
        x: &CudaSlice<bf16>,
        experts: MoeExperts<'_>,
        scratch: &mut MoeScratch,
        t: usize,
        path: MoePath,
        tile_rows: usize,
        block_cols: usize,
    ) -> Result<(), GdnError> {
        let f = &self.f.moe;
        let shape = scratch.shape;
        let (k, h, i) = (shape.top_k, shape.hidden, shape.inter);
        let [k_, h_, i_] = [k, h, i].map(|v| v as i32);
        let null = 0u64;
        let tiles = tile_bound(t * k, tile_rows, shape.experts);
        let (gate_up_fn, down_fn, threads) = match path {
            MoePath::Gemv => (&f.gemv_gate_up, &f.gemv_down, 256),
            MoePath::GemvTensorCore => (&f.gemv_mma_gate_up, &f.gemv_mma_down, 128),
            _ => (&f.gemm_gate_up, &f.gemm_down, 128),
        };
        let mut b = self.stream.launch_builder(gate_up_fn);
        b.arg(&mut scratch.act)
            .arg(x)
            .arg(&scratch.sorted_pair)
            .arg(&k_);
        b.arg(experts.gate_up).arg(&h_).arg(&i_);
        b.arg(&scratch.tile_expert).arg(&scratch.tile_row);
        b.arg(&scratch.tile_end).arg(&scratch.num_tiles);
        // SAFETY: matches moe_gemv_gate_up / moe_gemv_mma_gate_up /
        // moe_gemm_gate_up (out, in, row_src, src_div, w, K = H, N = I,
        // tiles); the grid covers the
        // tile bound (blocks past num_tiles exit) and I's column blocks;
        // rows index act (T k rows) and, through sorted_pair / k, x (T
        // rows); H % 32 == 0 and I % 32 == 0 (shape.check) keep the
        // 16-byte loads aligned and give the tensor-core GEMV its N % 16
        // and K % 32.
        unsafe { b.launch(grid(tiles, i.div_ceil(block_cols), threads, 0)) }.during(OP)?;
        let one = 1i32;
        let mut b = self.stream.launch_builder(down_fn);
        b.arg(&mut scratch.y).arg(&scratch.act).arg(&null).arg(&one);
        b.arg(experts.down).arg(&i_).arg(&h_);
        b.arg(&scratch.tile_expert).arg(&scratch.tile_row);
        b.arg(&scratch.tile_end).arg(&scratch.num_tiles);
        // SAFETY: matches moe_gemv_down / moe_gemv_mma_down / moe_gemm_down
        // (K = I, N = H, no row gather); as above.
        unsafe { b.launch(grid(tiles, h.div_ceil(block_cols), threads, 0)) }.during(OP)?;
        Ok(())
    }

    /// Step 4: each token's weighted sum of its experts' rows, plus the
    /// gated shared expert's output where given.
    fn moe_combine(
        &self,
        router_logits: &CudaSlice<bf16>,
        shared: Option<SharedExpert<'_>>,
        scratch: &MoeScratch,
        out: &mut CudaSlice<bf16>,
        t: usize,
    ) -> Result<(), GdnError> {
        let shape = scratch.shape;
        let [e_, k_, h_, width_] = [
            shape.experts,
            shape.top_k,
            shape.hidden,
            shape.router_width(),
        ]
        .map(|v| v as i32);
        let null = 0u64;
        let mut b = self.stream.launch_builder(&self.f.moe.combine);
        b.arg(out).arg(&scratch.y).arg(&scratch.pair_row);
        b.arg(&scratch.weights).arg(&k_).arg(&h_);
        match shared {
            Some(SharedExpert::Output(s)) => b.arg(s),
            _ => b.arg(&null),
        };
        b.arg(router_logits).arg(&width_).arg(&e_);
        // SAFETY: matches moe_combine(out, y, pair_row, weights, top_k,
        // hidden, shared, logits, stride, experts); pair_row < T k rows of
        // y; H % 8 == 0; the gate column E < width exists when `shared` is
        // set (checked above).
        unsafe { b.launch(grid(t, 1, 256, 0)) }.during(OP)?;
        Ok(())
    }

    /// [`MoePath::Direct`] after the top-k kernel: the pairs' (and the
    /// shared expert's) gate_up with SwiGLU, then each token's down
    /// projections, weighted sum and shared expert. `moe_experts` checked
    /// the operands.
    #[allow(clippy::too_many_arguments)]
    fn moe_direct(
        &self,
        x: &CudaSlice<bf16>,
        router_logits: &CudaSlice<bf16>,
        experts: MoeExperts<'_>,
        shared: Option<SharedExpert<'_>>,
        scratch: &mut MoeScratch,
        out: &mut CudaSlice<bf16>,
        t: usize,
    ) -> Result<MoePath, GdnError> {
        let f = &self.f.moe;
        let shape = scratch.shape;
        let (k, h, i, is) = (shape.top_k, shape.hidden, shape.inter, shape.shared_inter);
        let act_ld = shape.direct_act_ld();
        let [t_, e_, k_, h_, i_, is_, ld_, width_] =
            [t, shape.experts, k, h, i, is, act_ld, shape.router_width()].map(|v| v as i32);
        let null = 0u64;
        let weights = match shared {
            Some(SharedExpert::Weights(w)) => Some(w),
            _ => None,
        };
        let rows = t * k + if weights.is_some() { t } else { 0 };

        let mut b = self.stream.launch_builder(&f.direct_gate_up);
        b.arg(&mut scratch.act).arg(&ld_).arg(x).arg(&scratch.ids);
        b.arg(&t_).arg(&k_).arg(experts.gate_up).arg(&i_);
        match weights {
            Some(w) => b.arg(w.gate_up),
            None => b.arg(&null),
        };
        b.arg(&is_).arg(&h_);
        // SAFETY: matches moe_direct_gate_up(act, act_ld, x, ids, tokens,
        // top_k, w, inter, shared_w, shared_inter, K = H); act holds
        // act_len >= (T k + T) rows of act_ld (T <= the direct bound);
        // ids < E from the top-k kernel; H, I, Is and act_ld multiples of
        // 8 (shape.check) keep the 16-byte loads aligned.
        let cols = act_ld.div_ceil(GEMV_BLOCK_COLS);
        unsafe { b.launch(grid(rows, cols, 256, 0)) }.during(OP)?;

        let mut b = self.stream.launch_builder(&f.direct_down_combine);
        b.arg(out).arg(&scratch.act).arg(&ld_).arg(&scratch.ids);
        b.arg(&scratch.weights)
            .arg(&t_)
            .arg(&k_)
            .arg(experts.down)
            .arg(&i_);
        match weights {
            Some(w) => b.arg(w.down),
            None => b.arg(&null),
        };
        b.arg(&is_);
        match shared {
            Some(SharedExpert::Output(s)) => b.arg(s),
            _ => b.arg(&null),
        };
        b.arg(router_logits).arg(&width_).arg(&e_).arg(&h_);
        // SAFETY: matches moe_direct_down_combine(out, act, act_ld, ids,
        // weights, tokens, top_k, w, inter, shared_w, shared_inter,
        // shared_out, logits, stride, experts, hidden); act rows written by
        // the launch above; shared_w or shared_out only with a shared
        // expert, whose gate column E < width exists.
        unsafe { b.launch(grid(t, h.div_ceil(GEMV_BLOCK_COLS), 256, 0)) }.during(OP)?;
        Ok(MoePath::Direct)
    }
}

/// Step 0 of [`ModelOps::moe_experts`]: every operand's length against the
/// scratch's shape, the shared expert against the shape and the path, and
/// the path ([`moe_path`]'s for [`MoePath::Auto`]); returns the token count
/// and the path.
fn check_moe_call(
    x: &CudaSlice<bf16>,
    router_logits: &CudaSlice<bf16>,
    experts: MoeExperts<'_>,
    shared: Option<SharedExpert<'_>>,
    scratch: &MoeScratch,
    out: &CudaSlice<bf16>,
    path: MoePath,
) -> Result<(usize, MoePath), GdnError> {
    let shape = scratch.shape;
    let (h, is) = (shape.hidden, shape.shared_inter);
    let width = shape.router_width();
    let t = x.len() / h;
    exact(OP, "x", x.len(), t * h)?;
    if t > scratch.max_tokens {
        return Err(invalid(
            OP,
            "x",
            format!(
                "{t} tokens; the scratch holds at most {}",
                scratch.max_tokens
            ),
        ));
    }
    exact(OP, "router_logits", router_logits.len(), t * width)?;
    exact(OP, "gate_up", experts.gate_up.len(), shape.gate_up_len())?;
    exact(OP, "down", experts.down.len(), shape.down_len())?;
    exact(OP, "out", out.len(), t * h)?;
    let path = match path {
        MoePath::Auto => moe_path(t, shape),
        chosen => chosen,
    };
    match (shared, is > 0) {
        (None, false) => {}
        (Some(SharedExpert::Output(s)), true) => exact(OP, "shared", s.len(), t * h)?,
        (Some(SharedExpert::Weights(w)), true) if path == MoePath::Direct => {
            exact(OP, "shared.gate_up", w.gate_up.len(), 2 * is * h)?;
            exact(OP, "shared.down", w.down.len(), h * is)?;
        }
        (Some(SharedExpert::Weights(_)), true) => {
            return Err(invalid(
                OP,
                "shared",
                format!(
                    "the shared expert's weights run inside the direct path only; {path:?} takes its output"
                ),
            ))
        }
        (got, _) => {
            return Err(invalid(
                OP,
                "shared",
                format!(
                    "the shape's shared expert (Is {is}) and the operand ({}) disagree",
                    if got.is_some() { "given" } else { "none" }
                ),
            ))
        }
    }
    if path == MoePath::Direct && t > MOE_DIRECT_MAX_TOKENS {
        return Err(invalid(
            OP,
            "x",
            format!("{t} tokens; the direct path takes at most {MOE_DIRECT_MAX_TOKENS}"),
        ));
    }
    Ok((t, path))
}
