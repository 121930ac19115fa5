//! Sampling on the device (`cuda/sampling.cu`, cubins from the verified
//! bundle): rows of logits in, one token per row out (with the raw
//! logprobs when asked), so that a step copies a few bytes per row to the
//! host instead of a vocabulary-sized row. The semantics are the engine's
//! CPU sampler's (`engine::sampler`, the oracle of the GPU tests): greedy
//! below temperature 1e-5, else min-p, top-k, top-p and an exponential race
//! keyed by (seed, draw, token id). A row may carry a bitmask of the tokens
//! it may sample (structured outputs, [`TokenMasks`]): its other tokens are
//! -inf before anything else, its logprobs those of the masked row. This
//! module alone knows the kernels' names, argument structs and launch
//! geometry, and checks every argument before launching.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::sampling::token_masks::TokenMasks;
use crate::shared::cubins::cubin_for;
use crate::shared::error::{invalid, During, GdnError, Op};

const UNIT: &str = "sampling";
const OP: Op = Op::SampleRows;
/// Threads per row (`kThreads` in sampling.cu).
const THREADS: u32 = 1024;
/// The most top logprobs a row may ask for (`kMaxTop`).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Result words per row (`kOutWords`): token, logprob, ids, logprobs.
const OUT_WORDS: usize = 2 + 2 * MAX_TOP_LOGPROBS as usize;
const REPETITION: u32 = 1;
const BAN: u32 = 2;
/// `mask_row` of a row without a mask (`kNoMask`).
const NO_MASK: u32 = u32::MAX;

/// One token's change before sampling (the engine's sparse form of
/// penalties and bans): repetition penalty, then `x -= subtract`, then the
/// ban (lifted for the whole row if nothing finite would remain).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenAdjustment {
    pub token: u32,
    pub repetition: bool,
    pub subtract: f32,
    pub ban: bool,
}

/// What one output row samples, from which row of the logits.
#[derive(Clone, Copy, Debug)]
pub struct RowSampling<'a> {
    /// Row of the logits buffer (`[rows, vocab]`); each at most once per call
    /// (the row is adjusted in place).
    pub logits_row: usize,
    /// Below 1e-5: greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 is off.
    pub top_p: f32,
    /// 0 is off.
    pub top_k: u32,
    /// In [0, 1]; 0 is off.
    pub min_p: f32,
    /// Positive; applies to the adjustments marked `repetition`.
    pub repetition_penalty: f32,
    /// `Some(k)`: the chosen token's raw logprob and the `k` best (k <= 20).
    pub logprobs: Option<u32>,
    pub seed: u64,
    pub draw: u64,
    /// By strictly ascending token id, every id below the vocabulary size.
    pub adjustments: &'a [TokenAdjustment],
    /// The row of the call's [`TokenMasks`] naming the tokens this row may
    /// sample; `None`: every token.
    pub mask_row: Option<usize>,
}

/// One row's result.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledRow {
    pub token: u32,
    /// The chosen token's raw logprob; NaN when not asked.
    pub logprob: f32,
    /// The best raw logprobs, best first (lower id first on ties); a
    /// constrained row's finite ones only (fewer when it allows fewer).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// `RowParams` of sampling.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RowParamsC {
    seed: u64,
    draw: u64,
    temperature: f32,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    top_k: u32,
    logprobs: i32,
    logits_row: u32,
    adj_begin: u32,
    adj_end: u32,
    mask_row: u32,
}

/// `Adjustment` of sampling.cu (`raw` and `saved` are the kernel's scratch).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AdjustmentC {
    token: u32,
    flags: u32,
    subtract: f32,
    raw: f32,
    saved: f32,
}

// SAFETY: plain #[repr(C)] structs of integers and floats, laid out as
// their CUDA twins (checked by the sizes below).
unsafe impl DeviceRepr for RowParamsC {}
unsafe impl DeviceRepr for AdjustmentC {}
const _: () = assert!(std::mem::size_of::<RowParamsC>() == 56);
const _: () = assert!(std::mem::size_of::<AdjustmentC>() == 20);

/// The sampling kernel, loaded for one stream's device, with a pinned
/// buffer for the results (grown as needed).
pub struct DeviceSampler {
    stream: Arc<CudaStream>,
    sample: CudaFunction,
    sample_masked: CudaFunction,
    _module: Arc<CudaModule>,
    pinned: Option<PinnedHostSlice<u32>>,
}

