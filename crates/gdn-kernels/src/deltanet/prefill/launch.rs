//! The three backends of [`super::GdnPrefill`], each a load (once, when
//! the op is made) and a launch (per call) on plain device addresses:
//! FlashInfer's C++ kernel through `gdn_abi.h`, our portable kernel, and the
//! CuTe DSL kernels through `gdn_dsl_abi.h`.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::deltanet::oracle::GdnGeometry;
use crate::deltanet::prefill::dispatch::portable_cubin;
use crate::deltanet::prefill::dsl::{choose_cp_chunk_len, DslFamily};
use crate::deltanet::prefill::dsl_ffi::{self as dsl_ffi, DSL};
use crate::deltanet::prefill::ffi::{self as prefill_ffi, PrefillLauncher, FLASHINFER};
use crate::shared::error::{invalid, During, GdnError, Op};

/// Every error here is the prefill op's.
pub(super) const OP: Op = Op::GdnPrefill;

/// Threads per block of `gdn_portable_prefill_bf16` (GDN_PORTABLE_BLOCK_THREADS).
const PORTABLE_BLOCK_THREADS: u32 = 512;
const PORTABLE_KERNEL: &str = "gdn_portable_prefill_bf16";

/// The sizes of one validated call.
#[derive(Clone, Copy, Debug)]
pub(super) struct CallShape {
    pub num_seqs: usize,
    pub total_tokens: usize,
    /// Tokens of the longest sequence.
    pub max_seqlen: usize,
}

/// The device addresses of one call's buffers. The caller holds their
/// guards (and so the buffers, ordered on the op's stream) until the
/// launch is enqueued.
pub(super) struct DevicePointers {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub alpha: u64,
    pub beta: u64,
    /// `[N + 1]` i64 on the device.
    pub cu_seqlens: u64,
    /// 0: start from a zero state.
    pub initial_state: u64,
    pub final_state: u64,
    pub output: u64,
}

/// The kernel a call runs on.
pub(super) enum Kernel {
    FlashInfer(FlashInferKernel),
    Portable(PortableKernel),
    CuteDsl(DslKernel),
}

/// FlashInfer's C++ kernel, plain or value-split (`launcher`).
pub(super) struct FlashInferKernel {
    sm_count: i32,
    pub workspace: CudaSlice<u8>,
    launcher: &'static PrefillLauncher,
}

/// Our portable recurrent kernel.
pub(super) struct PortableKernel {
    function: CudaFunction,
}

/// One CuTe DSL kernel family.
pub(super) struct DslKernel {
    family: DslFamily,
    sm_count: i32,
    compute_capability: (i32, i32),
    device_name: String,
    /// Grown on demand (the CP workspace depends on the batch).
    pub workspace: CudaSlice<u8>,
    /// SM100 takes int32 offsets.
    cu_seqlens_i32: CudaSlice<i32>,
    _modules: DslModules,
}

/// One reference to a loaded DSL kernel family (`gdn_dsl_load`), released on
/// drop while the op's context is still alive: the op owns the stream and so
/// the context, and drops this first.
struct DslModules {
    family: DslFamily,
    ctx: Arc<CudaContext>,
}

impl DslModules {
    pub(super) fn load(family: DslFamily, ctx: Arc<CudaContext>) -> Result<Self, GdnError> {
        ctx.bind_to_thread().during(OP)?;
        // SAFETY: loads the family's exported modules on every device; no pointers.
        DSL.check(OP, unsafe { dsl_ffi::gdn_dsl_load(family as i32) })?;
        Ok(DslModules { family, ctx })
    }
}

impl Drop for DslModules {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: releases the reference taken in `load`.
        let status = unsafe { dsl_ffi::gdn_dsl_unload(self.family as i32) };
        if let Err(e) = DSL.check(OP, status) {
            log::warn!("gdn_dsl_unload: {e}");
        }
    }
}

