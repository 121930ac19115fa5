//! The bf16 GPU forward of Qwen3.5: cuBLAS GEMMs, our model kernels and the
//! GDN prefill op from `gdn_kernels`, state in slots and a paged KV cache
//! addressed by the caller's ids ([`GpuCache`]). One [`GpuModel::step`] runs
//! one forward over caller-built rows ([`Row`]): rows of one token take the
//! recurrent decode step in place on their slots, longer rows the GDN
//! prefill op, both in the same step; the lm_head runs only on rows that
//! want logits. Decode-only steps can replay CUDA graphs captured up front
//! for padded batch sizes ([`GpuModel::capture_decode_graphs`]).

mod arena;
mod arena_layout;
mod build;
mod cache;
mod capture;
mod graphs;
mod layers;
mod load;
mod mlp;
mod plan;
mod step;
mod timing;
mod upload;
mod vmm;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice};
use gdn_kernels::{
    AttentionRequest, AttentionShape, Backend, BackendRequest, DeltaNetShape, DeltaNetWeights,
    GdnPrefill, Gemm, GemmShape, ModelOps, MoePath, MoeScratch, MoeShape,
};
use half::bf16;

pub(crate) use arena::Kind as ArenaKind;
pub(crate) use arena_layout::ArenaLayout;
pub use cache::{GpuCache, SlotState};
use cudarc::driver::sys;
/// The stream type of [`GpuModel::default_stream`], for callers that hold one
/// without depending on cudarc themselves.
pub use cudarc::driver::CudaStream;
use load::{Checkpoint, Random};
use mlp::Mlp;
pub use plan::Row;
use plan::{Batches, LogitsPlan};
pub use step::{HostLogits, LogitsTo};
pub use timing::ForwardTiming;
use timing::StepClock;

use crate::config::Config;
pub use crate::error::StepError;
use crate::error::{DeviceError, LoadError, RunError};
pub use crate::row_logits::RowLogits;
use crate::state_dtype::{StateDtype, StateDtypeRequest};
use crate::timing::PhaseTimes;
use crate::weights::Weights;

/// Options of the GPU model.
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    /// GDN prefill backend (Auto: the CuTe DSL SM90 kernels on SM90, context-parallel
    /// per call; the portable kernel elsewhere; see gdn_kernels::dispatch).
    pub gdn_backend: BackendRequest,
    /// Attention kernels (Auto: FA3 for prefill-shaped batches on SM90, the
    /// tensor-core decode for decode batches; see gdn_kernels'
    /// attention_select). Benchmarks force one to compare whole steps.
    pub attention: AttentionRequest,
    /// How the DeltaNet recurrent state is stored (`Auto`: the config's
    /// `mamba_ssm_dtype`; see [`crate::state_dtype`]).
    pub state_dtype: StateDtypeRequest,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            gdn_backend: BackendRequest::Auto,
            attention: AttentionRequest::Auto,
            state_dtype: StateDtypeRequest::Auto,
        }
    }
}

struct DeltaNetLayer {
    /// Fused `[q | k | v | z | b | a]` input projection.
    in_proj: CudaSlice<bf16>,
    conv: CudaSlice<f32>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    norm: CudaSlice<f32>,
    out_proj: CudaSlice<bf16>,
    /// Index among the DeltaNet layers (state buffers).
    index: usize,
}

impl DeltaNetLayer {
    /// The weights the conv, gates and output norm read.
    fn weights(&self) -> DeltaNetWeights<'_> {
        DeltaNetWeights {
            conv: &self.conv,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm: &self.norm,
        }
    }
}

enum Mixer {
    DeltaNet(DeltaNetLayer),
    Attention {
        /// Fused `[q_h | gate_h ... | k | v]` projection.
        qkv: CudaSlice<bf16>,
        q_norm: CudaSlice<f32>,
        k_norm: CudaSlice<f32>,
        o_proj: CudaSlice<bf16>,
        index: usize,
    },
}

struct Layer {
    input_norm: CudaSlice<f32>,
    post_norm: CudaSlice<f32>,
    mixer: Mixer,
    mlp: Mlp,
}

impl Layer {
    /// This layer's DeltaNet mixer; only called for DeltaNet layers.
    fn deltanet(&self) -> &DeltaNetLayer {
        match &self.mixer {
            Mixer::DeltaNet(layer) => layer,
            Mixer::Attention { .. } => unreachable!("called for DeltaNet layers"),
        }
    }
}