impl DeviceSampler {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().during(OP)?;
        let (_, cubin) = cubin_for(UNIT, cc).map_err(|why| why.into_error(OP))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .during(OP)?;
        let sample = module.load_function("sample_rows").during(OP)?;
        let sample_masked = module.load_function("sample_rows_masked").during(OP)?;
        Ok(DeviceSampler {
            stream,
            sample,
            sample_masked,
            _module: module,
            pinned: None,
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Samples every row of `rows` from `logits` (`[n, vocab]` f32 on this
    /// sampler's stream, after the work that wrote them), results in
    /// `rows` order. The logits rows named are changed (penalties and bans
    /// are applied in place). `masks` (on this stream, after the work that
    /// wrote them) holds the rows' `mask_row`s; `None` when no row has one.
    /// One small device-to-host copy, then waits.
    pub fn sample(
        &mut self,
        logits: &mut CudaSlice<f32>,
        vocab: usize,
        rows: &[RowSampling<'_>],
        masks: Option<&TokenMasks<'_>>,
    ) -> Result<Vec<SampledRow>, GdnError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mask_rows = masks.map(|m| m.rows(vocab)).transpose()?;
        let (params, adjustments) = flatten(logits.len(), vocab, rows, mask_rows)?;
        let s = &self.stream;
        let params_dev = s.clone_htod(&params).during(OP)?;
        // A kernel argument must point somewhere even with no adjustments.
        let mut adj_dev = if adjustments.is_empty() {
            s.clone_htod(&[AdjustmentC::default()])
        } else {
            s.clone_htod(&adjustments)
        }
        .during(OP)?;
        let words = rows.len() * OUT_WORDS;
        let mut out = s.alloc_zeros::<u32>(words).during(OP)?;
        let v = vocab as i64;
        // Only a call whose rows use masks takes the masked kernel.
        let masks = masks.filter(|_| rows.iter().any(|r| r.mask_row.is_some()));
        let words_per_row = masks.map_or(0, |m| m.words_per_row as i64);
        let mut b = s.launch_builder(match masks {
            Some(_) => &self.sample_masked,
            None => &self.sample,
        });
        b.arg(&mut *logits)
            .arg(&v)
            .arg(&params_dev)
            .arg(&mut adj_dev);
        if let Some(m) = masks {
            b.arg(&m.words).arg(&words_per_row);
        }
        b.arg(&mut out);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches sample_rows(logits, vocab, params, adj, out), or
        // sample_rows_masked(logits, vocab, params, adj, masks, words, out);
        // every logits row, adjustment range, token id and mask row was
        // checked by `flatten` (and the masks' layout by `rows`); one block
        // per row, `OUT_WORDS` words of `out` each.
        unsafe { b.launch(cfg) }.during(OP)?;
        if self.pinned.as_ref().is_none_or(|p| p.len() < words) {
            // SAFETY: written by the copy below before it is read.
            self.pinned = Some(unsafe {
                s.context()
                    .alloc_pinned_with_flags::<u32>(words.next_power_of_two(), 0)
                    .during(OP)?
            });
        }
        let pinned = self.pinned.as_mut().expect("allocated above");
        // Exactly `words`: cudarc copies the destination's whole length, and
        // the pinned buffer may be longer than `out` (CUDA_ERROR_INVALID_VALUE
        // on the H200 before this). Through a plain slice cudarc does not
        // wait, and pinned memory makes the copy truly asynchronous: wait.
        let host = &mut pinned.as_mut_slice().during(OP)?[..words];
        s.memcpy_dtoh(&out, host).during(OP)?;
        s.synchronize().during(OP)?;
        Ok(rows
            .iter()
            .zip(host.chunks_exact(OUT_WORDS))
            .map(|(r, w)| decode(r, w, vocab))
            .collect())
    }
}

/// One row's result words. A constrained row's top list holds its finite
/// entries only (its allowed tokens; the kernel marks the rest NaN).
fn decode(row: &RowSampling, w: &[u32], vocab: usize) -> SampledRow {
    let top = row.logprobs.map_or(0, |k| (k as usize).min(vocab));
    let m = MAX_TOP_LOGPROBS as usize;
    let mut top_logprobs: Vec<(u32, f32)> = (0..top)
        .map(|i| (w[2 + i], f32::from_bits(w[2 + m + i])))
        .collect();
    if row.mask_row.is_some() {
        top_logprobs.retain(|e| e.1.is_finite());
    }
    SampledRow {
        token: w[0],
        logprob: f32::from_bits(w[1]),
        top_logprobs,
    }
}

/// Checks `rows` against the logits buffer (`len` floats of `vocab`-sized
/// rows) and the number of mask rows (`None`: no masks given), and lays
/// them out as the kernel reads them.
fn flatten(
    len: usize,
    vocab: usize,
    rows: &[RowSampling<'_>],
    mask_rows: Option<usize>,
) -> Result<(Vec<RowParamsC>, Vec<AdjustmentC>), GdnError> {
    let err = |i: usize, m: String| Err(invalid(OP, "rows", format!("row {i}: {m}")));
    if vocab == 0 || vocab > i32::MAX as usize || len % vocab != 0 {
        return Err(invalid(
            OP,
            "logits",
            format!("{len} floats are not rows of vocab {vocab} (1..=2^31-1)"),
        ));
    }
    if rows.len() > i32::MAX as usize {
        return Err(invalid(
            OP,
            "rows",
            format!("{} exceed the grid", rows.len()),
        ));
    }
    let num_rows = len / vocab;
    let mut used = vec![false; num_rows];
    let mut params = Vec::with_capacity(rows.len());
    let mut adjustments = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if r.logits_row >= num_rows {
            return err(i, format!("logits row {} of {num_rows}", r.logits_row));
        }
        if std::mem::replace(&mut used[r.logits_row], true) {
            return err(i, format!("logits row {} sampled twice", r.logits_row));
        }
        let checks = [
            (
                "temperature",
                r.temperature,
                r.temperature >= 0.0 && r.temperature.is_finite(),
            ),
            ("top_p", r.top_p, r.top_p > 0.0 && r.top_p <= 1.0),
            ("min_p", r.min_p, (0.0..=1.0).contains(&r.min_p)),
            (
                "repetition_penalty",
                r.repetition_penalty,
                r.repetition_penalty > 0.0 && r.repetition_penalty.is_finite(),
            ),
        ];
        if let Some((name, x, _)) = checks.iter().find(|c| !c.2) {
            return err(i, format!("{name} {x} out of range"));
        }
        let mask_row = match (r.mask_row, mask_rows) {
            (None, _) => NO_MASK,
            (Some(m), None) => return err(i, format!("mask row {m}, but no masks given")),
            (Some(m), Some(n)) if m >= n || m >= NO_MASK as usize => {
                return err(i, format!("mask row {m} of {n}"))
            }
            (Some(m), Some(_)) => m as u32,
        };
        if r.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return err(
                i,
                format!("logprobs {:?} above {MAX_TOP_LOGPROBS}", r.logprobs),
            );
        }
        let begin = adjustments.len();
        let mut previous: Option<u32> = None;
        for a in r.adjustments {
            if a.token as usize >= vocab || previous.is_some_and(|p| a.token <= p) {
                return err(
                    i,
                    format!(
                        "adjustment of token {} (ids must ascend strictly below vocab {vocab})",
                        a.token
                    ),
                );
            }
            if !a.subtract.is_finite() {
                return err(i, format!("token {}: subtract {}", a.token, a.subtract));
            }
            previous = Some(a.token);
            adjustments.push(AdjustmentC {
                token: a.token,
                flags: if a.repetition { REPETITION } else { 0 } | if a.ban { BAN } else { 0 },
                subtract: a.subtract,
                raw: 0.0,
                saved: 0.0,
            });
        }
        if adjustments.len() > u32::MAX as usize {
            return err(i, "more than 2^32 adjustments".into());
        }
        params.push(RowParamsC {
            seed: r.seed,
            draw: r.draw,
            temperature: r.temperature,
            top_p: r.top_p,
            min_p: r.min_p,
            repetition_penalty: r.repetition_penalty,
            top_k: r.top_k,
            logprobs: r.logprobs.map_or(-1, |k| k as i32),
            logits_row: r.logits_row as u32,
            adj_begin: begin as u32,
            adj_end: adjustments.len() as u32,
            mask_row,
        });
    }
    Ok((params, adjustments))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(logits_row: usize, adjustments: &[TokenAdjustment]) -> RowSampling<'_> {
        RowSampling {
            logits_row,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            seed: 0,
            draw: 0,
            adjustments,
            mask_row: None,
        }
    }

    fn adj(token: u32) -> TokenAdjustment {
        TokenAdjustment {
            token,
            repetition: true,
            subtract: 0.5,
            ban: true,
        }
    }

    fn refused(len: usize, vocab: usize, rows: &[RowSampling]) -> String {
        flatten(len, vocab, rows, None).unwrap_err().to_string()
    }

    #[test]
    fn rows_are_laid_out_with_their_adjustment_ranges() {
        let a = [adj(1), adj(4)];
        let b = [adj(0)];
        let (params, adjs) = flatten(30, 10, &[row(2, &a), row(0, &[]), row(1, &b)], None).unwrap();
        let ranges: Vec<(u32, u32, u32)> = params
            .iter()
            .map(|p| (p.logits_row, p.adj_begin, p.adj_end))
            .collect();
        assert_eq!(ranges, vec![(2, 0, 2), (0, 2, 2), (1, 2, 3)]);
        assert_eq!(
            adjs.iter().map(|a| (a.token, a.flags)).collect::<Vec<_>>(),
            vec![(1, 3), (4, 3), (0, 3)]
        );
        assert_eq!(params[1].logprobs, -1);
        assert!(params.iter().all(|p| p.mask_row == NO_MASK));
    }

    #[test]
    fn a_constrained_row_lists_its_finite_alternatives_only() {
        let mut words = vec![0u32; OUT_WORDS];
        let m = MAX_TOP_LOGPROBS as usize;
        for (i, (id, lp)) in [(4, -0.5f32), (2, -1.0), (0, f32::NAN)].iter().enumerate() {
            words[2 + i] = *id;
            words[2 + m + i] = lp.to_bits();
        }
        let mut r = row(0, &[]);
        r.logprobs = Some(3);
        assert_eq!(decode(&r, &words, 10).top_logprobs.len(), 3);
        r.mask_row = Some(0);
        assert_eq!(
            decode(&r, &words, 10).top_logprobs,
            vec![(4, -0.5), (2, -1.0)]
        );
    }

    #[test]
    fn mask_rows_are_passed_and_checked_against_the_masks_given() {
        let mut masked = row(1, &[]);
        masked.mask_row = Some(1);
        let (params, _) = flatten(20, 10, &[row(0, &[]), masked], Some(2)).unwrap();
        assert_eq!(
            params.iter().map(|p| p.mask_row).collect::<Vec<_>>(),
            vec![NO_MASK, 1]
        );
        let why = flatten(20, 10, &[masked], Some(1)).unwrap_err().to_string();
        assert!(why.contains("mask row 1 of 1"), "{why}");
        let why = flatten(20, 10, &[masked], None).unwrap_err().to_string();
        assert!(why.contains("no masks given"), "{why}");
    }

    #[test]
    fn bad_rows_are_refused_with_the_reason() {
        assert!(refused(25, 10, &[row(0, &[])]).contains("not rows of vocab 10"));
        assert!(refused(20, 10, &[row(2, &[])]).contains("logits row 2 of 2"));
        assert!(refused(20, 10, &[row(1, &[]), row(1, &[])]).contains("sampled twice"));
        assert!(refused(20, 10, &[row(0, &[adj(10)])]).contains("token 10"));
        assert!(refused(20, 10, &[row(0, &[adj(3), adj(3)])]).contains("ascend"));
        let mut r = row(0, &[]);
        r.top_p = 0.0;
        assert!(refused(10, 10, &[r]).contains("top_p 0"));
        r.top_p = 1.0;
        r.temperature = f32::NAN;
        assert!(refused(10, 10, &[r]).contains("temperature NaN"));
        r.temperature = 0.0;
        r.logprobs = Some(21);
        assert!(refused(10, 10, &[r]).contains("logprobs"));
        r.logprobs = Some(20);
        assert!(flatten(10, 10, &[r], None).is_ok());
    }
}
