//! Helpers shared by the GPU tests, the benchmark and the FLA cross-check:
//! deterministic random GDN problems, the oracle on them, GPU runs, and error
//! statistics. Not part of the op's API.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;

use crate::oracle::{gated_delta_rule_reference, GdnGeometry, ReferenceInputs, ReferenceOutputs};
use crate::{Backend, GdnError, GdnPrefill, PrefillBuffers, HEAD_DIM};

/// SplitMix64: tiny, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// One packed varlen problem with bf16 q/k/v as the GPU sees them.
pub struct Problem {
    pub geometry: GdnGeometry,
    pub cu_seqlens: Vec<i64>,
    pub q: Vec<bf16>,
    pub k: Vec<bf16>,
    pub v: Vec<bf16>,
    pub alpha: Vec<f32>,
    pub beta: Vec<f32>,
    pub initial_state: Option<Vec<f32>>,
    pub scale: f32,
}

fn l2_normalised_bf16(rng: &mut Rng, rows: usize) -> Vec<bf16> {
    let mut out = Vec::with_capacity(rows * HEAD_DIM);
    for _ in 0..rows {
        let row: Vec<f32> = (0..HEAD_DIM).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let norm = (row.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
        out.extend(row.iter().map(|x| bf16::from_f32(x / norm)));
    }
    out
}

impl Problem {
    /// Random inputs in the ranges Qwen3.5 produces: q/k L2-normalised, alpha
    /// (= exp(g)) in [0.6, 1), beta in (0.05, 0.95), v in [-1, 1).
    pub fn random(
        seed: u64,
        geometry: GdnGeometry,
        lengths: &[usize],
        with_initial_state: bool,
    ) -> Problem {
        let mut rng = Rng::new(seed);
        let t: usize = lengths.iter().sum();
        let (hq, hv) = (geometry.num_qk_heads, geometry.num_v_heads);
        let mut cu_seqlens = vec![0i64];
        for l in lengths {
            cu_seqlens.push(cu_seqlens.last().unwrap() + *l as i64);
        }
        let q = l2_normalised_bf16(&mut rng, t * hq);
        let k = l2_normalised_bf16(&mut rng, t * hq);
        let v = (0..t * hv * HEAD_DIM)
            .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
            .collect();
        let alpha = (0..t * hv).map(|_| rng.uniform(0.6, 1.0)).collect();
        let beta = (0..t * hv).map(|_| rng.uniform(0.05, 0.95)).collect();
        let initial_state = with_initial_state.then(|| {
            (0..lengths.len() * hv * HEAD_DIM * HEAD_DIM)
                .map(|_| rng.uniform(-0.5, 0.5))
                .collect()
        });
        Problem {
            geometry,
            cu_seqlens,
            q,
            k,
            v,
            alpha,
            beta,
            initial_state,
            scale: (HEAD_DIM as f32).powf(-0.5),
        }
    }

    /// Tokens `lo..hi` of a single-sequence problem as a problem of their
    /// own, starting from `initial_state` (a continuation chunk).
    pub fn token_range(&self, lo: usize, hi: usize, initial_state: Vec<f32>) -> Problem {
        assert_eq!(self.num_seqs(), 1, "token_range needs a single sequence");
        let g = self.geometry;
        let (qd, vd, hv) = (
            g.num_qk_heads * g.head_dim,
            g.num_v_heads * g.head_dim,
            g.num_v_heads,
        );
        Problem {
            geometry: g,
            cu_seqlens: vec![0, (hi - lo) as i64],
            q: self.q[lo * qd..hi * qd].to_vec(),
            k: self.k[lo * qd..hi * qd].to_vec(),
            v: self.v[lo * vd..hi * vd].to_vec(),
            alpha: self.alpha[lo * hv..hi * hv].to_vec(),
            beta: self.beta[lo * hv..hi * hv].to_vec(),
            initial_state: Some(initial_state),
            scale: self.scale,
        }
    }

    pub fn total_tokens(&self) -> usize {
        *self.cu_seqlens.last().unwrap() as usize
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    /// The f64 oracle on exactly the bf16 values the GPU reads. Sequences run
    /// on separate threads (the oracle is independent per sequence).
    pub fn reference(&self) -> ReferenceOutputs {
        let f = |x: &[bf16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        let (q, k, v) = (f(&self.q), f(&self.k), f(&self.v));
        let g = self.geometry;
        let (hq, hv, d) = (g.num_qk_heads, g.num_v_heads, g.head_dim);
        let state_len = hv * d * d;
        let parts: Vec<ReferenceOutputs> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.num_seqs())
                .map(|n| {
                    let (a, b) = (self.cu_seqlens[n] as usize, self.cu_seqlens[n + 1] as usize);
                    let (q, k, v) = (
                        &q[a * hq * d..b * hq * d],
                        &k[a * hq * d..b * hq * d],
                        &v[a * hv * d..b * hv * d],
                    );
                    let (alpha, beta) = (&self.alpha[a * hv..b * hv], &self.beta[a * hv..b * hv]);
                    let init = self
                        .initial_state
                        .as_ref()
                        .map(|s| &s[n * state_len..(n + 1) * state_len]);
                    s.spawn(move || {
                        gated_delta_rule_reference(&ReferenceInputs {
                            geometry: g,
                            q,
                            k,
                            v,
                            alpha,
                            beta,
                            cu_seqlens: &[0, b - a],
                            initial_state: init,
                            scale: self.scale,
                        })
                        .expect("valid problem")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("oracle thread"))
                .collect()
        });
        let mut out = ReferenceOutputs {
            output: vec![],
            final_state: vec![],
        };
        for p in parts {
            out.output.extend(p.output);
            out.final_state.extend(p.final_state);
        }
        out
    }

    /// Copies the inputs to the GPU; outputs start poisoned with NaN so an
    /// element the kernel never writes shows up.
    pub fn upload(&self, stream: &Arc<CudaStream>) -> Result<DeviceProblem, GdnError> {
        let g = self.geometry;
        Ok(DeviceProblem {
            q: stream.clone_htod(&self.q)?,
            k: stream.clone_htod(&self.k)?,
            v: stream.clone_htod(&self.v)?,
            alpha: stream.clone_htod(&self.alpha)?,
            beta: stream.clone_htod(&self.beta)?,
            initial_state: self
                .initial_state
                .as_ref()
                .map(|s| stream.clone_htod(s))
                .transpose()?,
            output: stream.clone_htod(&vec![
                bf16::NAN;
                self.total_tokens() * g.num_v_heads * HEAD_DIM
            ])?,
            final_state: stream.clone_htod(&vec![
                f32::NAN;
                self.num_seqs()
                    * g.num_v_heads
                    * HEAD_DIM
                    * HEAD_DIM
            ])?,
            cu_seqlens: self.cu_seqlens.clone(),
            scale: self.scale,
        })
    }

    /// Uploads, runs `op`, downloads (output as f32, final state).
    pub fn run_on(
        &self,
        op: &mut GdnPrefill,
        stream: &Arc<CudaStream>,
    ) -> Result<(Vec<f32>, Vec<f32>), GdnError> {
        let mut d = self.upload(stream)?;
        d.run(op)?;
        d.download(stream)
    }
}

/// A problem's buffers on the GPU.
pub struct DeviceProblem {
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    pub v: CudaSlice<bf16>,
    pub alpha: CudaSlice<f32>,
    pub beta: CudaSlice<f32>,
    pub initial_state: Option<CudaSlice<f32>>,
    pub output: CudaSlice<bf16>,
    pub final_state: CudaSlice<f32>,
    pub cu_seqlens: Vec<i64>,
    pub scale: f32,
}

impl DeviceProblem {
    /// Enqueues one prefill of this problem on `op`'s stream.
    pub fn run(&mut self, op: &mut GdnPrefill) -> Result<(), GdnError> {
        op.run(
            PrefillBuffers {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                alpha: &self.alpha,
                beta: &self.beta,
                cu_seqlens: &self.cu_seqlens,
                initial_state: self.initial_state.as_ref(),
                final_state: &mut self.final_state,
                output: &mut self.output,
            },
            self.scale,
        )
    }

    /// (output as f32, final state), after the stream has finished.
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<(Vec<f32>, Vec<f32>), GdnError> {
        let out: Vec<f32> = stream
            .clone_dtoh(&self.output)?
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let state = stream.clone_dtoh(&self.final_state)?;
        stream.synchronize()?;
        Ok((out, state))
    }
}

/// FlashInfer's own test tolerances, `(atol, rtol)`, for the output and the
/// final state (the state's error comes from its fp16 intra-chunk inverse).
pub const OUTPUT_TOLERANCE: (f64, f64) = (1e-2, 1e-2);
pub const STATE_TOLERANCE: (f64, f64) = (5e-3, 1e-3);

/// Qwen3.5's GDN `(Hqk, Hv)`: 0.8B/2B (r=1), 4B/9B (r=2), 27B (r=3).
pub const QWEN35_GDN_HEADS: [(usize, usize); 3] = [(16, 16), (16, 32), (16, 48)];
/// Sequence lengths around the kernels' 64-token chunks, and one long one.
pub const ORACLE_LENGTHS: [usize; 8] = [1, 2, 63, 64, 65, 127, 128, 2048];

/// A head-dim-128 geometry.
pub fn geometry(num_qk_heads: usize, num_v_heads: usize) -> GdnGeometry {
    GdnGeometry {
        num_qk_heads,
        num_v_heads,
        head_dim: HEAD_DIM,
    }
}

/// Compares a GPU result `(output, final state)` with the oracle's under the
/// tolerances above, prints the errors, and fails on any unwritten,
/// non-finite or out-of-tolerance element.
pub fn check_against_oracle(
    case: &str,
    backend: Backend,
    got: &(Vec<f32>, Vec<f32>),
    want: &ReferenceOutputs,
) -> (Comparison, Comparison) {
    let out = compare(&got.0, &want.output, OUTPUT_TOLERANCE.0, OUTPUT_TOLERANCE.1);
    let state = compare(
        &got.1,
        &want.final_state,
        STATE_TOLERANCE.0,
        STATE_TOLERANCE.1,
    );
    println!(
        "{case:<44} {backend:<16} out max|e| {:.2e} rel {:.2e} | state max|e| {:.2e} rel {:.2e}",
        out.max_abs, out.rel_l2, state.max_abs, state.rel_l2
    );
    assert_eq!(
        out.non_finite + state.non_finite,
        0,
        "{case} {backend}: unwritten or non-finite elements"
    );
    assert_eq!(
        out.violations, 0,
        "{case} {backend}: output outside tolerance: {out:?}"
    );
    assert_eq!(
        state.violations, 0,
        "{case} {backend}: state outside tolerance: {state:?}"
    );
    (out, state)
}

/// Runs a single-sequence problem on `op` whole and as tokens `..at` then
/// `at..` with the state carried, checks both against the oracle and against
/// each other (the continuation gate every backend must pass).
pub fn check_continuation(
    case: &str,
    op: &mut GdnPrefill,
    stream: &Arc<CudaStream>,
    whole: &Problem,
    at: usize,
) {
    let want = whole.reference();
    let end = whole.total_tokens();
    let run = |p: &Problem, op: &mut GdnPrefill| p.run_on(op, stream).unwrap();
    let whole_result = run(whole, op);
    let first = run(
        &whole.token_range(
            0,
            at,
            whole.initial_state.clone().expect("an initial state"),
        ),
        op,
    );
    let second = run(&whole.token_range(at, end, first.1), op);
    let split = (first.0.into_iter().chain(second.0).collect(), second.1);
    let backend = op.backend();
    check_against_oracle(&format!("{case} (split)"), backend, &split, &want);
    check_against_oracle(&format!("{case} (whole)"), backend, &whole_result, &want);
    assert_results_agree(
        &format!("{case} {backend}: split vs whole"),
        &split,
        &whole_result,
    );
}

/// Fails unless two GPU results `(output, final state)` agree within the
/// oracle tolerances (a split run against the whole one).
pub fn assert_results_agree(case: &str, a: &(Vec<f32>, Vec<f32>), b: &(Vec<f32>, Vec<f32>)) {
    let o = compare(&a.0, &b.0, OUTPUT_TOLERANCE.0, OUTPUT_TOLERANCE.1);
    let s = compare(&a.1, &b.1, STATE_TOLERANCE.0, STATE_TOLERANCE.1);
    assert_eq!(
        (o.violations, s.violations),
        (0, 0),
        "{case}: results differ: {o:?} {s:?}"
    );
}

/// Error statistics of `got` against `want` under `|g - w| <= atol + rtol * |w|`.
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    pub max_abs: f64,
    pub rel_l2: f64,
    pub violations: usize,
    pub non_finite: usize,
}

pub fn compare(got: &[f32], want: &[f32], atol: f64, rtol: f64) -> Comparison {
    assert_eq!(got.len(), want.len(), "compare: lengths differ");
    let (mut max_abs, mut num, mut den, mut violations, mut non_finite) =
        (0f64, 0f64, 0f64, 0usize, 0usize);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g as f64, w as f64);
        if !g.is_finite() {
            non_finite += 1;
            continue;
        }
        let e = (g - w).abs();
        max_abs = max_abs.max(e);
        num += e * e;
        den += w * w;
        if e > atol + rtol * w.abs() {
            violations += 1;
        }
    }
    Comparison {
        max_abs,
        rel_l2: (num / den.max(f64::MIN_POSITIVE)).sqrt(),
        violations,
        non_finite,
    }
}

