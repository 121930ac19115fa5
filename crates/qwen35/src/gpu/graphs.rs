//! Decode steps as CUDA graphs: one graph per padded batch size (bucket) and
//! page-table width (tier), captured up front so that no step waits for a
//! capture. A step of `n` decode rows replays the smallest bucket `>= n` of
//! the narrowest tier that holds its longest row; the rows beyond `n` are
//! padding rows on a scratch slot and page that the caller keeps out of
//! every real sequence's way (gdn_kernels' `Padding`). Tiers keep the page
//! table a step uploads near the size its sequences need: one width for a
//! 256k-token context would upload megabytes of table per step.
//!
//! The graphs themselves are captured and replayed by the model
//! ([`crate::gpu::capture`]); this module holds them and picks one.

use std::collections::BTreeMap;

use cudarc::driver::{CudaGraph, CudaSlice};
use engine::{PageId, SlotId};
use gdn_kernels::{DeviceBatch, Padding};

use crate::gpu::plan::{layout_of, Row};
use crate::row_logits::RowLogits;

/// A captured decode step for one (bucket, tier): the graph and the batch
/// buffers its kernels read (rewritten before each replay).
pub(crate) struct DecodeGraph {
    pub graph: CudaGraph,
    pub batch: DeviceBatch,
}

/// Which graph a step replays: (bucket, page-table width).
pub(crate) type GraphKey = (usize, usize);
/// The captured decode steps of one cache.
pub(crate) struct DecodeGraphs {
    pub padding: Padding,
    /// By (bucket, page-table width).
    pub graphs: BTreeMap<GraphKey, DecodeGraph>,
    /// Page-table widths, narrowest first; sequences with more pages than
    /// the widest run eagerly.
    pub widths: Vec<usize>,
    /// `[largest bucket, vocab]`: every graph writes its rows' logits here
    /// (one graph runs at a time on the stream).
    pub logits: CudaSlice<f32>,
}

/// Page-table widths of the tiers for contexts up to `max_context`: 2048
/// positions, then x8, up to the whole context (capped by the pages that
/// exist).
pub(crate) fn tier_widths(max_context: usize, page_size: usize, num_pages: usize) -> Vec<usize> {
    let full = max_context.div_ceil(page_size).clamp(1, num_pages);
    let mut widths: Vec<usize> =
        std::iter::successors(Some(2048usize.div_ceil(page_size)), |w| Some(w * 8))
            .take_while(|&w| w < full)
            .collect();
    widths.push(full);
    widths
}

impl DecodeGraphs {
    pub fn batch_sizes(&self) -> Vec<usize> {
        let mut b: Vec<usize> = self.graphs.keys().map(|k| k.0).collect();
        b.dedup();
        b
    }

    /// The graph a decode step of `n` rows with up to `pages` pages each
    /// replays, if any.
    pub fn fits(&self, n: usize, pages: usize) -> Option<GraphKey> {
        let width = *self.widths.iter().find(|&&w| w >= pages)?;
        self.graphs
            .range((n, 0)..)
            .map(|(&k, _)| k)
            .find(|&(_, w)| w == width)
    }
}

/// `rows` in `order`, then padding rows up to `bucket`, `width` pages wide.
pub(crate) fn padded_layout(
    rows: &[Row],
    order: &[usize],
    bucket: usize,
    width: usize,
    page_size: usize,
    padding: Padding,
) -> gdn_kernels::BatchLayout {
    let mut layout = layout_of(rows, order, width, page_size);
    let pad_page = [PageId(padding.page as u32)];
    let pad = Row {
        slot: SlotId(padding.slot as u32),
        start: 0,
        tokens: &[0],
        pages: &pad_page,
        logits: RowLogits::None,
    };
    let extra = layout_of(&[pad], &[0], width, page_size);
    for _ in order.len()..bucket {
        let end = layout.cu_seqlens.last().expect("starts with 0") + 1;
        layout.cu_seqlens.push(end);
        layout.tokens.push(0);
        layout.start_positions.push(0);
        layout.slots.push(padding.slot);
        layout.block_table.extend_from_slice(&extra.block_table);
    }
    layout.padding = Some(padding);
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_by_eight_from_2048_positions_to_the_whole_context() {
        // 256k context, pages of 16: 128, 1024, 8192 and 16384 pages.
        assert_eq!(
            tier_widths(262_144, 16, 1 << 20),
            vec![128, 1024, 8192, 16384]
        );
        // A short context: one tier, the whole of it.
        assert_eq!(tier_widths(1000, 16, 1 << 20), vec![63]);
        // Never wider than the pages that exist.
        assert_eq!(tier_widths(262_144, 16, 500), vec![128, 500]);
        assert_eq!(tier_widths(4096, 16, 256), vec![128, 256]);
    }

    #[test]
    fn padding_rows_fill_the_bucket_on_the_scratch_slot_and_page() {
        let pages = [PageId(4), PageId(5)];
        let rows = [Row {
            slot: SlotId(1),
            start: 17,
            tokens: &[9],
            pages: &pages,
            logits: RowLogits::Last,
        }];
        let pad = Padding { slot: 7, page: 30 };
        let l = padded_layout(&rows, &[0], 4, 3, 16, pad);
        assert_eq!(l.slots, vec![1, 7, 7, 7]);
        assert_eq!(l.start_positions, vec![17, 0, 0, 0]);
        assert_eq!(l.tokens, vec![9, 0, 0, 0]);
        assert_eq!(l.cu_seqlens, vec![0, 1, 2, 3, 4]);
        assert_eq!(l.max_blocks, 3);
        assert_eq!(
            l.block_table,
            vec![4, 5, -1, 30, -1, -1, 30, -1, -1, 30, -1, -1]
        );
        assert_eq!(l.padding, Some(pad));
    }
}
