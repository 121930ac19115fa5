//! The semantic GDN prefill op: validated typed buffers in, one kernel launch
//! on the resolved backend out. [`GdnPrefill::run`] checks the call
//! ([`validate_lengths`]), picks the kernel (with `Auto` on SM90, the
//! context-parallel one or not, per call) and hands plain device addresses
//! to that backend's launch: [`FlashInferKernel::launch`],
//! [`DslKernel::launch`] or [`PortableKernel::launch`].

pub(crate) mod dispatch;
pub(crate) mod dsl;
pub(crate) mod dsl_ffi;
pub(crate) mod ffi;
mod launch;

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::deltanet::oracle::{GdnGeometry, HEAD_DIM};
use crate::deltanet::prefill::dispatch::{
    prefer_context_parallel, resolve, Backend, BackendRequest, DispatchDecision,
};
use crate::deltanet::prefill::dsl::DslFamily;
use crate::deltanet::prefill::ffi as prefill_ffi;
use crate::shared::error::{invalid, During, GdnError};
use launch::{CallShape, DevicePointers, DslKernel, FlashInferKernel, Kernel, PortableKernel, OP};

/// The buffers of one prefill call. Shapes are in the crate docs; the op
/// checks every length against `cu_seqlens` and the geometry before launching.
pub struct PrefillBuffers<'a> {
    pub q: &'a CudaSlice<bf16>,
    pub k: &'a CudaSlice<bf16>,
    pub v: &'a CudaSlice<bf16>,
    pub alpha: &'a CudaSlice<f32>,
    pub beta: &'a CudaSlice<f32>,
    /// Token offsets of the sequences, `[N + 1]`, on the host.
    pub cu_seqlens: &'a [i64],
    /// `None` starts every sequence from a zero state.
    pub initial_state: Option<&'a CudaSlice<f32>>,
    pub final_state: &'a mut CudaSlice<f32>,
    pub output: &'a mut CudaSlice<bf16>,
}
/// A GDN prefill op bound to one stream and one geometry.
pub struct GdnPrefill {
    // Dropped first: DSL module references are released while the stream
    // (and so the context) below is alive.
    kernel: Kernel,
    /// `Auto` on SM90: the context-parallel DSL kernel, used per call by
    /// [`prefer_context_parallel`].
    context_parallel: Option<Kernel>,
    last_backend: Backend,
    sm_count: i32,
    stream: Arc<CudaStream>,
    geometry: GdnGeometry,
    decision: DispatchDecision,
    cu_seqlens_dev: CudaSlice<i64>,
}

impl GdnPrefill {
    /// Resolves the backend for this GPU and geometry and loads it. Logs the decision.
    pub fn new(
        stream: Arc<CudaStream>,
        geometry: GdnGeometry,
        request: BackendRequest,
    ) -> Result<Self, GdnError> {
        if geometry.head_dim != HEAD_DIM {
            return Err(invalid(
                OP,
                "geometry.head_dim",
                format!("must be {HEAD_DIM}, got {}", geometry.head_dim),
            ));
        }
        if geometry.num_qk_heads == 0 || geometry.num_v_heads % geometry.num_qk_heads != 0 {
            return Err(invalid(
                OP,
                "geometry",
                format!(
                    "Hv={} must be a positive multiple of Hqk={}",
                    geometry.num_v_heads, geometry.num_qk_heads
                ),
            ));
        }
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().during(OP)?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during(OP)?;
        let decision =
            resolve(request, cc, sm_count, &geometry).map_err(|why| why.into_error(OP))?;
        let kernel = match decision.resolved {
            Backend::FlashInfer => Kernel::FlashInfer(FlashInferKernel::load(
                &stream,
                sm_count,
                &prefill_ffi::PREFILL_SM90,
            )?),
            Backend::FlashInferVsplit => Kernel::FlashInfer(FlashInferKernel::load(
                &stream,
                sm_count,
                &prefill_ffi::PREFILL_SM90_VSPLIT,
            )?),
            Backend::Portable => Kernel::Portable(PortableKernel::load(&ctx, cc)?),
            backend => Kernel::CuteDsl(DslKernel::load(
                &stream,
                backend
                    .dsl_family()
                    .expect("the remaining backends are DSL ones"),
                sm_count,
                cc,
            )?),
        };
        let context_parallel = if decision.context_parallel_per_call {
            Some(Kernel::CuteDsl(DslKernel::load(
                &stream,
                DslFamily::Sm90Cp,
                sm_count,
                cc,
            )?))
        } else {
            None
        };
        log::info!(
            "gdn_prefill: requested {:?}, running {} ({}) on sm_{}{}",
            decision.requested,
            decision.resolved,
            decision.reason,
            cc.0,
            cc.1
        );
        Ok(GdnPrefill {
            cu_seqlens_dev: stream.alloc_zeros::<i64>(2).during(OP)?,
            stream,
            geometry,
            last_backend: decision.resolved,
            decision,
            kernel,
            context_parallel,
            sm_count,
        })
    }

