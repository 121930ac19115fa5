//! One packed varlen GDN problem: random inputs in Qwen3.5's ranges, the
//! oracle on them, and its buffers on the GPU.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};
use gdn_kernels::oracle::{
    gated_delta_rule_reference, GdnGeometry, ReferenceInputs, ReferenceOutputs,
};
use gdn_kernels::{GdnError, GdnPrefill, Op, PrefillBuffers, HEAD_DIM};
use half::bf16;

use crate::Rng;

/// A driver error of the copies around a prefill, as the op's error.
fn cuda(e: DriverError) -> GdnError {
    GdnError::cuda(Op::GdnPrefill, e)
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
            q: stream.clone_htod(&self.q).map_err(cuda)?,
            k: stream.clone_htod(&self.k).map_err(cuda)?,
            v: stream.clone_htod(&self.v).map_err(cuda)?,
            alpha: stream.clone_htod(&self.alpha).map_err(cuda)?,
            beta: stream.clone_htod(&self.beta).map_err(cuda)?,
            initial_state: self
                .initial_state
                .as_ref()
                .map(|s| stream.clone_htod(s))
                .transpose()
                .map_err(cuda)?,
            output: stream
                .clone_htod(&vec![
                    bf16::NAN;
                    self.total_tokens() * g.num_v_heads * HEAD_DIM
                ])
                .map_err(cuda)?,
            final_state: stream
                .clone_htod(&vec![
                    f32::NAN;
                    self.num_seqs() * g.num_v_heads * HEAD_DIM * HEAD_DIM
                ])
                .map_err(cuda)?,
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
            .clone_dtoh(&self.output)
            .map_err(cuda)?
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let state = stream.clone_dtoh(&self.final_state).map_err(cuda)?;
        stream.synchronize().map_err(cuda)?;
        Ok((out, state))
    }
}
