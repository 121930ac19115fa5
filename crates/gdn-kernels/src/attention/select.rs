//! Which kernel runs a batch's attention, and the FlashInfer SM90 (FA3)
//! launch behind [`AttentionKernel::FlashInferSm90`].
//!
//! The rule ([`choose`]), in order:
//! 1. [`AttentionRequest::Ours`] / [`AttentionRequest::FlashInferSm90`] force
//!    a kernel (tests gate each path with them); forcing FA3 where it cannot
//!    run (not an SM 9.0 GPU, head dim not 256, too many query tiles) is an
//!    error, never a silent switch.
//! 2. [`AttentionRequest::Auto`] takes FA3 for *prefill-shaped* batches (more
//!    tokens than sequences) on an SM 9.0 GPU with head dim 256 and at most
//!    `GDN_ATTENTION_MAX_WORKS_PER_HEAD` query tiles per head; our
//!    tensor-core split-KV decode ([`AttentionKernel::DecodeTensorCore`])
//!    for decode batches (one token a sequence) at head dim 256 and GQA
//!    groups up to 8; and our CUDA-core kernels for everything else:
//!    - decode batches never take FA3: decode steps are captured as CUDA
//!      graphs and the FA3 launch plans its schedule on the host at each
//!      call (a replayed graph would run a stale schedule); a one-row query
//!      tile of 128 rows would also waste most of FA3's tensor-core work.
//!      The tensor-core decode plans on the device (each block derives its
//!      key range from the row's position), so it is graph-safe; its time
//!      against the CUDA-core kernel and FA3 (eager) is in
//!      docs/performance.md (decode attention against its KV-read floor);
//!    - other GPUs: the bundle ships FA3 for sm_90a only (arch-specific
//!      wgmma/TMA code runs on 9.0 alone);
//!    - other head dims: only 256 (Qwen3.5's) is instantiated (one unit,
//!      about a minute of the cold build);
//!    - above 4096 tiles a head (~524k tokens in one step) FlashInfer's plan
//!      switches to a second kernel the bundle does not ship.
//!
//! On an SM 9.0 GPU the linked launcher's ABI version is checked when the
//! ops are created: an eligible configuration whose launcher is missing or
//! speaks another ABI is an error (a missing unit already fails the build,
//! which verifies the bundle against the lock), and a launcher failure is an
//! error of the op, not a fallback.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::attention::ffi::{self as ffi, ATTENTION};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{invalid, During, GdnError, Ineligible, Op};

const OP: Op = Op::Attention;
/// The backend name of FlashInfer's FA3 attention in errors.
const FA3: &str = "flashinfer_attention_sm90";

/// The kernel that runs one batch's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Ours (`model_kernels.cu`): split-K decode for one-token rows, WMMA
    /// query tiles of 16 otherwise; every GPU and head dim 32..=256. The
    /// fallback.
    Ours,
    /// Ours on tensor cores for decode batches (`attention_decode_tc_*`):
    /// split-KV, head dim 256, GQA groups up to 8, every GPU the bundle
    /// targets (sm_80 and later).
    DecodeTensorCore,
    /// FlashInfer 0.6.13's SM90 paged prefill (bundle unit
    /// `flashinfer_attention_sm90`), then our `attention_gate_bf16`.
    FlashInferSm90,
}

/// How [`crate::ModelOps`] picks the attention kernel (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionRequest {
    #[default]
    Auto,
    /// Always our CUDA-core and WMMA kernels (the fallback).
    Ours,
    /// Our tensor-core decode (an error for prefill-shaped batches, other
    /// head dims or GQA groups above 8).
    DecodeTensorCore,
    /// Always FA3 (an error where it cannot run).
    FlashInferSm90,
}

/// FA3 on this device: present when the GPU is SM 9.0 and the request is
/// not [`AttentionRequest::Ours`].
pub(crate) struct Fa3 {
    sm_count: i32,
}

