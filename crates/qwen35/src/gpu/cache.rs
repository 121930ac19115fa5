//! Per-sequence GPU state: a fixed number of state slots (DeltaNet conv state
//! in bf16 and recurrent state in f32, one slot per live sequence) and a paged
//! KV cache for the attention layers (pages of `page_size` positions handed
//! out from a free list as sequences grow).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use gdn_kernels::{AttentionShape, DeltaNetShape, DeviceBatch};
use half::bf16;

use crate::error::{Error, Result};

/// A live sequence in a [`GpuCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(u64);

#[derive(Debug)]
pub(crate) struct Seq {
    pub slot: usize,
    pub pages: Vec<usize>,
    /// Tokens processed so far (the next token's position).
    pub len: usize,
}

/// A captured decode step for one batch size: the graph, the batch buffers
/// its kernels read (rewritten before each replay) and its logits.
pub(crate) struct DecodeGraph {
    pub graph: CudaGraph,
    pub batch: DeviceBatch,
    pub logits: CudaSlice<f32>,
}

pub struct GpuCache {
    /// The model that made the cache (and captured its graphs).
    pub(crate) model_id: u64,
    stream: Arc<CudaStream>,
    pub(crate) dn: DeltaNetShape,
    pub(crate) page_size: usize,
    /// Per DeltaNet layer: `[slots, kw-1, conv_dim]` bf16.
    pub(crate) conv: Vec<CudaSlice<bf16>>,
    /// Per DeltaNet layer: `[slots, Hv, 128, 128]` f32.
    pub(crate) recurrent: Vec<CudaSlice<f32>>,
    /// Per attention layer: `[pages, page_size, Hkv, D]` bf16.
    pub(crate) keys: Vec<CudaSlice<bf16>>,
    pub(crate) values: Vec<CudaSlice<bf16>>,
    free_slots: Vec<usize>,
    free_pages: Vec<usize>,
    pub(crate) seqs: HashMap<SeqId, Seq>,
    next_id: u64,
    max_sequences: usize,
    num_pages: usize,
    /// Page-table width of captured decode graphs (`None`: graphs off).
    pub(crate) graph_page_width: Option<usize>,
    /// Captured decode steps by batch size. They reference buffers of this
    /// cache and of its model (checked by id on every step).
    pub(crate) graphs: HashMap<usize, DecodeGraph>,
}

impl GpuCache {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model_id: u64,
        stream: Arc<CudaStream>,
        dn: DeltaNetShape,
        attn: AttentionShape,
        layers: (usize, usize),
        max_sequences: usize,
        num_pages: usize,
        page_size: usize,
    ) -> Result<GpuCache> {
        if max_sequences == 0 || page_size == 0 || num_pages == 0 {
            return Err(Error::InvalidInput(
                "a cache needs at least one sequence slot and one page of at least one position"
                    .into(),
            ));
        }
        let (linear, full) = layers;
        let page_len = attn.page_len(page_size);
        let alloc_bf16 = |n: usize| stream.alloc_zeros::<bf16>(n);
        let conv = (0..linear)
            .map(|_| alloc_bf16(max_sequences * dn.conv_state_len()))
            .collect::<std::result::Result<_, _>>()?;
        let keys = (0..full)
            .map(|_| alloc_bf16(num_pages * page_len))
            .collect::<std::result::Result<_, _>>()?;
        let values = (0..full)
            .map(|_| alloc_bf16(num_pages * page_len))
            .collect::<std::result::Result<_, _>>()?;
        let recurrent = (0..linear)
            .map(|_| stream.alloc_zeros::<f32>(max_sequences * dn.recurrent_state_len()))
            .collect::<std::result::Result<_, _>>()?;
        Ok(GpuCache {
            model_id,
            stream,
            dn,
            page_size,
            conv,
            recurrent,
            keys,
            values,
            free_slots: (0..max_sequences).rev().collect(),
            free_pages: (0..num_pages).rev().collect(),
            seqs: HashMap::new(),
            next_id: 0,
            max_sequences,
            num_pages,
            graph_page_width: None,
            graphs: HashMap::new(),
        })
    }

    /// Decode steps (one token per sequence) of sequences up to
    /// `max_context` positions replay a CUDA graph captured on the first
    /// step of each batch size: one launch instead of hundreds. Needs a
    /// stream other than the legacy default stream (capture is not allowed
    /// there); steps the graphs cannot take run eagerly. The graphs use the
    /// model that captured them: use one model per cache.
    pub fn enable_decode_graphs(&mut self, max_context: usize) -> Result<()> {
        if self.stream.cu_stream().is_null() {
            return Err(Error::InvalidInput(
                "CUDA graphs need a created stream, not the legacy default stream".into(),
            ));
        }
        // No sequence can hold more pages than the cache has.
        let width = max_context
            .div_ceil(self.page_size)
            .clamp(1, self.num_pages);
        self.graph_page_width = Some(width);
        self.graphs.clear();
        Ok(())
    }

    /// Batch sizes with a captured decode graph.
    pub fn decode_graph_batch_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.graphs.keys().copied().collect();
        sizes.sort();
        sizes
    }

    pub(crate) fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    pub(crate) fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Starts a sequence in a free slot, with zero conv and recurrent state.
    pub fn add_sequence(&mut self) -> Result<SeqId> {
        let slot = self.free_slots.pop().ok_or_else(|| {
            Error::InvalidInput("every sequence slot is taken; release a sequence first".into())
        })?;
        let (c, r) = (self.dn.conv_state_len(), self.dn.recurrent_state_len());
        for conv in &mut self.conv {
            self.stream
                .memset_zeros(&mut conv.slice_mut(slot * c..(slot + 1) * c))?;
        }
        for rec in &mut self.recurrent {
            self.stream
                .memset_zeros(&mut rec.slice_mut(slot * r..(slot + 1) * r))?;
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            Seq {
                slot,
                pages: vec![],
                len: 0,
            },
        );
        Ok(id)
    }

    /// Ends a sequence and frees its slot and pages.
    pub fn release(&mut self, id: SeqId) -> Result<()> {
        let seq = self
            .seqs
            .remove(&id)
            .ok_or_else(|| Error::InvalidInput(format!("unknown sequence {id:?}")))?;
        self.free_slots.push(seq.slot);
        self.free_pages.extend(seq.pages);
        Ok(())
    }

    /// Tokens the sequence has processed.
    pub fn len(&self, id: SeqId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.len)
    }

    pub fn free_pages(&self) -> usize {
        self.free_pages.len()
    }

    /// Gives every sequence of the step enough pages for its new tokens, or
    /// changes nothing and fails when the free list cannot cover them all.
    pub(crate) fn reserve(&mut self, step: &[(SeqId, usize)]) -> Result<()> {
        let mut need = 0;
        for (id, n) in step {
            let seq = self
                .seqs
                .get(id)
                .ok_or_else(|| Error::InvalidInput(format!("unknown sequence {id:?}")))?;
            need += (seq.len + n)
                .div_ceil(self.page_size)
                .saturating_sub(seq.pages.len());
        }
        if need > self.free_pages.len() {
            return Err(Error::InvalidInput(format!(
                "the step needs {need} more KV pages, {} are free",
                self.free_pages.len()
            )));
        }
        for (id, n) in step {
            let seq = self.seqs.get_mut(id).expect("checked above");
            while seq.pages.len() * self.page_size < seq.len + n {
                seq.pages
                    .push(self.free_pages.pop().expect("counted above"));
            }
        }
        Ok(())
    }
}
