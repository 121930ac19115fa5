//! The GPU forward gates' shared steps (qwen35's tests/integration/gpu_forward.rs and
//! tests/integration/gpu_moe_forward.rs): the fixture's model on the GPU, a fresh
//! sequence run in chunks, prefill then teacher-forced decode, a cache with
//! decode graphs captured and a bystander slot.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::{PageId, SlotId};
use gdn_kernels::BackendRequest;
use qwen35::gpu::{GpuCache, GpuModel, GpuOptions, SlotState};
use qwen35::{RowLogits, StateDtype, StateDtypeRequest};

use crate::alloc::Seqs;
use crate::Fixture;

/// The recurrent-state dtypes every gate runs with (f32, and bf16 storage
/// with f32 math: `--mamba-ssm-cache-dtype bfloat16`).
pub const STATE_DTYPES: [StateDtype; 2] = [StateDtype::F32, StateDtype::Bf16];

/// Every model of `models` with every state dtype (announced on stdout, so
/// a failing assertion's output names the dtype).
pub fn models_and_dtypes(
    models: &'static [&'static str],
) -> impl Iterator<Item = (&'static str, StateDtype)> {
    models.iter().flat_map(|&name| {
        STATE_DTYPES.into_iter().map(move |dtype| {
            println!("-- {name}, {dtype} recurrent state");
            (name, dtype)
        })
    })
}

/// The fixture's model on the GPU of `stream`, with the given GDN backend
/// and recurrent-state dtype (asserted).
pub fn load(
    f: &Fixture,
    stream: &Arc<CudaStream>,
    backend: BackendRequest,
    dtype: StateDtype,
) -> GpuModel {
    let model = GpuModel::load(
        f.config.clone(),
        &f.weights,
        stream.clone(),
        GpuOptions {
            gdn_backend: backend,
            state_dtype: StateDtypeRequest::Fixed(dtype),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(model.state_dtype(), dtype);
    model
}

/// Runs the chunks as consecutive steps of one fresh sequence; returns
/// the logits of every token.
pub fn run_chunks(model: &mut GpuModel, chunks: &[&[u32]]) -> Vec<Vec<f32>> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut cache = model.new_cache(2, total.div_ceil(16) + 1, 16).unwrap();
    let mut seqs = Seqs::all_of(&cache);
    let id = seqs.add();
    let mut out = vec![];
    for c in chunks {
        out.extend(
            seqs.step(model, &mut cache, &[(id, c)], RowLogits::All)
                .unwrap(),
        );
    }
    out
}

/// Prefills `ids[..prefix]` in a fresh sequence (its logits rows as
/// `prefill` asks: the last, or all of them), then decodes `steps` tokens
/// one at a time (teacher-forced), alongside `others` (one token each per
/// step, cycling) when `batched`; returns the first sequence's logits rows.
pub fn decode_run(
    model: &mut GpuModel,
    (cache, seqs): (&mut GpuCache, &mut Seqs),
    (ids, prefill): (&[u32], RowLogits),
    (prefix, steps): (usize, usize),
    others: &[&Vec<u32>],
    batched: bool,
) -> Vec<Vec<f32>> {
    let seq = seqs.add();
    let side: Vec<_> = if batched {
        others.iter().map(|_| seqs.add()).collect()
    } else {
        vec![]
    };
    let mut rows = seqs
        .step(model, cache, &[(seq, &ids[..prefix])], prefill)
        .unwrap();
    for (sid, p) in side.iter().zip(others) {
        seqs.step(model, cache, &[(*sid, &p[..1])], RowLogits::Last)
            .unwrap();
    }
    for j in prefix..prefix + steps {
        let mut step = vec![(seq, &ids[j..j + 1])];
        for (k, (sid, p)) in side.iter().zip(others).enumerate() {
            let at = (1 + j - prefix + k) % p.len();
            step.push((*sid, &p[at..at + 1]));
        }
        let out = seqs.step(model, cache, &step, RowLogits::Last).unwrap();
        assert_eq!(out.len(), step.len());
        rows.push(out[0].clone());
    }
    seqs.release(seq);
    for sid in side {
        seqs.release(sid);
    }
    rows
}

/// A cache with decode graphs captured, for `n` sequences of up to
/// `pages` pages of 16: slots `0..n` and pages `0..pages` for the run
/// ([`GraphedCache::seqs`]), slot `n` a bystander holding a live state
/// that no step names, slot `n + 1` and page `pages` the graphs' padding.
pub struct GraphedCache {
    pub cache: GpuCache,
    pub seqs: Seqs,
    pub bystander: SlotId,
    /// The bystander's state before the capture: it must stay so.
    pub bystander_state: SlotState,
}

/// Builds a [`GraphedCache`]: prefills `bystander_ids` in the bystander
/// slot, then captures decode graphs for `buckets` over contexts of up to
/// `max_context` tokens (asserted captured).
pub fn graphed_cache(
    model: &mut GpuModel,
    (n, pages): (usize, usize),
    bystander_ids: &[u32],
    buckets: &[usize],
    max_context: usize,
) -> GraphedCache {
    let mut cache = model.new_cache(n + 2, pages + 1, 16).unwrap();
    let bystander = SlotId(n as u32);
    let mut by = Seqs::new(n + 1, pages, 16);
    let ids: Vec<_> = (0..=n).map(|_| by.add()).collect();
    let last = *ids.last().unwrap();
    assert_eq!(by.slot(last), bystander);
    by.step(model, &mut cache, &[(last, bystander_ids)], RowLogits::Last)
        .unwrap();
    let bystander_state = cache.export_slot(bystander).unwrap();
    model
        .capture_decode_graphs(
            &mut cache,
            buckets,
            max_context,
            SlotId(n as u32 + 1),
            PageId(pages as u32),
        )
        .unwrap();
    assert_eq!(cache.decode_graph_batch_sizes(), buckets.to_vec());
    GraphedCache {
        cache,
        seqs: Seqs::new(n, pages, 16),
        bystander,
        bystander_state,
    }
}

impl GraphedCache {
    /// Asserts that the bystander's state is what it was before the
    /// capture: neither the graphs' padding rows nor the real rows touched
    /// a slot no step named.
    pub fn assert_bystander_untouched(&self, what: &str) {
        assert!(
            self.cache.export_slot(self.bystander).unwrap() == self.bystander_state,
            "{what}: the graphs' padding rows or the real rows touched a slot no step named"
        );
    }
}
