//! The packed varlen batch every model op works on: which sequence each token
//! belongs to, where it sits, which state slot and KV pages the sequence owns.
//! Built on the host, checked once, copied to the device once per step.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{op_error, GdnError};

const OP: &str = "batch";

/// Host description of one step's batch. Sequence `s` contributes tokens
/// `cu_seqlens[s]..cu_seqlens[s + 1]`, at absolute positions
/// `start_positions[s]..`, with state slot `slots[s]`; its KV pages are
/// `block_table[s * max_blocks..][..]` (page `p` holds positions
/// `p * page_size..(p + 1) * page_size`).
#[derive(Clone, Debug, Default)]
pub struct BatchLayout {
    pub cu_seqlens: Vec<i32>,
    pub start_positions: Vec<i32>,
    pub slots: Vec<i32>,
    pub block_table: Vec<i32>,
    pub max_blocks: usize,
    pub page_size: usize,
}

/// A checked [`BatchLayout`] on the device, with the per-token tables the
/// kernels index by.
pub struct DeviceBatch {
    pub num_tokens: usize,
    pub num_seqs: usize,
    pub max_blocks: usize,
    pub page_size: usize,
    /// Largest slot and page id used (checked against pool sizes by each op).
    pub(crate) max_slot: usize,
    pub(crate) max_page: usize,
    pub(crate) host_cu_seqlens: Vec<i64>,
    pub(crate) last_token_rows: Vec<i32>,
    pub(crate) tok_seq: CudaSlice<i32>,
    pub(crate) cu_seqlens: CudaSlice<i32>,
    pub(crate) seq_slot: CudaSlice<i32>,
    pub(crate) positions: CudaSlice<i32>,
    pub(crate) block_table: CudaSlice<i32>,
}

impl DeviceBatch {
    /// Checks `layout` (monotone offsets, no empty sequence, pages cover every
    /// position, non-negative ids) and uploads it.
    pub fn upload(stream: &Arc<CudaStream>, layout: &BatchLayout) -> Result<Self, GdnError> {
        let l = layout;
        let n = l.slots.len();
        if n == 0 || l.cu_seqlens.len() != n + 1 || l.start_positions.len() != n {
            return Err(op_error(
                OP,
                format!(
                    "{} slots, {} offsets, {} start positions: need N >= 1, N + 1, N",
                    n,
                    l.cu_seqlens.len(),
                    l.start_positions.len()
                ),
            ));
        }
        if l.cu_seqlens[0] != 0 || l.page_size == 0 || l.block_table.len() != n * l.max_blocks {
            return Err(op_error(
                OP,
                format!(
                    "offsets must start at 0 (got {}), page size > 0 (got {}), block table [N, {}] (got {} entries)",
                    l.cu_seqlens[0], l.page_size, l.max_blocks, l.block_table.len()
                ),
            ));
        }
        let mut tok_seq = vec![];
        let mut positions = vec![];
        let mut last_rows = vec![];
        let mut max_page = 0usize;
        for s in 0..n {
            let (a, b) = (l.cu_seqlens[s], l.cu_seqlens[s + 1]);
            if b <= a {
                return Err(op_error(OP, format!("sequence {s} has no tokens ({a}..{b})")));
            }
            let p0 = l.start_positions[s];
            if p0 < 0 || l.slots[s] < 0 {
                return Err(op_error(OP, format!("sequence {s}: negative position or slot")));
            }
            let last = p0 as usize + (b - a) as usize - 1;
            let pages_needed = last / l.page_size + 1;
            if pages_needed > l.max_blocks {
                return Err(op_error(
                    OP,
                    format!("sequence {s} reaches position {last}, beyond its {} pages of {}", l.max_blocks, l.page_size),
                ));
            }
            for &p in &l.block_table[s * l.max_blocks..s * l.max_blocks + pages_needed] {
                if p < 0 {
                    return Err(op_error(OP, format!("sequence {s} has no page for a position it uses")));
                }
                max_page = max_page.max(p as usize);
            }
            for t in 0..(b - a) {
                tok_seq.push(s as i32);
                positions.push(p0 + t);
            }
            last_rows.push(b - 1);
        }
        let upload = |v: &[i32]| stream.clone_htod(v);
        Ok(DeviceBatch {
            num_tokens: tok_seq.len(),
            num_seqs: n,
            max_blocks: l.max_blocks,
            page_size: l.page_size,
            max_slot: l.slots.iter().copied().max().unwrap_or(0) as usize,
            max_page,
            host_cu_seqlens: l.cu_seqlens.iter().map(|&x| x as i64).collect(),
            tok_seq: upload(&tok_seq)?,
            cu_seqlens: upload(&l.cu_seqlens)?,
            seq_slot: upload(&l.slots)?,
            positions: upload(&positions)?,
            block_table: upload(if l.block_table.is_empty() { &[0] } else { &l.block_table })?,
            last_token_rows: last_rows,
        })
    }

    /// Token offsets of the sequences, as the GDN prefill op takes them.
    pub fn cu_seqlens(&self) -> &[i64] {
        &self.host_cu_seqlens
    }

    /// Row of each sequence's last token in the packed batch.
    pub fn last_token_rows(&self) -> &[i32] {
        &self.last_token_rows
    }
}