/// Source of [`GpuModel`] identities (a cache belongs to one model).
static NEXT_MODEL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub struct GpuModel {
    pub config: Config,
    /// Identity checked against the caches' (their state layout and captured
    /// graphs belong to the model that made them).
    id: u64,
    stream: Arc<CudaStream>,
    ops: ModelOps,
    gemm: Gemm,
    gdn: GdnPrefill,
    dn: DeltaNetShape,
    attn: AttentionShape,
    /// How its caches store the recurrent state.
    state_dtype: StateDtype,
    /// The routed experts' shape of a MoE model.
    moe: Option<MoeShape>,
    /// The routed experts' kernels (default `Auto`: the op's rule).
    moe_path: MoePath,
    embed: CudaSlice<bf16>,
    lm_head: Option<CudaSlice<bf16>>,
    norm: CudaSlice<f32>,
    inv_freq: CudaSlice<f32>,
    layers: Vec<Layer>,
    /// Where the load's time went (kernel modules, cuBLAS, uploads).
    load_phases: PhaseTimes,
    /// Step timing (the request timeline): `None` unless turned on.
    clock: Option<StepClock>,
}

/// An activation buffer the next op overwrites completely (every producer
/// here — GEMM, embedding, norm, conv, attention, GDN, state copy — writes
/// all of its output), so it is not zeroed: a memset per buffer would double
/// the launches of a decode step.
pub(crate) fn scratch<T: cudarc::driver::DeviceRepr>(
    s: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>, DeviceError> {
    // SAFETY: see above; no op reads a buffer before its producer wrote it.
    Ok(unsafe { s.alloc::<T>(n) }?)
}

/// Lets the device's memory pool keep what it reserved. Activations are
/// stream-ordered allocations (`cuMemAllocAsync` from the device's current
/// pool), and a pool's release threshold is 0 by default: at every
/// synchronisation (each step waits for its sampled tokens) the pool hands
/// all its free memory back to the driver, so the next step reserves and
/// maps its activations again (hundreds of MB for a long prefill chunk).
/// With no threshold the pool keeps at most the largest step's
/// activations, which the server's page-pool sizing already leaves free
/// (its activation reserve).
pub fn keep_pool_memory(stream: &CudaStream) -> Result<(), DeviceError> {
    let mut threshold: u64 = u64::MAX;
    // SAFETY: a plain driver call on the pool of this context's device;
    // `threshold` outlives it.
    unsafe {
        sys::cuMemPoolSetAttribute(
            device_pool(stream)?,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()?;
    }
    Ok(())
}

/// The release threshold of the device's current memory pool (see
/// [`keep_pool_memory`]).
pub fn pool_release_threshold(stream: &CudaStream) -> Result<u64, DeviceError> {
    let mut threshold: u64 = 0;
    // SAFETY: as in keep_pool_memory.
    unsafe {
        sys::cuMemPoolGetAttribute(
            device_pool(stream)?,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()?;
    }
    Ok(threshold)
}

/// The current memory pool of the device of `stream`'s context (bound to
/// this thread first).
fn device_pool(stream: &CudaStream) -> Result<sys::CUmemoryPool, DeviceError> {
    let ctx = stream.context();
    ctx.bind_to_thread()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a plain driver call on this context's device; `pool` outlives it.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()).result()? };
    Ok(pool)
}

fn shapes(c: &Config) -> Result<(DeltaNetShape, AttentionShape), LoadError> {
    if c.linear_key_head_dim != gdn_kernels::HEAD_DIM
        || c.linear_value_head_dim != gdn_kernels::HEAD_DIM
    {
        return Err(LoadError::UnsupportedConfig(format!(
            "the GPU runtime needs DeltaNet head dims of {} (got k {}, v {})",
            gdn_kernels::HEAD_DIM,
            c.linear_key_head_dim,
            c.linear_value_head_dim
        )));
    }
    Ok((
        DeltaNetShape {
            qk_heads: c.linear_num_key_heads,
            v_heads: c.linear_num_value_heads,
            conv_kernel: c.linear_conv_kernel_dim,
        },
        AttentionShape {
            q_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            rotary_dim: c.rotary_dim(),
        },
    ))
}

/// The routed experts' shape of a MoE config, refused before any device
/// work where the MoE kernels cannot run it.
fn moe_shape(c: &Config) -> Result<Option<MoeShape>, LoadError> {
    c.moe
        .map(|m| {
            let shape = mlp::moe_shape(&m, c.hidden_size);
            shape.check().map(|()| shape)
        })
        .transpose()
        .map_err(|e| LoadError::UnsupportedConfig(format!("{}: {e}", c.architecture())))
}

/// Device bytes a step of `tokens` tokens holds beyond a dense model's
/// activations: a MoE model's routing scratch and permuted expert rows
/// (0 for a dense model or a config the MoE kernels refuse). For memory
/// sizing next to the activation reserve.
pub fn moe_step_bytes(c: &Config, tokens: usize) -> usize {
    match moe_shape(c) {
        Ok(Some(shape)) => {
            MoeScratch::device_bytes(shape, tokens)
                + tokens
                    * (shape.router_width()
                        + c.hidden_size
                        + c.moe.map_or(0, |m| m.shared_expert_intermediate_size))
                    * std::mem::size_of::<bf16>()
        }
        _ => 0,
    }
}

impl GpuModel {
    /// Uploads a checkpoint to the GPU of `stream`. The model runs on that one
    /// stream and turns off cudarc's cross-stream event tracking for its
    /// context (see `build`).
    pub fn load(
        config: Config,
        weights: &Weights,
        stream: Arc<CudaStream>,
        options: GpuOptions,
    ) -> Result<GpuModel, LoadError> {
        moe_shape(&config)?;
        let mut phases = PhaseTimes::default();
        let staging = phases.time("pinned_staging", || {
            upload::Staging::new(stream.clone(), upload::STAGING_ELEMS)
        })?;
        let mut src = Checkpoint {
            weights,
            stream: stream.clone(),
            staging,
        };
        Self::build(config, &mut src, stream, options, phases)
    }

    /// A model with deterministic random weights generated on the device
    /// (benchmarks of full-size models without a checkpoint).
    pub fn random(
        config: Config,
        seed: u64,
        stream: Arc<CudaStream>,
        options: GpuOptions,
    ) -> Result<GpuModel, LoadError> {
        moe_shape(&config)?;
        let ops = ModelOps::new(stream.clone())?;
        let mut src = Random { ops: &ops, seed };
        Self::build(config, &mut src, stream, options, PhaseTimes::default())
    }

    /// Turns step timing on or off: with it on, every step records CUDA
    /// events around its forward and [`GpuModel::last_forward_timing`]
    /// reports them (a few microseconds per step; off by default).
    pub fn set_step_timing(&mut self, on: bool) -> Result<(), DeviceError> {
        self.clock = match on {
            true => Some(StepClock::new(&self.stream)?),
            false => None,
        };
        Ok(())
    }

    /// The last step's timing, when step timing is on and the step ran.
    pub fn last_forward_timing(&self) -> Option<ForwardTiming> {
        self.clock.as_ref().and_then(|c| c.last)
    }

    /// Where the load's time went, phase by phase.
    pub fn load_phases(&self) -> &PhaseTimes {
        &self.load_phases
    }

    /// A new stream on CUDA device 0 (a created stream, not the legacy
    /// default one, so decode steps can be captured as CUDA graphs). An
    /// error, not a panic, on machines without a CUDA driver (the server's
    /// `--device auto` falls back to the CPU on it).
    pub fn default_stream() -> Result<Arc<CudaStream>, DeviceError> {
        // SAFETY: only probes whether libcuda can be loaded (cudarc panics
        // on first use when it cannot).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(DeviceError::NoDriver);
        }
        Ok(CudaContext::new(0)?.new_stream()?)
    }

    /// Forces the MLP's gate/up + SwiGLU route (benchmarks and tests
    /// compare the fused and unfused routes with it; default `Auto`).
    pub fn set_swiglu_request(&mut self, request: gdn_kernels::SwigluRequest) {
        self.gemm.set_swiglu_request(request);
    }

    /// Forces the MoE layers' expert kernels (benchmarks compare whole
    /// steps with it; default `Auto`). A path that cannot run a step's
    /// token count (the direct path past its bound) fails that step.
    pub fn set_moe_path(&mut self, path: MoePath) {
        self.moe_path = path;
    }

    /// Forces the attention kernels (benchmarks compare whole steps with
    /// it; default [`GpuOptions::attention`]). Graphs captured before keep
    /// the kernels they were captured with.
    pub fn set_attention_request(&mut self, request: AttentionRequest) -> Result<(), LoadError> {
        self.ops = ModelOps::with_attention(self.stream.clone(), request)?;
        Ok(())
    }

    /// The GDN prefill backend in use.
    pub fn gdn_backend(&self) -> Backend {
        self.gdn.backend()
    }

    /// The GDN prefill kernel the last prefill step ran (with `Auto` on
    /// SM90, context-parallel or not per step).
    pub fn last_gdn_backend(&self) -> Backend {
        self.gdn.last_backend()
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn layer_counts(&self) -> (usize, usize) {
        let full = self
            .layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Attention { .. }))
            .count();
        (self.layers.len() - full, full)
    }

    /// Device bytes of one state slot and of one KV page of `page_size`
    /// positions (to size a cache from free memory).
    pub fn slot_and_page_bytes(&self, page_size: usize) -> (usize, usize) {
        let (layers, dtype) = (self.layer_counts(), self.state_dtype);
        cache::slot_and_page_bytes(self.dn, self.attn, layers, page_size, dtype)
    }

    /// How the caches of this model store the recurrent state.
    pub fn state_dtype(&self) -> StateDtype {
        self.state_dtype
    }

    /// Device bytes of one slot's recurrent state (every DeltaNet layer).
    pub fn recurrent_bytes_per_slot(&self) -> usize {
        cache::recurrent_bytes(self.dn, self.layer_counts().0, self.state_dtype)
    }

    /// Device state: `num_slots` state slots and `num_pages` KV pages of
    /// `page_size` positions, all zero.
    pub fn new_cache(
        &self,
        num_slots: usize,
        num_pages: usize,
        page_size: usize,
    ) -> Result<GpuCache, LoadError> {
        if num_slots > 65_535 {
            return Err(LoadError::Sizing(format!(
                "{num_slots} state slots exceed the kernels' per-launch limit of 65535"
            )));
        }
        if num_pages > i32::MAX as usize {
            return Err(LoadError::Sizing(format!(
                "{num_pages} KV pages exceed the page table's i32 ids"
            )));
        }
        GpuCache::new(
            self.id,
            self.stream.clone(),
            self.dn,
            self.attn,
            self.layer_counts(),
            num_slots,
            num_pages,
            page_size,
            self.state_dtype,
        )
    }

    /// The device work of one step: no host transfers, so it can be captured.
    /// The logits of the plan's rows go to `logits` (`[rows, vocab]`).
    pub(crate) fn run(
        &mut self,
        cache: &mut GpuCache,
        batches: &Batches,
        which: LogitsPlan,
        logits: &mut CudaSlice<f32>,
    ) -> Result<(), RunError> {
        let batch = &batches.full;
        let (h, vocab, eps) = {
            let c = &self.config;
            (c.hidden_size, c.vocab_size, c.rms_norm_eps)
        };
        let t = batch.num_tokens();
        let s = self.stream.clone();
        // One scratch a step, shared by its MoE layers: stream-ordered like
        // the activations, so a captured decode graph owns its own.
        let mut moe = self
            .moe
            .map(|shape| MoeScratch::new(&s, shape, t.max(1)))
            .transpose()?;
        let mut residual = scratch::<bf16>(&s, t * h)?;
        self.ops.embedding(batch, &self.embed, h, &mut residual)?;
        let mut normed = scratch::<bf16>(&s, t * h)?;
        let mut delta: Option<CudaSlice<bf16>> = None;
        for li in 0..self.layers.len() {
            self.ops.add_rmsnorm(
                &mut residual,
                delta.as_ref(),
                &self.layers[li].input_norm,
                &mut normed,
                h,
                eps,
            )?;
            let mixed = if matches!(self.layers[li].mixer, Mixer::DeltaNet(_)) {
                self.deltanet(li, batches, cache, &normed)?
            } else {
                self.attention(li, batch, cache, &normed)?
            };
            let layer = &self.layers[li];
            self.ops.add_rmsnorm(
                &mut residual,
                Some(&mixed),
                &layer.post_norm,
                &mut normed,
                h,
                eps,
            )?;
            delta = Some(self.mlp(li, &normed, moe.as_mut())?);
        }
        self.ops.add_rmsnorm(
            &mut residual,
            delta.as_ref(),
            &self.norm,
            &mut normed,
            h,
            eps,
        )?;
        let n = batch.num_seqs();
        let (rows, lo, hi) = match which {
            LogitsPlan::None => return Ok(()),
            LogitsPlan::AllTokens => (normed, 0, t),
            LogitsPlan::LastOf(lo, hi) if t == n => (normed, lo, hi),
            LogitsPlan::LastOf(lo, hi) => {
                let mut rows = scratch::<bf16>(&s, n * h)?;
                self.ops.gather_last_tokens(batch, &normed, h, &mut rows)?;
                (rows, lo, hi)
            }
        };
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        self.gemm.linear(
            &rows.slice(lo * h..hi * h),
            head,
            logits,
            GemmShape::new(hi - lo, vocab, h),
        )?;
        Ok(())
    }
}