/// Checks the device and the linked launcher for `request`.
pub(crate) fn probe(
    stream: &Arc<CudaStream>,
    request: AttentionRequest,
) -> Result<Option<Fa3>, GdnError> {
    let ctx = stream.context();
    let cc = ctx.compute_capability().during(OP)?;
    let sm90 = cc == (9, 0);
    match (request, sm90) {
        (AttentionRequest::Ours | AttentionRequest::DecodeTensorCore, _)
        | (AttentionRequest::Auto, false) => return Ok(None),
        (AttentionRequest::FlashInferSm90, false) => {
            return Err(Ineligible::new(
                FA3,
                format!(
                    "compute capability {}.{}: the bundle ships FlashInfer's FA3 attention for sm_90a only",
                    cc.0, cc.1
                ),
            )
            .into_error(OP))
        }
        _ => {}
    }
    ATTENTION.check_abi(OP)?;
    let sm_count = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .during(OP)?;
    Ok(Some(Fa3 { sm_count }))
}

/// Why FA3 cannot take this batch, or `None` when it can.
fn fa3_refusal(head_dim: usize, total_q: usize, num_seqs: usize) -> Option<String> {
    let tiles_per_head = total_q.div_ceil(ffi::GDN_ATTENTION_CTA_Q) + num_seqs.max(1) - 1;
    if head_dim != ffi::GDN_ATTENTION_HEAD_DIM {
        Some(format!(
            "head dim {head_dim}: the bundle's FA3 attention is instantiated for {} only",
            ffi::GDN_ATTENTION_HEAD_DIM
        ))
    } else if tiles_per_head > ffi::GDN_ATTENTION_MAX_WORKS_PER_HEAD {
        Some(format!(
            "{tiles_per_head} query tiles per head (over {}): FlashInfer's schedule for that is not shipped",
            ffi::GDN_ATTENTION_MAX_WORKS_PER_HEAD
        ))
    } else {
        None
    }
}

/// The backend name of our tensor-core decode in errors.
const DECODE_TC: &str = "attention_decode_tc";
/// The head dim and the largest GQA group the tensor-core decode serves.
pub(crate) const DECODE_TC_HEAD_DIM: usize = 256;
pub(crate) const DECODE_TC_MAX_GROUP: usize = 8;

/// Why the tensor-core decode cannot take this batch, or `None`.
fn decode_tc_refusal(
    head_dim: usize,
    group: usize,
    total_q: usize,
    num_seqs: usize,
) -> Option<String> {
    if total_q != num_seqs {
        Some(format!(
            "{total_q} query tokens for {num_seqs} sequences: the tensor-core decode takes one token a sequence"
        ))
    } else if head_dim != DECODE_TC_HEAD_DIM {
        Some(format!(
            "head dim {head_dim}: the tensor-core decode is built for {DECODE_TC_HEAD_DIM} only"
        ))
    } else if group == 0 || group > DECODE_TC_MAX_GROUP {
        Some(format!(
            "GQA group {group}: the tensor-core decode serves 1 to {DECODE_TC_MAX_GROUP}"
        ))
    } else {
        None
    }
}

/// The rule of the module doc, on plain values (`group`: query heads per
/// KV head).
fn rule(
    request: AttentionRequest,
    fa3_available: bool,
    head_dim: usize,
    group: usize,
    total_q: usize,
    num_seqs: usize,
) -> Result<AttentionKernel, Ineligible> {
    let refusal = fa3_refusal(head_dim, total_q, num_seqs);
    let decode_refusal = decode_tc_refusal(head_dim, group, total_q, num_seqs);
    match request {
        AttentionRequest::Ours => Ok(AttentionKernel::Ours),
        AttentionRequest::DecodeTensorCore => match decode_refusal {
            None => Ok(AttentionKernel::DecodeTensorCore),
            Some(why) => Err(Ineligible::new(DECODE_TC, why)),
        },
        AttentionRequest::FlashInferSm90 => match refusal {
            None if fa3_available => Ok(AttentionKernel::FlashInferSm90),
            None => Err(Ineligible::new(FA3, "FA3 was not set up for these ops")),
            Some(why) => Err(Ineligible::new(FA3, why)),
        },
        AttentionRequest::Auto => {
            let prefill_shaped = total_q > num_seqs;
            Ok(if fa3_available && prefill_shaped && refusal.is_none() {
                AttentionKernel::FlashInferSm90
            } else if decode_refusal.is_none() {
                AttentionKernel::DecodeTensorCore
            } else {
                AttentionKernel::Ours
            })
        }
    }
}

