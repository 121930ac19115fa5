//! One step of the GPU model over caller-built rows: the rows checked and
//! planned ([`crate::gpu::plan`]), the batch (and the decode/prefill
//! sub-batches of a mixed step) uploaded, the forward run eagerly or by
//! replaying a decode graph, and the wanted logits brought back in the
//! caller's row order.

use cudarc::driver::CudaSlice;
use gdn_kernels::{BatchLayout, DeviceBatch};

use crate::error::StepError;
use crate::gpu::plan::{in_row_order, plan, Batches, Bounds, LogitsPlan, Plan, Row};
use crate::gpu::GpuCache;
use crate::gpu::GpuModel;

/// Where the logits go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsTo {
    Host,
    /// Left on the device (benchmarks of the forward without the copy).
    DeviceOnly,
}

/// The logits a step brought to the host: one device-to-host copy of the
/// wanted rows only, handed out as slices (no second copy per row).
#[derive(Debug, Default)]
pub struct HostLogits {
    data: Vec<f32>,
    vocab: usize,
    /// Row of `data` of each output row, in the caller's row order.
    rows: Vec<usize>,
}

impl HostLogits {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Output row `i` (`vocab` floats).
    pub fn row(&self, i: usize) -> &[f32] {
        let r = self.rows[i];
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }

    pub fn rows(&self) -> impl Iterator<Item = &[f32]> {
        (0..self.len()).map(|i| self.row(i))
    }

    /// Every row as its own vector (a copy).
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.rows().map(<[f32]>::to_vec).collect()
    }
}

impl GpuModel {
    /// Runs one step over `rows` (see [`Row`]): rows of one token run the
    /// recurrent decode step in place on their slots, longer rows the GDN
    /// prefill op; a step of decode rows only replays a captured CUDA graph
    /// when the cache has one for its (padded) size. Returns the wanted
    /// logits, `[rows][vocab]` f32, in row order: one row per `Last` row,
    /// one per token of an `All` row; none with [`LogitsTo::DeviceOnly`].
    pub fn step(
        &mut self,
        cache: &mut GpuCache,
        rows: &[Row],
        to: LogitsTo,
    ) -> Result<Vec<Vec<f32>>, StepError> {
        Ok(self.step_logits(cache, rows, to)?.to_vecs())
    }

    /// [`GpuModel::step`] with the logits left in the one buffer they came
    /// to the host in.
    pub fn step_logits(
        &mut self,
        cache: &mut GpuCache,
        rows: &[Row],
        to: LogitsTo,
    ) -> Result<HostLogits, StepError> {
        let s = self.stream.clone();
        let v = self.config.vocab_size;
        self.step_device(cache, rows, |logits, at| {
            if to == LogitsTo::DeviceOnly {
                s.synchronize()?;
                return Ok(HostLogits::default());
            }
            // One copy of the window of buffer rows the output rows use.
            let (Some(&lo), Some(&hi)) = (at.iter().min(), at.iter().max()) else {
                return Ok(HostLogits::default());
            };
            let data = s.clone_dtoh(&logits.slice(lo * v..(hi + 1) * v))?;
            Ok(HostLogits {
                data,
                vocab: v,
                rows: at.iter().map(|r| r - lo).collect(),
            })
        })
    }

