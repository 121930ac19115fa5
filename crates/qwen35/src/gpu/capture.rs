//! Capturing decode steps as CUDA graphs and replaying them (see
//! [`crate::gpu::graphs`] for the buckets and tiers).

use std::collections::BTreeMap;

use cudarc::driver::CudaSlice;
use engine::{PageId, SlotId};
use gdn_kernels::{DeviceBatch, Padding};

use crate::error::{DeviceError, RunError};
use crate::gpu::graphs::{padded_layout, tier_widths, DecodeGraph, DecodeGraphs, GraphKey};
use crate::gpu::plan::{Batches, LogitsPlan, Row};
use crate::gpu::{scratch, GpuCache, GpuModel};

impl GpuModel {
    /// Captures a decode graph for each batch size in `buckets`, for
    /// sequences of up to `max_context` positions, padding with `padding_slot`
    /// and `padding_page` (which real rows may then no longer use). Replaces
    /// graphs captured before. Needs a created stream (capture is not
    /// allowed on the legacy default stream). The capture runs only padding
    /// rows: no real slot or page is touched. Returns the time each batch
    /// size took (its graphs of every width, captured and launched once).
    pub fn capture_decode_graphs(
        &mut self,
        cache: &mut GpuCache,
        buckets: &[usize],
        max_context: usize,
        padding_slot: SlotId,
        padding_page: PageId,
    ) -> Result<Vec<(usize, std::time::Duration)>, RunError> {
        if cache.model_id != self.id {
            return Err(RunError::InvalidInput(
                "this cache was made by another model".into(),
            ));
        }
        if self.stream.cu_stream().is_null() {
            return Err(RunError::InvalidInput(
                "CUDA graphs need a created stream, not the legacy default stream".into(),
            ));
        }
        if padding_slot.0 as usize >= cache.num_slots()
            || padding_page.0 as usize >= cache.num_pages()
        {
            return Err(RunError::InvalidInput(format!(
                "padding slot {} / page {} outside the cache ({} slots, {} pages)",
                padding_slot.0,
                padding_page.0,
                cache.num_slots(),
                cache.num_pages()
            )));
        }
        if let Some(&b) = buckets.iter().find(|&&b| b == 0 || b > 65_535) {
            return Err(RunError::InvalidInput(format!(
                "decode graph batch size {b} is not in 1..=65535"
            )));
        }
        let padding = Padding {
            slot: padding_slot.0 as i32,
            page: padding_page.0 as i32,
        };
        let widths = tier_widths(max_context, cache.page_size, cache.num_pages());
        cache.graphs = None;
        let top = buckets.iter().copied().max().unwrap_or(1);
        let mut logits = scratch::<f32>(&self.stream, top * self.config.vocab_size)?;
        let mut graphs = BTreeMap::new();
        let mut took = Vec::with_capacity(buckets.len());
        for &bucket in buckets {
            let start = std::time::Instant::now();
            for &width in &widths {
                let layout = padded_layout(&[], &[], bucket, width, cache.page_size, padding);
                let mut batch = DeviceBatch::upload(&self.stream, &layout)?;
                // Bounds = the cache's capacity, so any later decode step
                // within the width fits the captured graph.
                batch.widen_bounds(
                    cache.num_slots() - 1,
                    cache.num_pages() - 1,
                    width * cache.page_size - 1,
                    self.config.vocab_size - 1,
                );
                let graph = self.capture(cache, batch, bucket, &mut logits)?;
                graphs.insert((bucket, width), graph);
            }
            // The first launches are asynchronous: the bucket is ready when
            // they are done.
            self.stream.synchronize()?;
            took.push((bucket, start.elapsed()));
        }
        log::info!(
            "qwen35 gpu: {} decode graphs captured (batch sizes {buckets:?}, page-table widths {widths:?})",
            graphs.len()
        );
        cache.graphs = Some(DecodeGraphs {
            padding,
            graphs,
            widths,
            logits,
        });
        Ok(took)
    }

    fn capture(
        &mut self,
        cache: &mut GpuCache,
        batch: DeviceBatch,
        bucket: usize,
        logits: &mut CudaSlice<f32>,
    ) -> Result<DecodeGraph, RunError> {
        let s = self.stream.clone();
        let batches = Batches {
            full: batch,
            parts: None,
        };
        s.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        let captured = self.run(cache, &batches, LogitsPlan::LastOf(0, bucket), logits);
        // End the capture whatever happened, so the stream is usable again.
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        captured?;
        let graph = graph?.ok_or(DeviceError::NoGraph)?;
        // A first launch (padding rows only) so the first real step does
        // not pay the graph's upload.
        graph.launch()?;
        Ok(DecodeGraph {
            graph,
            batch: batches.full,
        })
    }

    /// A decode step through the graph of `key`: the batch buffers are
    /// rewritten in place and the graph replayed; the logits land in the
    /// graphs' shared buffer, batch row order.
    pub(crate) fn replay_decode(
        &mut self,
        cache: &mut GpuCache,
        rows: &[Row],
        order: &[usize],
        key: GraphKey,
    ) -> Result<(), RunError> {
        let graphs = cache.graphs.as_mut().expect("replay needs graphs");
        let (bucket, width) = key;
        let layout = padded_layout(rows, order, bucket, width, cache.page_size, graphs.padding);
        let g = graphs.graphs.get_mut(&key).expect("key from fits");
        g.batch.update(&self.stream, &layout)?;
        g.graph.launch()?;
        Ok(())
    }
}
