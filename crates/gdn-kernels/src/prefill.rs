//! The semantic GDN prefill op: validated typed buffers in, one kernel launch
//! on the resolved backend out.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::bf16;

use crate::dispatch::{
    portable_cubin, prefer_context_parallel, resolve, Backend, BackendRequest, DispatchDecision,
};
use crate::dsl::{choose_cp_chunk_len, DslFamily};
use crate::error::{invalid, GdnError};
use crate::ffi;
use crate::oracle::GdnGeometry;
use crate::HEAD_DIM;

/// Threads per block of `gdn_portable_prefill_bf16` (GDN_PORTABLE_BLOCK_THREADS).
const PORTABLE_BLOCK_THREADS: u32 = 512;
const PORTABLE_KERNEL: &str = "gdn_portable_prefill_bf16";

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

enum Kernel {
    /// The C++ kernel, plain or value-split (`launcher`).
    FlashInfer {
        sm_count: i32,
        workspace: CudaSlice<u8>,
        launcher: ffi::PrefillLauncher,
    },
    Portable {
        function: CudaFunction,
    },
    CuteDsl {
        family: DslFamily,
        sm_count: i32,
        compute_capability: (i32, i32),
        device_name: String,
        /// Grown on demand (the CP workspace depends on the batch).
        workspace: CudaSlice<u8>,
        /// SM100 takes int32 offsets.
        cu_seqlens_i32: CudaSlice<i32>,
        _modules: DslModules,
    },
}

/// One reference to a loaded DSL kernel family (`gdn_dsl_load`), released on
/// drop while the op's context is still alive: the op owns the stream and so
/// the context, and drops this first.
struct DslModules {
    family: DslFamily,
    ctx: Arc<cudarc::driver::CudaContext>,
}

impl DslModules {
    fn load(family: DslFamily, ctx: Arc<cudarc::driver::CudaContext>) -> Result<Self, GdnError> {
        ctx.bind_to_thread()?;
        // SAFETY: loads the family's exported modules on every device; no pointers.
        let status = unsafe { ffi::gdn_dsl_load(family as i32) };
        if status != ffi::GDN_OK {
            return Err(GdnError::Launcher {
                status,
                detail: ffi::dsl_last_error(),
            });
        }
        Ok(DslModules { family, ctx })
    }
}

