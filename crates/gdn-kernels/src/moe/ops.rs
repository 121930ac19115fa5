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

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, PushKernelArg};
use half::bf16;

use crate::model_ops::{exact, grid, ModelOps};
use crate::shared::error::{invalid, During, GdnError, Op};

/// Most experts a layer may have (the top-k kernel keeps E probabilities
/// per token in one warp's registers; the routing counts them in shared
/// memory).
pub const MOE_MAX_EXPERTS: usize = 512;
/// Most experts a token may pick (one warp argmax round each).
pub const MOE_MAX_TOP_K: usize = 16;
/// Rows of a GEMV tile (`moe_gemv_*`'s kMoeGemvRows).
const GEMV_TILE_ROWS: usize = 8;
/// Most tokens [`moe_path`] sends down the direct path.
pub const MOE_DIRECT_MAX_TOKENS: usize = 4;
/// Rows an expert gets on average from which [`moe_path`] takes the GEMV
/// tiles on tensor cores, and from which the 64-row tensor-core tiles.
const GEMV_MMA_RULE_ROWS: usize = 4;
const TILES_RULE_ROWS: usize = 16;
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

/// Shape of one MoE layer's experts. Weights are bf16: `gate_up` `[E, 2I,
/// H]` (gate rows `0..I`, up rows `I..2I`), `down` `[E, H, I]`; a shared
/// expert's `[2 Is, H]` and `[H, Is]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// E: experts in the layer.
    pub experts: usize,
    /// k: experts each token picks.
    pub top_k: usize,
    /// H: the model's hidden size.
    pub hidden: usize,
    /// I: each expert's intermediate size.
    pub inter: usize,
    /// Is: the shared expert's intermediate size; 0 for a layer without
    /// one.
    pub shared_inter: usize,
}

impl MoeShape {
    /// Elements of all experts' fused gate/up weights, `[E, 2I, H]`.
    pub fn gate_up_len(&self) -> usize {
        self.experts * 2 * self.inter * self.hidden
    }
    /// Elements of all experts' down weights, `[E, H, I]`.
    pub fn down_len(&self) -> usize {
        self.experts * self.hidden * self.inter
    }
    /// Columns of the router logits the op reads, `[T, router_width]`: the
    /// E expert logits, then, with a shared expert, its gate logit in
    /// column E and zeros up to a multiple of 8 (so the router GEMM's rows
    /// stay 16-byte aligned). The caller's router weight stacks the
    /// shared expert's gate as row E and zero rows after it.
    pub fn router_width(&self) -> usize {
        if self.shared_inter > 0 {
            (self.experts + 1).next_multiple_of(8)
        } else {
            self.experts
        }
    }
    /// Row length of the SwiGLU outputs on the direct path: the wider of
    /// I and Is.
    fn direct_act_ld(&self) -> usize {
        self.inter.max(self.shared_inter)
    }
    /// Whether the MoE kernels support this shape: E in 1..=512, k in
    /// 1..=min(16, E), H and I positive multiples of 32 (the tensor-core
    /// kernels' k step; the other kernels need multiples of 8), Is 0 or a
    /// multiple of 8 (the direct path's 16-byte loads).
    pub fn check(&self) -> Result<(), GdnError> {
        let ok = (1..=MOE_MAX_EXPERTS).contains(&self.experts)
            && (1..=MOE_MAX_TOP_K.min(self.experts)).contains(&self.top_k)
            && self.hidden > 0
            && self.hidden % 32 == 0
            && self.inter > 0
            && self.inter % 32 == 0
            && self.shared_inter % 8 == 0;
        ok.then_some(()).ok_or_else(|| {
            invalid(
                Op::MoeExperts,
                "shape",
                format!(
                    "unsupported {self:?} (E 1..=512, k 1..=min(16, E), H and I positive multiples of 32, Is a multiple of 8)"
                ),
            )
        })
    }
}

/// Which expert kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoePath {
    /// [`moe_path`]'s choice for the batch.
    Auto,
    /// GEMV-style kernels: each tile of at most 8 rows of one expert reads
    /// that expert's weights once, multiply-adds on the CUDA cores.
    Gemv,
    /// The same tiles of at most 8 rows on tensor cores (mma.sync, the
    /// tile's rows as the MMA's 8 columns): decode batches, a few rows per
    /// expert.
    GemvTensorCore,
    /// Tensor-core tiles of 64 rows (prefill: many rows per expert).
    TensorCore,
    /// No grouping: each (token, slot) pair reads its expert's weights
    /// (repeats read again), the shared expert runs in the same kernels
    /// from its weights ([`SharedExpert::Weights`]), and one kernel sums a
    /// token's down projections: three launches instead of five plus the
    /// shared expert's GEMMs (decode at a few tokens).
    Direct,
}