    /// The backend the last `run` used (with `Auto` on SM90, the CP kernel
    /// or not, per call).
    pub fn last_backend(&self) -> Backend {
        self.last_backend
    }

    pub fn backend(&self) -> Backend {
        self.decision.resolved
    }

    pub fn decision(&self) -> &DispatchDecision {
        &self.decision
    }

    /// Device memory the op holds besides the caller's buffers (FlashInfer's
    /// TMA-descriptor workspace), so callers can budget memory.
    pub fn workspace_bytes(&self) -> usize {
        match &self.kernel {
            Kernel::FlashInfer(k) => k.workspace.len(),
            Kernel::CuteDsl(k) => k.workspace.len(),
            Kernel::Portable(_) => 0,
        }
    }

    /// Enqueues the prefill on the op's stream. `scale` multiplies q (usually 1/sqrt(128)).
    pub fn run(&mut self, b: PrefillBuffers<'_>, scale: f32) -> Result<(), GdnError> {
        let call = self.validate(&b, scale)?;
        self.upload_cu_seqlens(b.cu_seqlens)?;
        if call.total_tokens == 0 {
            // Nothing to scan: the final state is the initial one (or zeros).
            return copy_state(&self.stream, b.initial_state, b.final_state);
        }
        let context_parallel = self.context_parallel.is_some()
            && prefer_context_parallel(
                call.num_seqs,
                self.geometry.num_v_heads,
                call.max_seqlen,
                self.sm_count,
            );
        self.last_backend = if context_parallel {
            Backend::CuteDslSm90Cp
        } else {
            self.decision.resolved
        };
        let s = &self.stream;
        let (q, _q) = b.q.device_ptr(s);
        let (k, _k) = b.k.device_ptr(s);
        let (v, _v) = b.v.device_ptr(s);
        let (alpha, _a) = b.alpha.device_ptr(s);
        let (beta, _b) = b.beta.device_ptr(s);
        let (cu_seqlens, _c) = self.cu_seqlens_dev.device_ptr(s);
        let init = b.initial_state.map(|st| st.device_ptr(s));
        let (final_state, _so) = b.final_state.device_ptr_mut(s);
        let (output, _o) = b.output.device_ptr_mut(s);
        let p = DevicePointers {
            q,
            k,
            v,
            alpha,
            beta,
            cu_seqlens,
            initial_state: init.as_ref().map_or(0, |(p, _)| *p),
            final_state,
            output,
        };
        let kernel = match &mut self.context_parallel {
            Some(cp) if context_parallel => cp,
            _ => &mut self.kernel,
        };
        let g = &self.geometry;
        match kernel {
            Kernel::FlashInfer(fi) => fi.launch(s, &p, call, g, scale),
            Kernel::CuteDsl(dsl) => dsl.launch(s, &p, call, b.cu_seqlens, g, scale),
            Kernel::Portable(portable) => portable.launch(s, &p, call, g, scale),
        }
    }

    /// Checks every buffer against `cu_seqlens` and the geometry, and the scale.
    fn validate(&self, b: &PrefillBuffers<'_>, scale: f32) -> Result<CallShape, GdnError> {
        let lens = BufferLens {
            q: b.q.len(),
            k: b.k.len(),
            v: b.v.len(),
            alpha: b.alpha.len(),
            beta: b.beta.len(),
            initial_state: b.initial_state.map(|s| s.len()),
            final_state: b.final_state.len(),
            output: b.output.len(),
        };
        let (num_seqs, total_tokens) =
            validate_lengths(&self.geometry, b.cu_seqlens, lens, self.decision.resolved)?;
        if !scale.is_finite() {
            return Err(invalid(OP, "scale", format!("must be finite, got {scale}")));
        }
        let max_seqlen = b
            .cu_seqlens
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        Ok(CallShape {
            num_seqs,
            total_tokens,
            max_seqlen,
        })
    }