impl Drop for DslModules {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: releases the reference taken in `load`.
        let status = unsafe { ffi::gdn_dsl_unload(self.family as i32) };
        if status != ffi::GDN_OK {
            log::warn!("gdn_dsl_unload: {}", ffi::dsl_last_error());
        }
    }
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
                "geometry.head_dim",
                format!("must be {HEAD_DIM}, got {}", geometry.head_dim),
            ));
        }
        if geometry.num_qk_heads == 0 || geometry.num_v_heads % geometry.num_qk_heads != 0 {
            return Err(invalid(
                "geometry",
                format!(
                    "Hv={} must be a positive multiple of Hqk={}",
                    geometry.num_v_heads, geometry.num_qk_heads
                ),
            ));
        }
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability()?;
        let sm_count =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let decision = resolve(request, cc, sm_count, &geometry)
            .map_err(|(backend, reason)| GdnError::Unsupported { backend, reason })?;
        let kernel = match decision.resolved {
            Backend::FlashInfer | Backend::FlashInferVsplit => {
                // SAFETY: no arguments; returns the launcher's compiled-in constant.
                let actual = unsafe { ffi::gdn_abi_version() };
                if actual != ffi::GDN_ABI_VERSION {
                    return Err(GdnError::AbiMismatch {
                        expected: ffi::GDN_ABI_VERSION,
                        actual,
                    });
                }
                // SAFETY: pure function of its argument.
                let bytes = unsafe { ffi::gdn_prefill_sm90_workspace_bytes(sm_count) } as usize;
                // Both launchers take this workspace (gdn_vsplit_abi.h).
                Kernel::FlashInfer {
                    sm_count,
                    workspace: stream.alloc_zeros::<u8>(bytes.max(1))?,
                    launcher: if decision.resolved == Backend::FlashInferVsplit {
                        ffi::PREFILL_SM90_VSPLIT
                    } else {
                        ffi::PREFILL_SM90
                    },
                }
            }
            Backend::Portable => {
                let (_, cubin) = portable_cubin(cc).map_err(|reason| GdnError::Unsupported {
                    backend: "portable",
                    reason,
                })?;
                let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
                Kernel::Portable {
                    function: module.load_function(PORTABLE_KERNEL)?,
                }
            }
            backend => dsl_kernel(
                &stream,
                backend
                    .dsl_family()
                    .expect("the remaining backends are DSL ones"),
                sm_count,
                cc,
            )?,
        };
        let context_parallel = if decision.context_parallel_per_call {
            Some(dsl_kernel(&stream, DslFamily::Sm90Cp, sm_count, cc)?)
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
            cu_seqlens_dev: stream.alloc_zeros::<i64>(2)?,
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
            Kernel::FlashInfer { workspace, .. } => workspace.len(),
            Kernel::CuteDsl { workspace, .. } => workspace.len(),
            Kernel::Portable { .. } => 0,
        }
    }

    /// Enqueues the prefill on the op's stream. `scale` multiplies q (usually 1/sqrt(128)).
    pub fn run(&mut self, b: PrefillBuffers<'_>, scale: f32) -> Result<(), GdnError> {
        let (num_seqs, total_tokens) = validate(&self.geometry, &b, self.decision.resolved)?;
        if !scale.is_finite() {
            return Err(invalid("scale", format!("must be finite, got {scale}")));
        }
        if self.cu_seqlens_dev.len() < b.cu_seqlens.len() {
            self.cu_seqlens_dev = self.stream.alloc_zeros::<i64>(b.cu_seqlens.len())?;
        }
        let mut cu_view = self.cu_seqlens_dev.slice_mut(..b.cu_seqlens.len());
        self.stream.memcpy_htod(b.cu_seqlens, &mut cu_view)?;
        if total_tokens == 0 {
            // Nothing to scan: the final state is the initial one (or zeros).
            return copy_state(&self.stream, b.initial_state, b.final_state);
        }
        let g = self.geometry;
        let s = &self.stream;
        let (q, _q) = b.q.device_ptr(s);
        let (k, _k) = b.k.device_ptr(s);
        let (v, _v) = b.v.device_ptr(s);
        let (alpha, _a) = b.alpha.device_ptr(s);
        let (beta, _b) = b.beta.device_ptr(s);
        let (cu, _c) = self.cu_seqlens_dev.device_ptr(s);
        let init = b.initial_state.map(|st| st.device_ptr(s));
        let init_ptr = init.as_ref().map(|(p, _)| *p).unwrap_or(0);
        let (state_out, _so) = b.final_state.device_ptr_mut(s);
        let (out, _o) = b.output.device_ptr_mut(s);
        let max_seqlen = b
            .cu_seqlens
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        let kernel = match &mut self.context_parallel {
            Some(cp)
                if prefer_context_parallel(num_seqs, g.num_v_heads, max_seqlen, self.sm_count) =>
            {
                self.last_backend = Backend::CuteDslSm90Cp;
                cp
            }
            _ => {
                self.last_backend = self.decision.resolved;
                &mut self.kernel
            }
        };
        match kernel {
            Kernel::FlashInfer {
                sm_count,
                workspace,
                launcher: (launch, last_error),
            } => {
                let workspace_bytes = workspace.len() as u64;
                let (ws, _w) = workspace.device_ptr_mut(s);
                let args = ffi::GdnPrefillArgs {
                    abi_version: ffi::GDN_ABI_VERSION,
                    struct_size: std::mem::size_of::<ffi::GdnPrefillArgs>() as u32,
                    output: out as *mut c_void,
                    output_state: state_out as *mut f32,
                    q: q as *const c_void,
                    k: k as *const c_void,
                    v: v as *const c_void,
                    input_state: init_ptr as *const f32,
                    alpha: alpha as *const f32,
                    beta: beta as *const f32,
                    cu_seqlens: cu as *const i64,
                    workspace: ws as *mut c_void,
                    workspace_bytes,
                    total_tokens: total_tokens as i64,
                    num_seqs: num_seqs as i32,
                    num_qk_heads: g.num_qk_heads as i32,
                    num_v_heads: g.num_v_heads as i32,
                    sm_count: *sm_count,
                    scale,
                    reserved: 0,
                    stream: s.cu_stream() as *mut c_void,
                };
                s.context().bind_to_thread()?;
                // SAFETY: every pointer is a live device allocation of this
                // context whose length `validate` checked against the shapes in
                // gdn_abi.h; initial and final state are distinct allocations
                // (Rust borrows); the guards above keep them alive and ordered on
                // `s` until the launch is enqueued.
                let status = unsafe { launch(&args) };
                if status != ffi::GDN_OK {
                    return Err(GdnError::Launcher {
                        status,
                        detail: last_error(),
                    });
                }
            }
            Kernel::CuteDsl {
                family,
                sm_count,
                compute_capability,
                device_name,
                workspace,
                cu_seqlens_i32,
                ..
            } => {
                let max_seqlen = b
                    .cu_seqlens
                    .windows(2)
                    .map(|w| (w[1] - w[0]) as usize)
                    .max()
                    .unwrap_or(0);
                let cp_chunk_len = if *family == DslFamily::Sm90Cp {
                    // FlashInfer's default: cp_delta_rule_dsl_sm90 with
                    // num_heads = max(Hq, Hv) (delta_rule_cp_sm90.py).
                    choose_cp_chunk_len(
                        max_seqlen,
                        g.num_v_heads.max(g.num_qk_heads),
                        *sm_count as usize,
                        *compute_capability,
                        total_tokens,
                        num_seqs,
                        device_name,
                    ) as i32
                } else {
                    0
                };
                if *family == DslFamily::Sm100 {
                    if cu_seqlens_i32.len() < b.cu_seqlens.len() {
                        *cu_seqlens_i32 = s.alloc_zeros::<i32>(b.cu_seqlens.len())?;
                    }
                    let narrow: Vec<i32> = b.cu_seqlens.iter().map(|&x| x as i32).collect();
                    let mut view = cu_seqlens_i32.slice_mut(..narrow.len());
                    s.memcpy_htod(&narrow, &mut view)?;
                }
                let mut args = ffi::GdnDslPrefillArgs {
                    abi_version: ffi::GDN_DSL_ABI_VERSION,
                    struct_size: std::mem::size_of::<ffi::GdnDslPrefillArgs>() as u32,
                    kernel: *family as i32,
                    cp_chunk_len,
                    output: out as *mut c_void,
                    output_state: state_out as *mut f32,
                    q: q as *const c_void,
                    k: k as *const c_void,
                    v: v as *const c_void,
                    input_state: init_ptr as *const f32,
                    alpha: alpha as *const f32,
                    beta: beta as *const f32,
                    cu_seqlens: cu as *const i64,
                    cu_seqlens_i32: std::ptr::null(),
                    workspace: std::ptr::null_mut(),
                    workspace_bytes: 0,
                    total_tokens: total_tokens as i64,
                    num_seqs: num_seqs as i32,
                    max_seqlen: max_seqlen as i32,
                    num_qk_heads: g.num_qk_heads as i32,
                    num_v_heads: g.num_v_heads as i32,
                    sm_count: *sm_count,
                    scale,
                    stream: s.cu_stream() as *mut c_void,
                };
                // SAFETY: a pure function of the struct's sizes.
                let need = unsafe { ffi::gdn_dsl_workspace_bytes(&args) } as usize;
                if need == 0 {
                    return Err(invalid(
                        "cu_seqlens",
                        "no workspace layout for this batch (see gdn_dsl_workspace_bytes)",
                    ));
                }
                if workspace.len() < need {
                    *workspace = s.alloc_zeros::<u8>(need)?;
                }
                args.workspace_bytes = workspace.len() as u64;
                let (ws, _w) = workspace.device_ptr_mut(s);
                let (cu32, _c32) = cu_seqlens_i32.device_ptr(s);
                args.workspace = ws as *mut c_void;
                args.cu_seqlens_i32 = cu32 as *const i32;
                s.context().bind_to_thread()?;
                // SAFETY: as for the FlashInfer launcher: live device buffers of
                // this context validated against the shapes of gdn_dsl_abi.h,
                // distinct input/output states, a workspace of the size the
                // wrapper asked for (cudaMalloc'd, so 256-byte aligned), all
                // kept alive by the guards until the launches are enqueued.
                let status = unsafe { ffi::gdn_dsl_prefill(&args) };
                if status != ffi::GDN_OK {
                    return Err(GdnError::Launcher {
                        status,
                        detail: ffi::dsl_last_error(),
                    });
                }
            }
            Kernel::Portable { function } => {
                let cfg = LaunchConfig {
                    grid_dim: (g.num_v_heads as u32, num_seqs as u32, 1),
                    block_dim: (PORTABLE_BLOCK_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (hqk, hv) = (g.num_qk_heads as i32, g.num_v_heads as i32);
                let mut launch = s.launch_builder(function);
                launch
                    .arg(&out)
                    .arg(&state_out)
                    .arg(&q)
                    .arg(&k)
                    .arg(&v)
                    .arg(&init_ptr);
                launch
                    .arg(&alpha)
                    .arg(&beta)
                    .arg(&cu)
                    .arg(&hqk)
                    .arg(&hv)
                    .arg(&scale);
                // SAFETY: the argument list matches gdn_portable_prefill_bf16's
                // signature in gdn_portable.cu (pointers as u64 device addresses);
                // buffer lengths were validated; grid = (Hv, N), block = 512.
                unsafe { launch.launch(cfg) }?;
            }
        }
        Ok(())
    }
}

/// Loads one CuTe DSL kernel family for the op (ABI version checked).
fn dsl_kernel(
    stream: &Arc<CudaStream>,
    family: DslFamily,
    sm_count: i32,
    cc: (i32, i32),
) -> Result<Kernel, GdnError> {
    // SAFETY: no arguments; returns the wrapper's compiled-in constant.
    let actual = unsafe { ffi::gdn_dsl_abi_version() };
    if actual != ffi::GDN_DSL_ABI_VERSION {
        return Err(GdnError::AbiMismatch {
            expected: ffi::GDN_DSL_ABI_VERSION,
            actual,
        });
    }
    let ctx = stream.context().clone();
    Ok(Kernel::CuteDsl {
        family,
        sm_count,
        compute_capability: cc,
        device_name: ctx.name()?,
        workspace: stream.alloc_zeros::<u8>(1)?,
        cu_seqlens_i32: stream.alloc_zeros::<i32>(2)?,
        _modules: DslModules::load(family, ctx)?,
    })
}

fn copy_state(
    stream: &Arc<CudaStream>,
    init: Option<&CudaSlice<f32>>,
    out: &mut CudaSlice<f32>,
) -> Result<(), GdnError> {
    match init {
        Some(i) => stream.memcpy_dtod(i, out)?,
        None => stream.memset_zeros(out)?,
    }
    Ok(())
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
fn validate(
    g: &GdnGeometry,
    b: &PrefillBuffers<'_>,
    backend: Backend,
) -> Result<(usize, usize), GdnError> {
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
    validate_lengths(g, b.cu_seqlens, lens, backend)
}

fn validate_lengths(
    g: &GdnGeometry,
    cu: &[i64],
    b: BufferLens,
    backend: Backend,
) -> Result<(usize, usize), GdnError> {
    if cu.len() < 2 {
        return Err(invalid(
            "cu_seqlens",
            format!("needs at least 2 entries (one sequence), got {}", cu.len()),
        ));
    }
    if cu[0] != 0 {
        return Err(invalid(
            "cu_seqlens",
            format!("must start at 0, starts at {}", cu[0]),
        ));
    }
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(
                "cu_seqlens",
                format!("decreases at index {}: {} -> {}", i + 1, w[0], w[1]),
            ));
        }
        if w[1] == w[0] && matches!(backend, Backend::FlashInfer | Backend::FlashInferVsplit) {
            return Err(invalid(
                "cu_seqlens",
                format!("sequence {i} is empty; zero-length sequences are supported by FlashInfer only from 0.6.14, the bundle has 0.6.13 (drop it from the batch)"),
            ));
        }
        if w[1] == w[0] && backend.dsl_family().is_some() {
            return Err(invalid(
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
            "cu_seqlens",
            format!("{n} sequences exceed the portable kernel's 65535 per call; split the batch"),
        ));
    }
    if n > i32::MAX as usize / g.num_v_heads.max(1) || t > i32::MAX as usize {
        return Err(invalid(
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
        match r {
            Err(GdnError::InvalidArgument { arg, message }) => (arg, message),
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