/// The expert kernels for `tokens` tokens of `shape`, by the rows the
/// average expert gets (`T k / E`): direct up to [`MOE_DIRECT_MAX_TOKENS`]
/// tokens (launches, not weight reads, are most of a layer's time there,
/// and `T k` pairs rarely repeat an expert), then the CUDA-core GEMV tiles
/// below `GEMV_MMA_RULE_ROWS` rows, the same tiles on tensor cores below
/// `TILES_RULE_ROWS`, the 64-row tensor-core tiles from there (prefill).
/// Measured with `moe_bench` at the 35B-A3B shape, every path at every T
/// (docs/performance.md, MoE routed experts): direct ahead of GEMV at 1, 2
/// and 4 tokens; CUDA-core GEMV ahead of the tensor-core GEMV at 1-2 rows
/// an expert, behind at 4; the tensor-core GEMV ahead of the 64-row tiles
/// at 4 and 8 rows, within 2% at 16, behind at 32.
pub fn moe_path(tokens: usize, shape: MoeShape) -> MoePath {
    let rows = |r: usize| tokens * shape.top_k < r * shape.experts;
    if tokens <= MOE_DIRECT_MAX_TOKENS {
        MoePath::Direct
    } else if rows(GEMV_MMA_RULE_ROWS) {
        MoePath::Gemv
    } else if rows(TILES_RULE_ROWS) {
        MoePath::GemvTensorCore
    } else {
        MoePath::TensorCore
    }
}

/// Tiles the routing may produce for `pairs` (token, slot) pairs in runs
/// of at most `rows`: each expert's last tile may be partial, and at most
/// min(E, pairs) experts have rows.
fn tile_bound(pairs: usize, rows: usize, experts: usize) -> usize {
    pairs.div_ceil(rows) + experts.min(pairs)
}

/// Device buffers of [`ModelOps::moe_experts`] for up to `max_tokens`
/// tokens of one [`MoeShape`]: allocated once, reused by every layer and
/// step (the routing, the intermediate rows and the expert outputs of the
/// current call), so a captured graph keeps the same addresses.
pub struct MoeScratch {
    shape: MoeShape,
    max_tokens: usize,
    /// `[T, k]`: each token's experts, best first.
    ids: CudaSlice<i32>,
    /// `[T, k]`: their renormalised probabilities (fp32, before HF's bf16 cast).
    weights: CudaSlice<f32>,
    /// `[T k]`: the pair (t k + slot) at each row of the permuted order.
    sorted_pair: CudaSlice<i32>,
    /// `[T k]`: the permuted row of each pair.
    pair_row: CudaSlice<i32>,
    /// The tile list: expert, first row and end row of each tile.
    tile_expert: CudaSlice<i32>,
    tile_row: CudaSlice<i32>,
    tile_end: CudaSlice<i32>,
    /// `[1]`: tiles in the list.
    num_tiles: CudaSlice<i32>,
    /// `[T k, I]`: SwiGLU outputs, permuted rows; on the direct path `[T
    /// k + T, max(I, Is)]` in pair order, the shared expert's rows last.
    act: CudaSlice<bf16>,
    /// `[T k, H]`: expert outputs, permuted rows.
    y: CudaSlice<bf16>,
}

impl MoeScratch {
    /// Buffers for up to `max_tokens` tokens of `shape` on `stream` (the
    /// stream the ops launch on).
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: MoeShape,
        max_tokens: usize,
    ) -> Result<Self, GdnError> {
        const OP: Op = Op::MoeExperts;
        shape.check()?;
        let pairs = max_tokens * shape.top_k;
        if max_tokens == 0 || i32::try_from(pairs * shape.hidden.max(shape.inter)).is_err() {
            return Err(invalid(
                OP,
                "max_tokens",
                format!(
                    "{max_tokens}: needs 1 or more, and max_tokens * k * max(H, I) within i32 (row offsets)"
                ),
            ));
        }
        let tiles = tile_bound(pairs, GEMV_TILE_ROWS, shape.experts);
        Ok(MoeScratch {
            shape,
            max_tokens,
            ids: stream.alloc_zeros(pairs).during(OP)?,
            weights: stream.alloc_zeros(pairs).during(OP)?,
            sorted_pair: stream.alloc_zeros(pairs).during(OP)?,
            pair_row: stream.alloc_zeros(pairs).during(OP)?,
            tile_expert: stream.alloc_zeros(tiles).during(OP)?,
            tile_row: stream.alloc_zeros(tiles).during(OP)?,
            tile_end: stream.alloc_zeros(tiles).during(OP)?,
            num_tiles: stream.alloc_zeros(1).during(OP)?,
            act: stream.alloc_zeros(act_len(shape, max_tokens)).during(OP)?,
            y: stream.alloc_zeros(pairs * shape.hidden).during(OP)?,
        })
    }

    /// Device bytes [`MoeScratch::new`] allocates for `max_tokens` tokens
    /// of `shape` (for the caller's memory sizing): mostly the permuted
    /// intermediate and expert outputs, `max_tokens * k * (I + H)` bf16.
    pub fn device_bytes(shape: MoeShape, max_tokens: usize) -> usize {
        let pairs = max_tokens * shape.top_k;
        let tiles = tile_bound(pairs, GEMV_TILE_ROWS, shape.experts);
        pairs * 4 * 4
            + (3 * tiles + 1) * 4
            + (act_len(shape, max_tokens) + pairs * shape.hidden) * 2
    }

    pub fn shape(&self) -> MoeShape {
        self.shape
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// `[max_tokens, k]`: the experts of the last call's tokens (its first
    /// `T k` elements), best first; ties go to the lower expert index.
    pub fn ids(&self) -> &CudaSlice<i32> {
        &self.ids
    }

    /// `[max_tokens, k]`: the routing weights matching [`MoeScratch::ids`],
    /// renormalised to sum 1 per token, in fp32.
    pub fn weights(&self) -> &CudaSlice<f32> {
        &self.weights
    }
}