impl FlashInferKernel {
    /// Checks the linked launcher's ABI and allocates its workspace (the
    /// plain and the value-split launcher take the same one, gdn_vsplit_abi.h).
    pub(super) fn load(
        stream: &Arc<CudaStream>,
        sm_count: i32,
        launcher: &'static PrefillLauncher,
    ) -> Result<Self, GdnError> {
        FLASHINFER.check_abi(OP)?;
        // SAFETY: pure function of its argument.
        let bytes = unsafe { prefill_ffi::gdn_prefill_sm90_workspace_bytes(sm_count) } as usize;
        Ok(FlashInferKernel {
            sm_count,
            workspace: stream.alloc_zeros::<u8>(bytes.max(1)).during(OP)?,
            launcher,
        })
    }

    pub(super) fn launch(
        &mut self,
        s: &Arc<CudaStream>,
        p: &DevicePointers,
        call: CallShape,
        g: &GdnGeometry,
        scale: f32,
    ) -> Result<(), GdnError> {
        let workspace_bytes = self.workspace.len() as u64;
        let (ws, _w) = self.workspace.device_ptr_mut(s);
        let args = prefill_ffi::GdnPrefillArgs {
            abi_version: prefill_ffi::GDN_ABI_VERSION,
            struct_size: std::mem::size_of::<prefill_ffi::GdnPrefillArgs>() as u32,
            output: p.output as *mut c_void,
            output_state: p.final_state as *mut f32,
            q: p.q as *const c_void,
            k: p.k as *const c_void,
            v: p.v as *const c_void,
            input_state: p.initial_state as *const f32,
            alpha: p.alpha as *const f32,
            beta: p.beta as *const f32,
            cu_seqlens: p.cu_seqlens as *const i64,
            workspace: ws as *mut c_void,
            workspace_bytes,
            total_tokens: call.total_tokens as i64,
            num_seqs: call.num_seqs as i32,
            num_qk_heads: g.num_qk_heads as i32,
            num_v_heads: g.num_v_heads as i32,
            sm_count: self.sm_count,
            scale,
            reserved: 0,
            stream: s.cu_stream() as *mut c_void,
        };
        s.context().bind_to_thread().during(OP)?;
        // SAFETY: every pointer is a live device allocation of this context
        // whose length `validate` checked against the shapes in gdn_abi.h;
        // initial and final state are distinct allocations (Rust borrows);
        // the caller's guards and `_w` keep them alive and ordered on `s`
        // until the launch is enqueued.
        let status = unsafe { (self.launcher.launch)(&args) };
        self.launcher.library.check(OP, status)
    }
}

impl PortableKernel {
    pub(super) fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Self, GdnError> {
        let (_, cubin) = portable_cubin(cc).map_err(|why| why.into_error(OP))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .during(OP)?;
        Ok(PortableKernel {
            function: module.load_function(PORTABLE_KERNEL).during(OP)?,
        })
    }

    pub(super) fn launch(
        &self,
        s: &Arc<CudaStream>,
        p: &DevicePointers,
        call: CallShape,
        g: &GdnGeometry,
        scale: f32,
    ) -> Result<(), GdnError> {
        let cfg = LaunchConfig {
            grid_dim: (g.num_v_heads as u32, call.num_seqs as u32, 1),
            block_dim: (PORTABLE_BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hqk, hv) = (g.num_qk_heads as i32, g.num_v_heads as i32);
        let mut launch = s.launch_builder(&self.function);
        launch
            .arg(&p.output)
            .arg(&p.final_state)
            .arg(&p.q)
            .arg(&p.k)
            .arg(&p.v)
            .arg(&p.initial_state);
        launch
            .arg(&p.alpha)
            .arg(&p.beta)
            .arg(&p.cu_seqlens)
            .arg(&hqk)
            .arg(&hv)
            .arg(&scale);
        // SAFETY: the argument list matches gdn_portable_prefill_bf16's
        // signature in gdn_portable.cu (pointers as u64 device addresses);
        // buffer lengths were validated; grid = (Hv, N), block = 512.
        unsafe { launch.launch(cfg) }.during(OP)?;
        Ok(())
    }
}

impl DslKernel {
    /// Loads one CuTe DSL kernel family for the op (ABI version checked).
    pub(super) fn load(
        stream: &Arc<CudaStream>,
        family: DslFamily,
        sm_count: i32,
        cc: (i32, i32),
    ) -> Result<Self, GdnError> {
        DSL.check_abi(OP)?;
        let ctx = stream.context().clone();
        Ok(DslKernel {
            family,
            sm_count,
            compute_capability: cc,
            device_name: ctx.name().during(OP)?,
            workspace: stream.alloc_zeros::<u8>(1).during(OP)?,
            cu_seqlens_i32: stream.alloc_zeros::<i32>(2).during(OP)?,
            _modules: DslModules::load(family, ctx)?,
        })
    }

