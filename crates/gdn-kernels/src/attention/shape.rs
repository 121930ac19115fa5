//! The attention layer's shape and the launch geometry of our kernels:
//! the prefill kernel's shared memory, and how many blocks split a decode
//! row's keys (the rule for each decode kernel).

use crate::shared::error::{invalid, GdnError, Op};

/// The largest GQA group (query heads per KV head) our kernels take.
const MAX_GQA: usize = 8;
/// Threads of a block of the CUDA-core decode kernels.
pub(crate) const ATTN_THREADS: u32 = 128;
/// The tensor-core decode's block: four warps, each with its own ring of
/// `stages` 8-key tiles (K and V, 8 KiB a tile).
pub(crate) const DECODE_TC_THREADS: u32 = 128;

/// Dynamic shared memory of the tensor-core decode with `stages` tiles in
/// flight per warp (its rings; the warps' merge at the end reuses them).
pub(crate) fn decode_tc_smem(stages: usize) -> usize {
    4 * stages * 2 * 8 * 256 * 2
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