pub(crate) fn choose(
    request: AttentionRequest,
    fa3: Option<&Fa3>,
    batch: &DeviceBatch,
    head_dim: usize,
    group: usize,
) -> Result<AttentionKernel, GdnError> {
    rule(
        request,
        fa3.is_some(),
        head_dim,
        group,
        batch.num_tokens,
        batch.num_seqs,
    )
    .map_err(|why| why.into_error(OP))
}

/// Enqueues FA3 over the batch: `out = softmax(q k^T * scale) v`, ungated,
/// `[T, Hq, 256]`. Lengths were checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    fa3: &Fa3,
    stream: &Arc<CudaStream>,
    batch: &DeviceBatch,
    q_heads: usize,
    kv_heads: usize,
    q: &CudaSlice<bf16>,
    k_cache: &CudaSlice<bf16>,
    v_cache: &CudaSlice<bf16>,
    out: &mut CudaSlice<bf16>,
    scale: f32,
) -> Result<(), GdnError> {
    let qo_indptr: Vec<i32> = batch.host_cu_seqlens.iter().map(|&x| x as i32).collect();
    let kv_len = &batch.host_kv_lens;
    let int = |what: &'static str, x: usize| {
        i32::try_from(x).map_err(|_| invalid(OP, what, format!("{x} exceeds i32")))
    };
    let (num_seqs, hq, hkv) = (
        int("batch", batch.num_seqs)?,
        int("q_heads", q_heads)?,
        int("kv_heads", kv_heads)?,
    );
    let (page_size, max_blocks) = (
        int("batch.page_size", batch.page_size)?,
        int("batch.max_blocks", batch.max_blocks)?,
    );
    // SAFETY: pure function of its arguments.
    let bytes = unsafe {
        ffi::gdn_attention_sm90_workspace_bytes(batch.num_tokens as i64, num_seqs, hq, fa3.sm_count)
    } as usize;
    // SAFETY: the launcher's copy of the schedule writes it on the stream
    // before the kernel reads it; freed on the stream after the kernel.
    let mut workspace = unsafe { stream.alloc::<u8>(bytes.max(1)) }.during(OP)?;
    let (qp, _q) = q.device_ptr(stream);
    let (kp, _k) = k_cache.device_ptr(stream);
    let (vp, _v) = v_cache.device_ptr(stream);
    let (bt, _b) = batch.block_table.device_ptr(stream);
    let (op, _o) = out.device_ptr_mut(stream);
    let workspace_bytes = workspace.len() as u64;
    let (ws, _w) = workspace.device_ptr_mut(stream);
    let args = ffi::GdnAttentionArgs {
        abi_version: ffi::GDN_ATTENTION_ABI_VERSION,
        struct_size: std::mem::size_of::<ffi::GdnAttentionArgs>() as u32,
        out: op as *mut c_void,
        q: qp as *const c_void,
        k_cache: kp as *const c_void,
        v_cache: vp as *const c_void,
        block_table: bt as *const i32,
        qo_indptr: qo_indptr.as_ptr(),
        kv_len: kv_len.as_ptr(),
        workspace: ws as *mut c_void,
        workspace_bytes,
        num_seqs,
        num_qo_heads: hq,
        num_kv_heads: hkv,
        page_size,
        max_blocks,
        sm_scale: scale,
        stream: stream.cu_stream() as *mut c_void,
    };
    stream.context().bind_to_thread().during(OP)?;
    // SAFETY: device pointers are live allocations of this context whose
    // lengths the caller checked against the batch (q and out [T, Hq, 256],
    // pools covering every page of the block table, which `DeviceBatch`
    // checked covers each sequence's keys); out and q are distinct Rust
    // borrows; the host arrays hold N + 1 and N entries and outlive the call
    // (the launcher copies what it needs before returning).
    ATTENTION.check(OP, unsafe { ffi::gdn_attention_sm90(&args) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_fa3_for_prefill_shaped_batches_it_supports() {
        use AttentionKernel::*;
        let auto = |avail, d, t, n| rule(AttentionRequest::Auto, avail, d, 4, t, n).unwrap();
        assert_eq!(auto(true, 256, 8192, 1), FlashInferSm90);
        // A chunk mixed with decode rows is prefill-shaped.
        assert_eq!(auto(true, 256, 70, 8), FlashInferSm90);
        // Decode: one token a sequence, on the tensor-core decode at head
        // dim 256 and groups up to 8, on every GPU.
        assert_eq!(auto(true, 256, 64, 64), DecodeTensorCore);
        assert_eq!(auto(false, 256, 1, 1), DecodeTensorCore);
        for group in 1..=8 {
            let k = rule(AttentionRequest::Auto, false, 256, group, 3, 3).unwrap();
            assert_eq!(k, DecodeTensorCore, "group {group}");
        }
        assert_eq!(
            rule(AttentionRequest::Auto, true, 256, 12, 3, 3).unwrap(),
            Ours
        );
        assert_eq!(auto(true, 128, 64, 64), Ours);
        assert_eq!(auto(false, 32, 2, 2), Ours);
        // Not SM90, another head dim, too many tiles.
        assert_eq!(auto(false, 256, 8192, 1), Ours);
        assert_eq!(auto(true, 128, 8192, 1), Ours);
        assert_eq!(auto(true, 256, 4096 * 128 + 1, 1), Ours);
        assert_eq!(auto(true, 256, 4096 * 128, 1), FlashInferSm90);
    }

    #[test]
    fn forcing_a_kernel_it_cannot_run_is_an_error() {
        let force = |avail, d, t, n| rule(AttentionRequest::FlashInferSm90, avail, d, 4, t, n);
        assert_eq!(force(true, 256, 4, 4), Ok(AttentionKernel::FlashInferSm90));
        let e = force(true, 64, 100, 1).unwrap_err();
        assert_eq!(e.backend, FA3);
        assert!(e.reason.contains("head dim 64"), "{e}");
        assert!(force(false, 256, 100, 1)
            .unwrap_err()
            .reason
            .contains("not set up"));
        let e = force(true, 256, 4096 * 128, 2).unwrap_err();
        assert!(e.reason.contains("4097 query tiles"), "{e}");
        let ours = rule(AttentionRequest::Ours, true, 256, 4, 8192, 1);
        assert_eq!(ours, Ok(AttentionKernel::Ours));
        let ours = rule(AttentionRequest::Ours, true, 256, 4, 16, 16);
        assert_eq!(ours, Ok(AttentionKernel::Ours));
        let tc = |d, g, t, n| rule(AttentionRequest::DecodeTensorCore, true, d, g, t, n);
        assert_eq!(tc(256, 8, 5, 5), Ok(AttentionKernel::DecodeTensorCore));
        for (d, g, t, n, why) in [
            (256, 4, 9, 8, "9 query tokens for 8 sequences"),
            (128, 4, 8, 8, "head dim 128"),
            (256, 12, 8, 8, "GQA group 12"),
        ] {
            let e = tc(d, g, t, n).unwrap_err();
            assert_eq!(e.backend, DECODE_TC);
            assert!(e.reason.contains(why), "{e}");
        }
    }
}
