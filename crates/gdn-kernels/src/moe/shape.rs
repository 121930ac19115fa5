//! A MoE layer's shape and the path rule: which expert kernels a batch
//! runs ([`moe_path`], measured with `moe_bench`).

use crate::shared::error::{invalid, GdnError, Op};

/// Most experts a layer may have (the top-k kernel keeps E probabilities
/// per token in one warp's registers; the routing counts them in shared
/// memory).
pub const MOE_MAX_EXPERTS: usize = 512;
/// Most experts a token may pick (one warp argmax round each).
pub const MOE_MAX_TOP_K: usize = 16;
/// Most tokens [`moe_path`] sends down the direct path.
pub const MOE_DIRECT_MAX_TOKENS: usize = 4;
/// Rows an expert gets on average from which [`moe_path`] takes the GEMV
/// tiles on tensor cores, and from which the 64-row tensor-core tiles.
const GEMV_MMA_RULE_ROWS: usize = 4;
const TILES_RULE_ROWS: usize = 16;

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
    pub(crate) fn direct_act_ld(&self) -> usize {
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
    /// from its weights
    /// ([`SharedExpert::Weights`](crate::SharedExpert::Weights)), and one
    /// kernel sums a token's down projections: three launches instead of
    /// five plus the shared expert's GEMMs (decode at a few tokens).
    Direct,
}

/// The expert kernels for `tokens` tokens of `shape`, by the rows the
/// average expert gets (`T k / E`): direct up to [`MOE_DIRECT_MAX_TOKENS`]
/// tokens (launches, not weight reads, are most of a layer's time there,
/// and `T k` pairs rarely repeat an expert), then the CUDA-core GEMV tiles
/// below `GEMV_MMA_RULE_ROWS` rows, the same tiles on tensor cores below
/// `TILES_RULE_ROWS`, the 64-row tensor-core tiles from there (prefill).
/// Set from the crossovers `moe_bench` measured at the 35B-A3B shape, every
/// path at every T: direct ahead of GEMV at 1, 2 and 4 tokens; CUDA-core
/// GEMV ahead of the tensor-core GEMV at 1-2 rows an expert, behind at 4;
/// the tensor-core GEMV ahead of the 64-row tiles at 4 and 8 rows, even
/// with them at 16, behind at 32 (docs/performance.md, MoE routed experts;
/// the runs: docs/results/2026-12-07-s13/README.md).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::tests::QWEN35_35B_A3B;

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