    /// Copies the (validated) offsets into the op's device buffer.
    fn upload_cu_seqlens(&mut self, cu_seqlens: &[i64]) -> Result<(), GdnError> {
        if self.cu_seqlens_dev.len() < cu_seqlens.len() {
            self.cu_seqlens_dev = self
                .stream
                .alloc_zeros::<i64>(cu_seqlens.len())
                .during(OP)?;
        }
        let mut view = self.cu_seqlens_dev.slice_mut(..cu_seqlens.len());
        self.stream.memcpy_htod(cu_seqlens, &mut view).during(OP)
    }
}

fn copy_state(
    stream: &Arc<CudaStream>,
    init: Option<&CudaSlice<f32>>,
    out: &mut CudaSlice<f32>,
) -> Result<(), GdnError> {
    match init {
        Some(i) => stream.memcpy_dtod(i, out).during(OP),
        None => stream.memset_zeros(out).during(OP),
    }
}

fn expect_len(
    arg: &'static str,
    actual: usize,
    expected: usize,
    shape: String,
) -> Result<(), GdnError> {
    if actual == expected {
        Ok(())
    } else {
        Err(invalid(
            OP,
            arg,
            format!("expected {expected} elements ({shape}), got {actual}"),
        ))
    }
}

/// Element counts of the buffers of one call; validation works on these so it
/// is testable without a GPU.
#[derive(Clone, Copy, Debug)]
struct BufferLens {
    q: usize,
    k: usize,
    v: usize,
    alpha: usize,
    beta: usize,
    initial_state: Option<usize>,
    final_state: usize,
    output: usize,
}