/// The GPU's stream, or `None` (and a note on stderr) where there is no CUDA
/// driver or device. With `GDN_REQUIRE_GPU=1` a missing GPU is a failure, so
/// the documented GPU command cannot pass by skipping.
pub fn gpu_stream() -> Option<Arc<CudaStream>> {
    let required = std::env::var("GDN_REQUIRE_GPU").is_ok_and(|v| v == "1");
    // SAFETY: only probes whether libcuda can be loaded.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    let ctx = if present {
        CudaContext::new(0).map_err(|e| e.to_string())
    } else {
        Err("no CUDA driver library".into())
    };
    match ctx {
        Ok(ctx) => Some(ctx.default_stream()),
        Err(why) if required => panic!("GDN_REQUIRE_GPU=1 but no GPU is usable: {why}"),
        Err(why) => {
            eprintln!("skipped: no usable GPU ({why})");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle over two `token_range` chunks with the state carried equals
    /// the oracle over the whole sequence (the chunks slice every input).
    #[test]
    fn token_ranges_continue_the_whole_sequence() {
        let whole = Problem::random(5, geometry(2, 4), &[40], true);
        let want = whole.reference();
        let a = whole.token_range(0, 17, whole.initial_state.clone().unwrap());
        let ra = a.reference();
        let b = whole.token_range(17, 40, ra.final_state.clone());
        let rb = b.reference();
        let out: Vec<f32> = ra.output.into_iter().chain(rb.output).collect();
        assert_results_agree(
            "oracle split",
            &(out, rb.final_state),
            &(want.output, want.final_state),
        );
    }
}
