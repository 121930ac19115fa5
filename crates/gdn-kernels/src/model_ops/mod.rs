//! The shared context of our model kernels (`cuda/model_kernels.cu`, one
//! cubin from the verified bundle): [`ModelOps`] holds the loaded kernels
//! ([`functions`]), the stream and each family's per-device state, plus the
//! argument checks every op uses. The ops themselves are `impl ModelOps`
//! blocks next to their family: `attention/ops.rs`, `deltanet/ops.rs`,
//! `moe/ops.rs`, `gemm/swiglu.rs` (`silu_mul`), [`elementwise`] (embedding,
//! norms, copies, fills) and `model_check.rs`. Callers pass typed buffers
//! and shapes; only the crate knows kernel names, launch geometries and
//! argument orders, and every op checks every buffer length and index range
//! before launching.

mod elementwise;
pub(crate) mod functions;

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaSlice, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::attention::select::{self, AttentionRequest, Fa3};
use crate::shared::cubins::cubin_for;
use crate::shared::error::{invalid, During, GdnError, Op};
use functions::Functions;

const UNIT: &str = "model_kernels";
/// Tiles in flight per warp of the tensor-core decode unless a benchmark
/// sets another ([`ModelOps::set_decode_tc_stages`]); the measured choice
/// is in docs/performance.md (decode attention against its KV-read floor).
const DECODE_TC_STAGES: usize = 3;
/// Static shared memory a block may use: the strided norm keeps a row of
/// `hidden` floats there.
pub(crate) const MAX_STATIC_SHARED: usize = 48 * 1024;
/// Arrival counters of the fused DeltaNet decode: one per (sequence, q/k
/// head) of a launch; larger batches launch in chunks.
pub(crate) const FUSED_DECODE_COUNTERS: usize = 1 << 16;

/// Exact length check: `what` must hold `want` elements.
pub(crate) fn exact(op: Op, what: &'static str, have: usize, want: usize) -> Result<(), GdnError> {
    if have == want {
        Ok(())
    } else {
        Err(invalid(
            op,
            what,
            format!("expected {want} elements, got {have}"),
        ))
    }
}

/// A pool of `per_slot`-sized slots must hold every slot the batch uses.
pub(crate) fn pool(
    op: Op,
    what: &'static str,
    len: usize,
    per_slot: usize,
    max_id: usize,
) -> Result<(), GdnError> {
    if per_slot == 0 || len % per_slot != 0 || len / per_slot <= max_id {
        return Err(invalid(
            op,
            what,
            format!("{len} elements is not a whole number of {per_slot}-element slots covering id {max_id}"),
        ));
    }
    Ok(())
}

/// `x` (the size `what`) as a kernel's i32 argument.
pub(crate) fn i32_of(op: Op, what: &'static str, x: usize) -> Result<i32, GdnError> {
    i32::try_from(x).map_err(|_| invalid(op, what, format!("{x} exceeds i32")))
}

/// A launch of `x * y` blocks of `threads`, with `shared` bytes of dynamic
/// shared memory.
pub(crate) fn grid(x: usize, y: usize, threads: u32, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// Our model kernels, loaded for one stream's device.
pub struct ModelOps {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) f: Functions,
    _module: Arc<CudaModule>,
    pub(crate) sm: u32,
    pub(crate) multiprocessors: usize,
    /// The fused decode's arrival counters: zero between launches (each
    /// launch's last blocks reset theirs), so launches on this stream,
    /// captured or not, share them.
    pub(crate) fused_arrivals: CudaSlice<u32>,
    pub(crate) attention_request: AttentionRequest,
    /// Tiles in flight per warp of the tensor-core decode (2 or 3).
    pub(crate) decode_tc_stages: usize,
    /// A fixed split count for decode attention instead of the rule (a
    /// benchmark knob).
    pub(crate) decode_splits_override: Option<usize>,
    /// FlashInfer's FA3 attention, when this GPU runs it and the request
    /// allows it (see `attention::select`).
    pub(crate) fa3: Option<Fa3>,
}

impl ModelOps {
    /// The ops with [`AttentionRequest::Auto`].
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, GdnError> {
        Self::with_attention(stream, AttentionRequest::Auto)
    }

    /// The ops with the attention kernel chosen by `request` (tests force
    /// each kernel with it; the rule is in `attention/select.rs`).
    pub fn with_attention(
        stream: Arc<CudaStream>,
        request: AttentionRequest,
    ) -> Result<Self, GdnError> {
        const OP: Op = Op::ModelKernels;
        let fa3 = select::probe(&stream, request)?;
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().during(OP)?;
        let (sm, cubin) = cubin_for(UNIT, cc).map_err(|why| why.into_error(OP))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .during(OP)?;
        let f = Functions::load(&module)?;
        let multiprocessors = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during(OP)? as usize;
        let fused_arrivals = stream
            .alloc_zeros::<u32>(FUSED_DECODE_COUNTERS)
            .during(OP)?;
        Ok(ModelOps {
            stream,
            f,
            _module: module,
            sm,
            multiprocessors,
            fused_arrivals,
            attention_request: request,
            fa3,
            decode_tc_stages: DECODE_TC_STAGES,
            decode_splits_override: None,
        })
    }

    /// The SM version of the cubin in use.
    pub fn cubin_sm(&self) -> u32 {
        self.sm
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