    /// `cu_seqlens` is the host copy of the offsets (the CP chunk length and
    /// SM100's int32 offsets derive from it).
    pub(super) fn launch(
        &mut self,
        s: &Arc<CudaStream>,
        p: &DevicePointers,
        call: CallShape,
        cu_seqlens: &[i64],
        g: &GdnGeometry,
        scale: f32,
    ) -> Result<(), GdnError> {
        let cp_chunk_len = if self.family == DslFamily::Sm90Cp {
            // FlashInfer's default: cp_delta_rule_dsl_sm90 with
            // num_heads = max(Hq, Hv) (delta_rule_cp_sm90.py).
            choose_cp_chunk_len(
                call.max_seqlen,
                g.num_v_heads.max(g.num_qk_heads),
                self.sm_count as usize,
                self.compute_capability,
                call.total_tokens,
                call.num_seqs,
                &self.device_name,
            ) as i32
        } else {
            0
        };
        if self.family == DslFamily::Sm100 {
            if self.cu_seqlens_i32.len() < cu_seqlens.len() {
                self.cu_seqlens_i32 = s.alloc_zeros::<i32>(cu_seqlens.len()).during(OP)?;
            }
            let narrow: Vec<i32> = cu_seqlens.iter().map(|&x| x as i32).collect();
            let mut view = self.cu_seqlens_i32.slice_mut(..narrow.len());
            s.memcpy_htod(&narrow, &mut view).during(OP)?;
        }
        let mut args = dsl_ffi::GdnDslPrefillArgs {
            abi_version: dsl_ffi::GDN_DSL_ABI_VERSION,
            struct_size: std::mem::size_of::<dsl_ffi::GdnDslPrefillArgs>() as u32,
            kernel: self.family as i32,
            cp_chunk_len,
            output: p.output as *mut c_void,
            output_state: p.final_state as *mut f32,
            q: p.q as *const c_void,
            k: p.k as *const c_void,
            v: p.v as *const c_void,
            input_state: p.initial_state as *const f32,
            alpha: p.alpha as *const f32,
            beta: p.beta as *const f32,
            cu_seqlens: p.cu_seqlens as *const i64,
            cu_seqlens_i32: std::ptr::null(),
            workspace: std::ptr::null_mut(),
            workspace_bytes: 0,
            total_tokens: call.total_tokens as i64,
            num_seqs: call.num_seqs as i32,
            max_seqlen: call.max_seqlen as i32,
            num_qk_heads: g.num_qk_heads as i32,
            num_v_heads: g.num_v_heads as i32,
            sm_count: self.sm_count,
            scale,
            stream: s.cu_stream() as *mut c_void,
        };
        // SAFETY: a pure function of the struct's sizes.
        let need = unsafe { dsl_ffi::gdn_dsl_workspace_bytes(&args) } as usize;
        if need == 0 {
            return Err(invalid(
                OP,
                "cu_seqlens",
                "no workspace layout for this batch (see gdn_dsl_workspace_bytes)",
            ));
        }
        if self.workspace.len() < need {
            self.workspace = s.alloc_zeros::<u8>(need).during(OP)?;
        }
        args.workspace_bytes = self.workspace.len() as u64;
        let (ws, _w) = self.workspace.device_ptr_mut(s);
        let (cu32, _c32) = self.cu_seqlens_i32.device_ptr(s);
        args.workspace = ws as *mut c_void;
        args.cu_seqlens_i32 = cu32 as *const i32;
        s.context().bind_to_thread().during(OP)?;
        // SAFETY: as for the FlashInfer launcher: live device buffers of
        // this context validated against the shapes of gdn_dsl_abi.h,
        // distinct input/output states, a workspace of the size the
        // wrapper asked for (cudaMalloc'd, so 256-byte aligned), all
        // kept alive by the guards until the launches are enqueued.
        DSL.check(OP, unsafe { dsl_ffi::gdn_dsl_prefill(&args) })
    }
}
