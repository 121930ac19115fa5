//! Decode steps as CUDA graphs: one graph per padded batch size (bucket),
//! captured up front so that no step waits for a capture. A step of `n`
//! decode rows replays the smallest bucket `>= n`; the rows beyond `n` are
//! padding rows on a scratch slot and page that the caller keeps out of
//! every real sequence's way (gdn_kernels' `Padding`).

use std::collections::BTreeMap;

use cudarc::driver::{CudaGraph, CudaSlice};
use engine::{PageId, SlotId};
use gdn_kernels::{DeviceBatch, Padding};

use crate::error::{Error, Result};
use crate::gpu::step::{layout_of, Batches, LogitsPlan, Row, RowLogits};
use crate::gpu::{scratch, GpuCache, GpuModel};

/// A captured decode step for one batch size: the graph, the batch buffers
/// its kernels read (rewritten before each replay) and its logits
/// (`[bucket, vocab]`, every row).
pub(crate) struct DecodeGraph {
    graph: CudaGraph,
    batch: DeviceBatch,
    pub logits: CudaSlice<f32>,
}

pub(crate) struct DecodeGraphs {
    /// Page-table width of every graph: sequences with more pages run eagerly.
    page_width: usize,
    pub padding: Padding,
    graphs: BTreeMap<usize, DecodeGraph>,
}

impl DecodeGraphs {
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.graphs.keys().copied().collect()
    }

    /// The bucket a decode step of `n` rows with up to `pages` pages each
    /// replays, if any.
    pub fn fits(&self, n: usize, pages: usize) -> Option<usize> {
        if pages > self.page_width {
            return None;
        }
        self.graphs.range(n..).next().map(|(&b, _)| b)
    }

    pub fn graph(&self, bucket: usize) -> &DecodeGraph {
        &self.graphs[&bucket]
    }
}

impl GpuModel {
    /// Captures a decode graph for each batch size in `buckets`, for
    /// sequences of up to `max_context` positions, padding with `padding_slot`
    /// and `padding_page` (which real rows may then no longer use). Replaces
    /// graphs captured before. Needs a created stream (capture is not
    /// allowed on the legacy default stream). The capture runs only padding
    /// rows: no real slot or page is touched.
    pub fn capture_decode_graphs(
        &mut self,
        cache: &mut GpuCache,
        buckets: &[usize],
        max_context: usize,
        padding_slot: SlotId,
        padding_page: PageId,
    ) -> Result<()> {
        if cache.model_id != self.id {
            return Err(Error::InvalidInput(
                "this cache was made by another model".into(),
            ));
        }
        if self.stream.cu_stream().is_null() {
            return Err(Error::InvalidInput(
                "CUDA graphs need a created stream, not the legacy default stream".into(),
            ));
        }
        if padding_slot.0 as usize >= cache.num_slots()
            || padding_page.0 as usize >= cache.num_pages()
        {
            return Err(Error::InvalidInput(format!(
                "padding slot {} / page {} outside the cache ({} slots, {} pages)",
                padding_slot.0,
                padding_page.0,
                cache.num_slots(),
                cache.num_pages()
            )));
        }
        if let Some(&b) = buckets.iter().find(|&&b| b == 0 || b > 65_535) {
            return Err(Error::InvalidInput(format!(
                "decode graph batch size {b} is not in 1..=65535"
            )));
        }
        let padding = Padding {
            slot: padding_slot.0 as i32,
            page: padding_page.0 as i32,
        };
        // No sequence can hold more pages than the cache has.
        let page_width = max_context
            .div_ceil(cache.page_size)
            .clamp(1, cache.num_pages());
        cache.graphs = None;
        let mut graphs = BTreeMap::new();
        for &bucket in buckets {
            let layout = self.padded_layout(&[], &[], bucket, page_width, cache.page_size, padding);
            let mut batch = DeviceBatch::upload(&self.stream, &layout)?;
            // Bounds = the cache's capacity, so any later decode step fits
            // the captured graph.
            batch.widen_bounds(
                cache.num_slots() - 1,
                cache.num_pages() - 1,
                page_width * cache.page_size - 1,
                self.config.vocab_size - 1,
            );
            let graph = self.capture(cache, batch, bucket)?;
            graphs.insert(bucket, graph);
        }
        cache.graphs = Some(DecodeGraphs {
            page_width,
            padding,
            graphs,
        });
        Ok(())
    }

    fn capture(
        &mut self,
        cache: &mut GpuCache,
        batch: DeviceBatch,
        bucket: usize,
    ) -> Result<DecodeGraph> {
        let s = self.stream.clone();
        let mut logits = scratch::<f32>(&s, bucket * self.config.vocab_size)?;
        let batches = Batches {
            full: batch,
            parts: None,
        };
        s.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        let captured = self.run(cache, &batches, LogitsPlan::LastOf(0, bucket), &mut logits);
        // End the capture whatever happened, so the stream is usable again.
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        captured?;
        let graph = graph?.ok_or_else(|| Error::Gpu("stream capture produced no graph".into()))?;
        // A first launch (padding rows only) so the first real step does
        // not pay the graph's upload.
        graph.launch()?;
        Ok(DecodeGraph {
            graph,
            batch: batches.full,
            logits,
        })
    }

    /// `rows` in `order`, then padding rows up to `bucket`, `width` pages wide.
    fn padded_layout(
        &self,
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

    /// A decode step through the graph of `bucket`: the batch buffers are
    /// rewritten in place and the graph replayed.
    pub(crate) fn replay_decode(
        &mut self,
        cache: &mut GpuCache,
        rows: &[Row],
        order: &[usize],
        bucket: usize,
    ) -> Result<()> {
        let graphs = cache.graphs.as_mut().expect("replay needs graphs");
        let layout = self.padded_layout(
            rows,
            order,
            bucket,
            graphs.page_width,
            cache.page_size,
            graphs.padding,
        );
        let g = graphs.graphs.get_mut(&bucket).expect("bucket from fits");
        g.batch.update(&self.stream, &layout)?;
        g.graph.launch()?;
        Ok(())
    }
}
