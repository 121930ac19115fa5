//! The device buffers of [`crate::ModelOps::moe_experts`], allocated once
//! for the largest batch so that a captured graph keeps their addresses.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use crate::moe::shape::{MoeShape, MOE_DIRECT_MAX_TOKENS};
use crate::shared::error::{invalid, During, GdnError, Op};

/// Rows of a GEMV tile (`moe_gemv_*`'s kMoeGemvRows).
pub(crate) const GEMV_TILE_ROWS: usize = 8;

/// Tiles the routing may produce for `pairs` (token, slot) pairs in runs
/// of at most `rows`: each expert's last tile may be partial, and at most
/// min(E, pairs) experts have rows.
pub(crate) fn tile_bound(pairs: usize, rows: usize, experts: usize) -> usize {
    pairs.div_ceil(rows) + experts.min(pairs)
}

/// Device buffers of [`ModelOps::moe_experts`](crate::ModelOps::moe_experts)
/// for up to `max_tokens` tokens of one [`MoeShape`]: allocated once, reused
/// by every layer and step (the routing, the intermediate rows and the
/// expert outputs of the current call), so a captured graph keeps the same
/// addresses.
pub struct MoeScratch {
    pub(crate) shape: MoeShape,
    pub(crate) max_tokens: usize,
    /// `[T, k]`: each token's experts, best first.
    pub(crate) ids: CudaSlice<i32>,
    /// `[T, k]`: their renormalised probabilities (fp32, before HF's bf16 cast).
    pub(crate) weights: CudaSlice<f32>,
    /// `[T k]`: the pair (t k + slot) at each row of the permuted order.
    pub(crate) sorted_pair: CudaSlice<i32>,
    /// `[T k]`: the permuted row of each pair.
    pub(crate) pair_row: CudaSlice<i32>,
    /// The tile list: expert, first row and end row of each tile.
    pub(crate) tile_expert: CudaSlice<i32>,
    pub(crate) tile_row: CudaSlice<i32>,
    pub(crate) tile_end: CudaSlice<i32>,
    /// `[1]`: tiles in the list.
    pub(crate) num_tiles: CudaSlice<i32>,
    /// `[T k, I]`: SwiGLU outputs, permuted rows; on the direct path `[T
    /// k + T, max(I, Is)]` in pair order, the shared expert's rows last.
    pub(crate) act: CudaSlice<bf16>,
    /// `[T k, H]`: expert outputs, permuted rows.
    pub(crate) y: CudaSlice<bf16>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::tests::QWEN35_35B_A3B;

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
}