    /// Runs one step (as [`GpuModel::step`]) and hands `then` the logits
    /// where they are, on the device (`[n, vocab]` f32, queued on the
    /// model's stream), with the buffer row of each output row in the
    /// caller's row order (one per `Last` row, one per token of an `All`
    /// row): sampling on the device reads them there. `then` may change
    /// the rows it is given (they are the step's scratch).
    pub fn step_device<R>(
        &mut self,
        cache: &mut GpuCache,
        rows: &[Row],
        then: impl FnOnce(&mut CudaSlice<f32>, &[usize]) -> Result<R, StepError>,
    ) -> Result<R, StepError> {
        if let Some(clock) = self.clock.as_mut() {
            clock.last = None;
        }
        if cache.model_id != self.id {
            return Err(StepError::Refused(
                "this cache was made by another model (use the model's own new_cache)".into(),
            ));
        }
        let bounds = Bounds {
            vocab: self.config.vocab_size,
            num_slots: cache.num_slots(),
            num_pages: cache.num_pages(),
            page_size: cache.page_size,
            padding: cache.graphs.as_ref().map(|g| g.padding),
        };
        let plan = plan(rows, bounds)?;
        if let Some(why) = cache.unmapped(rows) {
            return Err(StepError::Refused(why));
        }
        for r in rows.iter().filter(|r| r.start == 0) {
            cache.zero_slot(r.slot)?;
        }
        let s = self.stream.clone();
        let v = self.config.vocab_size;
        let all_decode = plan.decode == rows.len();
        let graphed = match &cache.graphs {
            Some(g) if all_decode => g.fits(rows.len(), plan.max_pages),
            _ => None,
        };
        let mut eager;
        let logits = if let Some(key) = graphed {
            if let Some(clock) = self.clock.as_mut() {
                clock.forward_starts(&s)?;
            }
            self.replay_decode(cache, rows, &plan.order, key)?;
            if let Some(clock) = self.clock.as_mut() {
                clock.forward_queued(&s)?;
            }
            &mut cache.graphs.as_mut().expect("checked").logits
        } else {
            let batches = self.batches(&plan)?;
            let n = plan.logits.rows(batches.full.num_tokens());
            // SAFETY (of `scratch`): the lm_head writes every row.
            let mut out = crate::gpu::scratch::<f32>(&s, n.max(1) * v)?;
            if let Some(clock) = self.clock.as_mut() {
                clock.forward_starts(&s)?;
            }
            self.run(cache, &batches, plan.logits, &mut out)?;
            if let Some(clock) = self.clock.as_mut() {
                clock.forward_queued(&s)?;
            }
            eager = out;
            &mut eager
        };
        // A graph's logits hold every batch row; the eager buffer only the
        // plan's rows.
        let first = match plan.logits {
            LogitsPlan::LastOf(lo, _) if graphed.is_some() => lo,
            _ => 0,
        };
        let at: Vec<usize> = in_row_order(&plan, rows)
            .into_iter()
            .map(|r| first + r)
            .collect();
        let out = then(logits, &at)?;
        if let Some(clock) = self.clock.as_mut() {
            clock.step_done(&s)?;
        }
        Ok(out)
    }

    /// The whole batch on the device, and the decode and prefill parts of
    /// a mixed step.
    fn batches(&self, plan: &Plan) -> Result<Batches, StepError> {
        let s = &self.stream;
        let full = DeviceBatch::upload(s, &plan.layout)?;
        let n = plan.order.len();
        let parts = if plan.decode > 0 && plan.decode < n {
            let (d, l) = (plan.decode, &plan.layout);
            let w = l.max_blocks;
            let part = |seqs: std::ops::Range<usize>| {
                let (t0, t1) = (l.cu_seqlens[seqs.start], l.cu_seqlens[seqs.end]);
                BatchLayout {
                    tokens: l.tokens[t0 as usize..t1 as usize].to_vec(),
                    cu_seqlens: l.cu_seqlens[seqs.start..=seqs.end]
                        .iter()
                        .map(|x| x - t0)
                        .collect(),
                    start_positions: l.start_positions[seqs.clone()].to_vec(),
                    slots: l.slots[seqs.clone()].to_vec(),
                    block_table: l.block_table[seqs.start * w..seqs.end * w].to_vec(),
                    max_blocks: w,
                    page_size: l.page_size,
                    padding: None,
                }
            };
            Some((
                DeviceBatch::upload(s, &part(0..d))?,
                DeviceBatch::upload(s, &part(d..n))?,
            ))
        } else {
            None
        };
        Ok(Batches { full, parts })
    }
}
