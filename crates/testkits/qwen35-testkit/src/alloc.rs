//! A test-side stand-in for the engine's allocator: hands out the slots and
//! pages of a `GpuCache` to sequences, grows their pages as they run and
//! tracks their lengths, so the GPU tests and the benchmark drive
//! `GpuModel::step` the way the old cache-owned sequences did.

use std::collections::HashMap;

use engine::{PageId, SlotId};
use qwen35::gpu::{GpuCache, GpuModel, LogitsTo, Row, StepError};
use qwen35::RowLogits;

/// A live sequence of a [`Seqs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(u64);

struct Seq {
    slot: SlotId,
    pages: Vec<PageId>,
    len: usize,
}

pub struct Seqs {
    page_size: usize,
    free_slots: Vec<u32>,
    free_pages: Vec<u32>,
    seqs: HashMap<SeqId, Seq>,
    next: u64,
}

impl Seqs {
    /// Slots `0..num_slots` and pages `0..num_pages` (a cache may hold more,
    /// e.g. the padding slot and page of decode graphs).
    pub fn new(num_slots: usize, num_pages: usize, page_size: usize) -> Seqs {
        Seqs {
            page_size,
            free_slots: (0..num_slots as u32).rev().collect(),
            free_pages: (0..num_pages as u32).rev().collect(),
            seqs: HashMap::new(),
            next: 0,
        }
    }

    /// Every slot and page of `cache`.
    pub fn all_of(cache: &GpuCache) -> Seqs {
        Seqs::new(cache.num_slots(), cache.num_pages(), cache.page_size())
    }

    pub fn add(&mut self) -> SeqId {
        let slot = self.free_slots.pop().expect("a free slot");
        let id = SeqId(self.next);
        self.next += 1;
        self.seqs.insert(
            id,
            Seq {
                slot: SlotId(slot),
                pages: vec![],
                len: 0,
            },
        );
        id
    }

    pub fn release(&mut self, id: SeqId) {
        let s = self.seqs.remove(&id).expect("a live sequence");
        self.free_slots.push(s.slot.0);
        self.free_pages.extend(s.pages.iter().map(|p| p.0));
    }

    pub fn len(&self, id: SeqId) -> usize {
        self.seqs[&id].len
    }

    pub fn slot(&self, id: SeqId) -> SlotId {
        self.seqs[&id].slot
    }

    pub fn pages(&self, id: SeqId) -> &[PageId] {
        &self.seqs[&id].pages
    }

    /// Benchmarks only: lets sequence `id` stand at `len` tokens without
    /// running them (its pages are taken; its KV and slot state are
    /// whatever the cache holds), so a decode step deep into a context can
    /// be timed without first prefilling it.
    pub fn skip_to(&mut self, id: SeqId, len: usize) {
        let seq = self.seqs.get_mut(&id).expect("a live sequence");
        while seq.pages.len() * self.page_size < len {
            let p = self.free_pages.pop().expect("a free page");
            seq.pages.push(PageId(p));
        }
        seq.len = seq.len.max(len);
    }

    /// One step of `step` (each sequence's next tokens); logits as
    /// `GpuModel::step` returns them with `which` for every row.
    pub fn step(
        &mut self,
        model: &mut GpuModel,
        cache: &mut GpuCache,
        step: &[(SeqId, &[u32])],
        which: RowLogits,
    ) -> Result<Vec<Vec<f32>>, StepError> {
        self.step_to(model, cache, step, which, LogitsTo::Host)
    }

    pub fn step_to(
        &mut self,
        model: &mut GpuModel,
        cache: &mut GpuCache,
        step: &[(SeqId, &[u32])],
        which: RowLogits,
        to: LogitsTo,
    ) -> Result<Vec<Vec<f32>>, StepError> {
        for (id, toks) in step {
            let seq = self.seqs.get_mut(id).expect("a live sequence");
            while seq.pages.len() * self.page_size < seq.len + toks.len() {
                let p = self.free_pages.pop().expect("a free page");
                seq.pages.push(PageId(p));
            }
        }
        let rows: Vec<Row> = step
            .iter()
            .map(|(id, toks)| {
                let s = &self.seqs[id];
                Row {
                    slot: s.slot,
                    start: s.len,
                    tokens: toks,
                    pages: &s.pages,
                    logits: which,
                }
            })
            .collect();
        let out = model.step(cache, &rows, to)?;
        for (id, toks) in step {
            self.seqs.get_mut(id).expect("live").len += toks.len();
        }
        Ok(out)
    }
}