/// Checks every buffer against `cu_seqlens` and the geometry; returns (N, T).
fn validate_lengths(
    g: &GdnGeometry,
    cu: &[i64],
    b: BufferLens,
    backend: Backend,
) -> Result<(usize, usize), GdnError> {
    if cu.len() < 2 {
        return Err(invalid(
            OP,
            "cu_seqlens",
            format!("needs at least 2 entries (one sequence), got {}", cu.len()),
        ));
    }
    if cu[0] != 0 {
        return Err(invalid(
            OP,
            "cu_seqlens",
            format!("must start at 0, starts at {}", cu[0]),
        ));
    }
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(
                OP,
                "cu_seqlens",
                format!("decreases at index {}: {} -> {}", i + 1, w[0], w[1]),
            ));
        }
        if w[1] == w[0] && matches!(backend, Backend::FlashInfer | Backend::FlashInferVsplit) {
            return Err(invalid(
                OP,
                "cu_seqlens",
                format!("sequence {i} is empty; zero-length sequences are supported by FlashInfer only from 0.6.14, the bundle has 0.6.13 (drop it from the batch)"),
            ));
        }
        if w[1] == w[0] && backend.dsl_family().is_some() {
            return Err(invalid(
                OP,
                "cu_seqlens",
                format!("sequence {i} is empty; zero-length sequences are not tested on the CuTe DSL kernels (drop it from the batch)"),
            ));
        }
    }
    let n = cu.len() - 1;
    let t = *cu.last().expect("len >= 2") as usize;
    // The portable kernel's grid has one block row per sequence (grid.y <= 65535).
    if backend == Backend::Portable && n > 65_535 {
        return Err(invalid(
            OP,
            "cu_seqlens",
            format!("{n} sequences exceed the portable kernel's 65535 per call; split the batch"),
        ));
    }
    if n > i32::MAX as usize / g.num_v_heads.max(1) || t > i32::MAX as usize {
        return Err(invalid(
            OP,
            "cu_seqlens",
            format!("{n} sequences / {t} tokens exceed the 32-bit launch limits"),
        ));
    }
    let (hq, hv, d) = (g.num_qk_heads, g.num_v_heads, g.head_dim);
    expect_len("q", b.q, t * hq * d, format!("[T={t}, Hqk={hq}, D={d}]"))?;
    expect_len("k", b.k, t * hq * d, format!("[T={t}, Hqk={hq}, D={d}]"))?;
    expect_len("v", b.v, t * hv * d, format!("[T={t}, Hv={hv}, D={d}]"))?;
    expect_len(
        "output",
        b.output,
        t * hv * d,
        format!("[T={t}, Hv={hv}, D={d}]"),
    )?;
    expect_len("alpha", b.alpha, t * hv, format!("[T={t}, Hv={hv}]"))?;
    expect_len("beta", b.beta, t * hv, format!("[T={t}, Hv={hv}]"))?;
    let state = n * hv * d * d;
    let shape = format!("[N={n}, Hv={hv}, {d}, {d}]");
    expect_len("final_state", b.final_state, state, shape.clone())?;
    if let Some(init) = b.initial_state {
        expect_len("initial_state", init, state, shape)?;
    }
    Ok((n, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: GdnGeometry = GdnGeometry {
        num_qk_heads: 2,
        num_v_heads: 4,
        head_dim: 128,
    };

    /// Correct lengths for `cu` under `G`.
    fn lens(cu: &[i64], init: bool) -> BufferLens {
        let (t, n) = (*cu.last().unwrap() as usize, cu.len() - 1);
        BufferLens {
            q: t * 2 * 128,
            k: t * 2 * 128,
            v: t * 4 * 128,
            alpha: t * 4,
            beta: t * 4,
            initial_state: init.then_some(n * 4 * 128 * 128),
            final_state: n * 4 * 128 * 128,
            output: t * 4 * 128,
        }
    }

    fn err(r: Result<(usize, usize), GdnError>) -> (&'static str, String) {
        let e = r.expect_err("an invalid argument");
        assert_eq!(e.op(), crate::Op::GdnPrefill);
        match e.kind() {
            crate::ErrorKind::InvalidArgument { arg, message } => (arg, message.clone()),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn correct_buffers_pass_and_report_n_and_t() {
        let cu = [0, 3, 10, 10];
        assert_eq!(
            validate_lengths(&G, &cu, lens(&cu, true), Backend::Portable).unwrap(),
            (3, 10)
        );
    }

    #[test]
    fn each_wrong_length_names_its_argument_and_shape() {
        let cu = [0, 3, 10];
        let good = lens(&cu, true);
        let cases: [(&str, BufferLens); 8] = [
            (
                "q",
                BufferLens {
                    q: good.q - 1,
                    ..good
                },
            ),
            (
                "k",
                BufferLens {
                    k: good.k + 128,
                    ..good
                },
            ),
            ("v", BufferLens { v: good.q, ..good }),
            ("alpha", BufferLens { alpha: 0, ..good }),
            (
                "beta",
                BufferLens {
                    beta: good.beta * 2,
                    ..good
                },
            ),
            (
                "initial_state",
                BufferLens {
                    initial_state: Some(1),
                    ..good
                },
            ),
            (
                "final_state",
                BufferLens {
                    final_state: good.final_state / 2,
                    ..good
                },
            ),
            (
                "output",
                BufferLens {
                    output: good.v + 1,
                    ..good
                },
            ),
        ];
        for (arg, bad) in cases {
            let (got, message) = err(validate_lengths(&G, &cu, bad, Backend::Portable));
            assert_eq!(got, arg);
            assert!(
                message.contains("T=10") || message.contains("N=2"),
                "{arg}: {message}"
            );
        }
    }

    #[test]
    fn malformed_cu_seqlens_are_refused() {
        for (cu, needle) in [
            (&[0i64][..], "at least 2"),
            (&[1, 4][..], "start at 0"),
            (&[0, 5, 3][..], "decreases at index 2"),
        ] {
            let (arg, message) = err(validate_lengths(
                &G,
                cu,
                lens(&[0, 1], false),
                Backend::Portable,
            ));
            assert_eq!(arg, "cu_seqlens");
            assert!(message.contains(needle), "{cu:?}: {message}");
        }
    }

    #[test]
    fn portable_batches_are_limited_by_the_grid() {
        let cu: Vec<i64> = (0..=65_536).collect();
        let (arg, message) = err(validate_lengths(
            &G,
            &cu,
            lens(&cu, false),
            Backend::Portable,
        ));
        assert_eq!(arg, "cu_seqlens");
        assert!(message.contains("65536 sequences"), "{message}");
        assert!(validate_lengths(&G, &cu, lens(&cu, false), Backend::FlashInfer).is_ok());
    }

    #[test]
    fn empty_sequences_only_on_the_portable_backend() {
        let cu = [0, 4, 4, 9];
        assert!(validate_lengths(&G, &cu, lens(&cu, false), Backend::Portable).is_ok());
        let (arg, message) = err(validate_lengths(
            &G,
            &cu,
            lens(&cu, false),
            Backend::FlashInfer,
        ));
        assert_eq!(arg, "cu_seqlens");
        assert!(message.contains("sequence 1 is empty"), "{message}");
    }
}