/// Elements of [`MoeScratch`]'s SwiGLU outputs: the grouped paths' `T k`
/// rows of I, or the direct path's `T k + T` rows of max(I, Is) for its at
/// most [`MOE_DIRECT_MAX_TOKENS`] tokens, whichever is more.
fn act_len(shape: MoeShape, max_tokens: usize) -> usize {
    let direct = max_tokens.min(MOE_DIRECT_MAX_TOKENS);
    (max_tokens * shape.top_k * shape.inter).max(direct * (shape.top_k + 1) * shape.direct_act_ld())
}

/// All experts' weights of one layer (see [`MoeShape`] for the layouts).
#[derive(Clone, Copy)]
pub struct MoeExperts<'a> {
    pub gate_up: &'a CudaSlice<bf16>,
    pub down: &'a CudaSlice<bf16>,
}

/// The shared expert of a layer whose [`MoeShape::shared_inter`] is set,
/// which [`ModelOps::moe_experts`] adds as `sigmoid(gate) * out`, the gate
/// logit from the router logits' column E.
#[derive(Clone, Copy)]
pub enum SharedExpert<'a> {
    /// Its output `[T, H]`, computed by the caller (any path).
    Output(&'a CudaSlice<bf16>),
    /// Its weights, `gate_up` `[2 Is, H]` and `down` `[H, Is]`: the op runs
    /// it inside its own kernels ([`MoePath::Direct`] only).
    Weights(MoeExperts<'a>),
}

/// The kernels of this module.
pub(crate) struct MoeFunctions {
    pub(crate) topk_softmax: CudaFunction,
    pub(crate) route: CudaFunction,
    pub(crate) gemv_gate_up: CudaFunction,
    pub(crate) gemv_down: CudaFunction,
    pub(crate) gemv_mma_gate_up: CudaFunction,
    pub(crate) gemv_mma_down: CudaFunction,
    pub(crate) gemm_gate_up: CudaFunction,
    pub(crate) gemm_down: CudaFunction,
    pub(crate) combine: CudaFunction,
    pub(crate) direct_gate_up: CudaFunction,
    pub(crate) direct_down_combine: CudaFunction,
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
        const OP: Op = Op::MoeExperts;
        let shape = scratch.shape;
        let (e, k, h, i, is) = (
            shape.experts,
            shape.top_k,
            shape.hidden,
            shape.inter,
            shape.shared_inter,
        );
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
        if t == 0 {
            return Ok(path);
        }
        let f = &self.f.moe;
        let pairs = t * k;
        let [t_, e_, k_, h_, i_, pairs_, width_] = [t, e, k, h, i, pairs, width].map(|v| v as i32);
        let null = 0u64;

        // 1. Top-k softmax per token.
        let mut b = self.stream.launch_builder(&f.topk_softmax);
        b.arg(router_logits).arg(&width_).arg(&t_).arg(&e_).arg(&k_);
        b.arg(&mut scratch.ids).arg(&mut scratch.weights);
        // SAFETY: matches moe_topk_softmax(logits, stride, tokens, experts,
        // top_k, ids, weights); logits hold T rows of `width` >= E, ids and
        // weights at least T k (T <= max_tokens); E <= 512 and k <= min(16,
        // E) (shape.check).
        let blocks = t.div_ceil(TOPK_TOKENS_PER_BLOCK);
        unsafe { b.launch(grid(blocks, 1, 32 * TOPK_TOKENS_PER_BLOCK as u32, 0)) }.during(OP)?;

        if path == MoePath::Direct {
            return self.moe_direct(x, router_logits, experts, shared, scratch, out, t);
        }

        // 2. Group the pairs by expert into tiles of the path's rows.
        let (tile_rows, block_cols) = match path {
            MoePath::Gemv => (GEMV_TILE_ROWS, GEMV_BLOCK_COLS),
            MoePath::GemvTensorCore => (GEMV_TILE_ROWS, GEMV_MMA_BLOCK_COLS),
            _ => (TC_TILE_ROWS, TC_TILE_COLS),
        };
        let tile_rows_ = tile_rows as i32;
        let mut b = self.stream.launch_builder(&f.route);
        b.arg(&scratch.ids).arg(&pairs_).arg(&e_).arg(&tile_rows_);
        b.arg(&mut scratch.sorted_pair).arg(&mut scratch.pair_row);
        b.arg(&mut scratch.tile_expert).arg(&mut scratch.tile_row);
        b.arg(&mut scratch.tile_end).arg(&mut scratch.num_tiles);
        // SAFETY: matches moe_route; ids are the top-k kernel's (< E); the
        // tile list holds tile_bound(pairs, 8, E) entries, at least what
        // any routing of these pairs in tiles of >= 8 rows writes; one
        // block of 1024 threads (the kernel's scan assumes it).
        unsafe { b.launch(grid(1, 1, 1024, 0)) }.during(OP)?;

        // 3. gate_up + SwiGLU, then down, over the tile list.
        let tiles = tile_bound(pairs, tile_rows, e);
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

        // 4. Weighted un-permute (+ the gated shared expert).
        let mut b = self.stream.launch_builder(&f.combine);
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
        Ok(path)
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
        const OP: Op = Op::MoeExperts;
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

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN35_35B_A3B: MoeShape = MoeShape {
        experts: 256,
        top_k: 8,
        hidden: 2048,
        inter: 512,
        shared_inter: 512,
    };

    #[test]
    fn the_tile_bound_covers_every_routing() {
        // Worst case: every touched expert ends with a partial tile.
        for (pairs, rows, experts) in [
            (1usize, 8usize, 256usize),
            (8, 8, 256),
            (64, 8, 8),
            (8000, 64, 256),
        ] {
            let touched = experts.min(pairs);
            // `touched` experts with one row each except one with the rest.
            let rest = pairs - (touched - 1);
            let worst = (touched - 1) + rest.div_ceil(rows);
            assert!(tile_bound(pairs, rows, experts) >= worst);
        }
    }

    #[test]
    fn the_scratch_of_a_35b_prefill_chunk_is_its_two_permuted_buffers() {
        let bytes = MoeScratch::device_bytes(QWEN35_35B_A3B, 8192);
        let permuted = 8192 * 8 * (512 + 2048) * 2;
        assert!(bytes > permuted && bytes < permuted + (2 << 20), "{bytes}");
    }

    #[test]
    fn the_path_rule_takes_direct_then_gemv_for_decode_and_tensor_cores_for_prefill() {
        assert_eq!(moe_path(1, QWEN35_35B_A3B), MoePath::Direct);
        assert_eq!(moe_path(4, QWEN35_35B_A3B), MoePath::Direct);
        assert_eq!(moe_path(5, QWEN35_35B_A3B), MoePath::Gemv);
        assert_eq!(moe_path(127, QWEN35_35B_A3B), MoePath::Gemv);
        assert_eq!(moe_path(128, QWEN35_35B_A3B), MoePath::GemvTensorCore);
        assert_eq!(moe_path(511, QWEN35_35B_A3B), MoePath::GemvTensorCore);
        assert_eq!(moe_path(512, QWEN35_35B_A3B), MoePath::TensorCore);
        assert_eq!(moe_path(1024, QWEN35_35B_A3B), MoePath::TensorCore);
    }

    #[test]
    fn shapes_outside_the_kernels_are_refused_with_the_rule() {
        QWEN35_35B_A3B.check().unwrap();
        for bad in [
            MoeShape {
                experts: 513,
                ..QWEN35_35B_A3B
            },
            MoeShape {
                top_k: 17,
                ..QWEN35_35B_A3B
            },
            MoeShape {
                experts: 4,
                top_k: 5,
                ..QWEN35_35B_A3B
            },
            MoeShape {
                hidden: 2040,
                ..QWEN35_35B_A3B
            },
            MoeShape {
                inter: 0,
                ..QWEN35_35B_A3B
            },
        ] {
            let err = bad.check().unwrap_err().to_string();
            assert!(err.contains("multiples of 32"), "{err}");
        }
    }
}
