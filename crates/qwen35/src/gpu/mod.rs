//! The bf16 GPU forward of Qwen3.5: cuBLAS GEMMs, our model kernels and the
//! GDN prefill op from `gdn_kernels`, state in fixed per-sequence slots, a
//! paged KV cache. One `forward` call runs one step for a batch of sequences:
//! a packed varlen prefill (any token counts; DeltaNet through `GdnPrefill`)
//! or, when every sequence brings exactly one token, a decode step (DeltaNet
//! through the recurrent kernel on the state slots).

mod cache;
mod load;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gdn_kernels::{
    AttentionShape, Backend, BackendRequest, BatchLayout, DeltaNetInputs, DeltaNetShape,
    DeviceBatch, GdnGeometry, GdnPrefill, Gemm, ModelOps, PrefillBuffers,
};
use half::bf16;

pub use cache::{GpuCache, SeqId};
use load::{Checkpoint, Random, WeightSource};

use crate::config::{Config, LayerType};
use crate::error::{Error, Result};
use crate::weights::Weights;

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token of each sequence (serving).
    LastToken,
    /// Every token (teacher-forced evaluation).
    AllTokens,
    /// The last token of each sequence, left on the device (benchmarks of
    /// the forward without the host copy); `forward` returns no rows.
    DeviceOnly,
}

/// Options of the GPU model.
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    /// GDN prefill backend (Auto: the CuTe DSL SM90 kernels on SM90, context-parallel
    /// per call; the portable kernel elsewhere; see gdn_kernels::dispatch).
    pub gdn_backend: BackendRequest,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            gdn_backend: BackendRequest::Auto,
        }
    }
}

enum Mixer {
    DeltaNet {
        /// Fused `[q | k | v | z | b | a]` input projection.
        in_proj: CudaSlice<bf16>,
        conv: CudaSlice<f32>,
        a_log: CudaSlice<f32>,
        dt_bias: CudaSlice<f32>,
        norm: CudaSlice<f32>,
        out_proj: CudaSlice<bf16>,
        /// Index among the DeltaNet layers (state buffers).
        index: usize,
    },
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
    /// Fused `[gate | up]`.
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
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
    embed: CudaSlice<bf16>,
    lm_head: Option<CudaSlice<bf16>>,
    norm: CudaSlice<f32>,
    inv_freq: CudaSlice<f32>,
    layers: Vec<Layer>,
}

/// An activation buffer the next op overwrites completely (every producer
/// here — GEMM, embedding, norm, conv, attention, GDN, state copy — writes
/// all of its output), so it is not zeroed: a memset per buffer would double
/// the launches of a decode step.
fn scratch<T: cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: see above; no op reads a buffer before its producer wrote it.
    Ok(unsafe { s.alloc::<T>(n) }?)
}

fn shapes(c: &Config) -> Result<(DeltaNetShape, AttentionShape)> {
    if c.linear_key_head_dim != gdn_kernels::HEAD_DIM
        || c.linear_value_head_dim != gdn_kernels::HEAD_DIM
    {
        return Err(Error::UnsupportedConfig(format!(
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

impl GpuModel {
    /// Uploads a checkpoint to the GPU of `stream`. The model runs on that one
    /// stream and turns off cudarc's cross-stream event tracking for its
    /// context (see `build`).
    pub fn load(
        config: Config,
        weights: &Weights,
        stream: Arc<CudaStream>,
        options: GpuOptions,
    ) -> Result<GpuModel> {
        let mut src = Checkpoint {
            weights,
            stream: stream.clone(),
        };
        Self::build(config, &mut src, stream, options)
    }

    /// A model with deterministic random weights generated on the device
    /// (benchmarks of full-size models without a checkpoint).
    pub fn random(
        config: Config,
        seed: u64,
        stream: Arc<CudaStream>,
        options: GpuOptions,
    ) -> Result<GpuModel> {
        let ops = ModelOps::new(stream.clone())?;
        let mut src = Random { ops: &ops, seed };
        Self::build(config, &mut src, stream, options)
    }

    fn build(
        config: Config,
        src: &mut dyn WeightSource,
        stream: Arc<CudaStream>,
        options: GpuOptions,
    ) -> Result<GpuModel> {
        let c = &config;
        let (dn, attn) = shapes(c)?;
        // Note for callers: this switches cudarc's event tracking off for the
        // whole context (buffers allocated afterwards on other streams of it
        // get no automatic cross-stream ordering either).
        // cudarc gives every buffer allocated while event tracking is on two
        // CUDA events (created with it, destroyed with it) for cross-stream
        // ordering: four driver calls per activation buffer, about 1300 per
        // decode step. The model, its caches and its activations live on one
        // stream, so the tracking buys nothing here.
        // SAFETY: every buffer the model allocates is used only on `stream`
        // (weights, caches, activations, the ops' own buffers).
        unsafe { stream.context().disable_event_tracking() };
        let (h, v, i) = (c.hidden_size, c.vocab_size, c.intermediate_size);
        let ops = ModelOps::new(stream.clone())?;
        // Refuse unsupported shapes now, not mid-step after state changed.
        ops.check_model(h, dn, attn)?;
        let gemm = Gemm::new(stream.clone())?;
        let gdn = GdnPrefill::new(
            stream.clone(),
            GdnGeometry {
                num_qk_heads: dn.qk_heads,
                num_v_heads: dn.v_heads,
                head_dim: gdn_kernels::HEAD_DIM,
            },
            options.gdn_backend,
        )?;
        let embed = src.matrix(&[("model.embed_tokens.weight", v)], h)?;
        let (mut n_linear, mut n_full) = (0, 0);
        let mut layers = vec![];
        for (li, ty) in c.layer_types.iter().enumerate() {
            let p = format!("model.layers.{li}");
            let mixer = match ty {
                LayerType::Linear => {
                    let a = format!("{p}.linear_attn");
                    let n = |s: &str| format!("{a}.{s}");
                    let (hv, dv) = (dn.v_heads, gdn_kernels::HEAD_DIM);
                    let m = Mixer::DeltaNet {
                        in_proj: src.matrix(
                            &[
                                (&n("in_proj_qkv.weight"), dn.conv_dim()),
                                (&n("in_proj_z.weight"), hv * dv),
                                (&n("in_proj_b.weight"), hv),
                                (&n("in_proj_a.weight"), hv),
                            ],
                            h,
                        )?,
                        conv: src
                            .vector(&n("conv1d.weight"), &[dn.conv_dim(), 1, dn.conv_kernel])?,
                        a_log: src.vector(&n("A_log"), &[hv])?,
                        dt_bias: src.vector(&n("dt_bias"), &[hv])?,
                        norm: src.vector(&n("norm.weight"), &[dv])?,
                        out_proj: src.matrix(&[(&n("out_proj.weight"), h)], hv * dv)?,
                        index: n_linear,
                    };
                    n_linear += 1;
                    m
                }
                LayerType::Full => {
                    let a = format!("{p}.self_attn");
                    let n = |s: &str| format!("{a}.{s}");
                    let (nh, nkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
                    let m = Mixer::Attention {
                        qkv: src.matrix(
                            &[
                                (&n("q_proj.weight"), nh * d * 2),
                                (&n("k_proj.weight"), nkv * d),
                                (&n("v_proj.weight"), nkv * d),
                            ],
                            h,
                        )?,
                        q_norm: src.vector(&n("q_norm.weight"), &[d])?,
                        k_norm: src.vector(&n("k_norm.weight"), &[d])?,
                        o_proj: src.matrix(&[(&n("o_proj.weight"), h)], nh * d)?,
                        index: n_full,
                    };
                    n_full += 1;
                    m
                }
            };
            layers.push(Layer {
                input_norm: src.vector(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_norm: src.vector(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mixer,
                gate_up: src.matrix(
                    &[
                        (&format!("{p}.mlp.gate_proj.weight"), i),
                        (&format!("{p}.mlp.up_proj.weight"), i),
                    ],
                    h,
                )?,
                down: src.matrix(&[(&format!("{p}.mlp.down_proj.weight"), h)], i)?,
            });
        }
        let norm = src.vector("model.norm.weight", &[h])?;
        let lm_head = if c.tie_word_embeddings || !src.contains("lm_head.weight") {
            None
        } else {
            Some(src.matrix(&[("lm_head.weight", v)], h)?)
        };
        // Exact fp32 frequencies, computed as the CPU reference does.
        let rot = c.rotary_dim();
        let freqs: Vec<f32> = (0..rot / 2)
            .map(|k| (1.0 / c.rope_theta.powf((2 * k) as f64 / rot as f64)) as f32)
            .collect();
        let inv_freq = stream.clone_htod(&freqs)?;
        log::info!(
            "qwen35 gpu: {} layers ({n_linear} DeltaNet, {n_full} attention), GDN prefill on {}, model kernels sm_{}",
            layers.len(),
            gdn.backend(),
            ops.cubin_sm()
        );
        Ok(GpuModel {
            id: NEXT_MODEL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            config,
            stream,
            ops,
            gemm,
            gdn,
            dn,
            attn,
            embed,
            lm_head,
            norm,
            inv_freq,
            layers,
        })
    }

    /// A new stream on CUDA device 0 (a created stream, not the legacy
    /// default one, so decode steps can be captured as CUDA graphs).
    pub fn default_stream() -> Result<Arc<CudaStream>> {
        Ok(CudaContext::new(0)?.new_stream()?)
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

    /// State for up to `max_sequences` live sequences and `num_pages` KV pages
    /// of `page_size` positions.
    pub fn new_cache(
        &self,
        max_sequences: usize,
        num_pages: usize,
        page_size: usize,
    ) -> Result<GpuCache> {
        let full = self
            .layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Attention { .. }))
            .count();
        if max_sequences > 65_535 {
            return Err(Error::InvalidInput(format!(
                "{max_sequences} sequence slots exceed the kernels' per-launch limit of 65535"
            )));
        }
        GpuCache::new(
            self.id,
            self.stream.clone(),
            self.dn,
            self.attn,
            (self.layers.len() - full, full),
            max_sequences,
            num_pages,
            page_size,
        )
    }

    /// Runs one step: each sequence's tokens after what it has seen. Returns
    /// f32 logits, `[rows][vocab]`: one row per sequence (`LastToken`) or per
    /// token in batch order (`AllTokens`). A refused step (another model's
    /// cache, unknown or repeated sequence, no tokens, token id out of range,
    /// not enough free KV pages) changes nothing. A failure once kernels run
    /// leaves the step's sequences in an undefined state (and the pages
    /// reserved for the step attached to them): release them. Decode steps
    /// replay a captured CUDA graph when the cache has graphs enabled
    /// ([`GpuCache::enable_decode_graphs`]).
    pub fn forward(
        &mut self,
        cache: &mut GpuCache,
        step: &[(SeqId, &[u32])],
        which: Logits,
    ) -> Result<Vec<Vec<f32>>> {
        if cache.model_id != self.id {
            return Err(Error::InvalidInput(
                "this cache was made by another model (use the model's own new_cache)".into(),
            ));
        }
        let mut layout = self.prepare(cache, step)?;
        let s = self.stream.clone();
        let decode = step.iter().all(|(_, t)| t.len() == 1);
        let v = self.config.vocab_size;
        let eager;
        let logits = match (decode, cache.graph_page_width) {
            (true, Some(width)) if layout.max_blocks <= width => {
                // The graph writes into its own logits buffer; read it there.
                let n = self.replay_decode(cache, &mut layout, width)?;
                &cache.graphs[&n].logits
            }
            _ => {
                let batch = DeviceBatch::upload(&s, &layout)?;
                let rows = match which {
                    Logits::AllTokens => batch.num_tokens(),
                    _ => batch.num_seqs(),
                };
                let mut logits = scratch::<f32>(&s, rows * v)?;
                self.run(cache, &batch, which, &mut logits)?;
                eager = logits;
                &eager
            }
        };
        let host = if which == Logits::DeviceOnly {
            s.synchronize()?;
            None
        } else {
            Some(s.clone_dtoh(logits)?)
        };
        for (id, toks) in step {
            cache.seqs.get_mut(id).expect("prepared").len += toks.len();
        }
        Ok(host.map_or_else(Vec::new, |h| {
            h.chunks_exact(v).map(<[f32]>::to_vec).collect()
        }))
    }

    /// A decode step through the cache's graph for this batch size: the
    /// batch buffers are rewritten in place and the graph replayed; the
    /// first step of a batch size captures it. Returns the batch size, the
    /// key of the graph whose logits buffer holds the result.
    fn replay_decode(
        &mut self,
        cache: &mut GpuCache,
        layout: &mut BatchLayout,
        width: usize,
    ) -> Result<usize> {
        let s = self.stream.clone();
        let n = layout.slots.len();
        // Fixed page-table width: the captured kernels take it by value.
        let mut table = Vec::with_capacity(n * width);
        for row in layout.block_table.chunks(layout.max_blocks) {
            table.extend(row.iter().copied().chain(std::iter::repeat(-1)).take(width));
        }
        layout.block_table = table;
        layout.max_blocks = width;
        if let Some(g) = cache.graphs.get_mut(&n) {
            g.batch.update(&s, layout)?;
            g.graph.launch()?;
            return Ok(n);
        }
        let mut batch = DeviceBatch::upload(&s, layout)?;
        // Bounds = the cache's capacity, so any later decode step of n
        // sequences fits the captured graph.
        batch.widen_bounds(
            cache.max_sequences() - 1,
            cache.num_pages() - 1,
            width * cache.page_size - 1,
            self.config.vocab_size - 1,
        );
        let mut logits = scratch::<f32>(&s, n * self.config.vocab_size)?;
        s.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        let captured = self.run(cache, &batch, Logits::LastToken, &mut logits);
        // End the capture whatever happened, so the stream is usable again.
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        captured?;
        let graph = graph?.ok_or_else(|| Error::Gpu("stream capture produced no graph".into()))?;
        graph.launch()?;
        cache.graphs.insert(
            n,
            cache::DecodeGraph {
                graph,
                batch,
                logits,
            },
        );
        Ok(n)
    }

    /// The device work of one step: no host transfers, so it can be captured.
    fn run(
        &mut self,
        cache: &mut GpuCache,
        batch: &DeviceBatch,
        which: Logits,
        logits: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (h, inter, vocab, eps) = {
            let c = &self.config;
            (
                c.hidden_size,
                c.intermediate_size,
                c.vocab_size,
                c.rms_norm_eps,
            )
        };
        let t = batch.num_tokens();
        let s = self.stream.clone();
        let mut residual = scratch::<bf16>(&s, t * h)?;
        self.ops.embedding(batch, &self.embed, h, &mut residual)?;
        let mut normed = scratch::<bf16>(&s, t * h)?;
        let mut delta: Option<CudaSlice<bf16>> = None;
        let decode = batch.num_tokens() == batch.num_seqs();
        for li in 0..self.layers.len() {
            self.ops.add_rmsnorm(
                &mut residual,
                delta.as_ref(),
                &self.layers[li].input_norm,
                &mut normed,
                h,
                eps,
            )?;
            let mixed = if matches!(self.layers[li].mixer, Mixer::DeltaNet { .. }) {
                self.deltanet(li, batch, cache, &normed, decode)?
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
            let mut gate_up = scratch::<bf16>(&s, t * 2 * inter)?;
            self.gemm
                .linear(&normed, &layer.gate_up, &mut gate_up, t, 2 * inter, h)?;
            let mut act = scratch::<bf16>(&s, t * inter)?;
            self.ops.silu_mul(&gate_up, &mut act, inter)?;
            let mut out = scratch::<bf16>(&s, t * h)?;
            self.gemm.linear(&act, &layer.down, &mut out, t, h, inter)?;
            delta = Some(out);
        }
        self.ops.add_rmsnorm(
            &mut residual,
            delta.as_ref(),
            &self.norm,
            &mut normed,
            h,
            eps,
        )?;
        let rows = match which {
            Logits::AllTokens => normed,
            _ if t == batch.num_seqs() => normed,
            _ => {
                let mut rows = scratch::<bf16>(&s, batch.num_seqs() * h)?;
                self.ops.gather_last_tokens(batch, &normed, h, &mut rows)?;
                rows
            }
        };
        let r = rows.len() / h;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        self.gemm.linear(&rows, head, logits, r, vocab, h)?;
        Ok(())
    }

    /// Checks the step, reserves KV pages and lays the batch out.
    fn prepare(&self, cache: &mut GpuCache, step: &[(SeqId, &[u32])]) -> Result<BatchLayout> {
        if step.is_empty() {
            return Err(Error::InvalidInput("empty step".into()));
        }
        for (i, (id, toks)) in step.iter().enumerate() {
            if toks.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "sequence {id:?} brings no tokens"
                )));
            }
            if step[..i].iter().any(|(other, _)| other == id) {
                return Err(Error::InvalidInput(format!(
                    "sequence {id:?} appears twice in one step"
                )));
            }
            if let Some(&bad) = toks.iter().find(|&&t| t as usize >= self.config.vocab_size) {
                return Err(Error::InvalidInput(format!(
                    "token id {bad} >= vocab_size {}",
                    self.config.vocab_size
                )));
            }
        }
        let counts: Vec<(SeqId, usize)> = step.iter().map(|(id, t)| (*id, t.len())).collect();
        cache.reserve(&counts)?;
        let seqs: Vec<_> = step.iter().map(|(id, _)| &cache.seqs[id]).collect();
        let max_blocks = seqs.iter().map(|s| s.pages.len()).max().unwrap_or(0).max(1);
        let mut layout = BatchLayout {
            tokens: step.iter().flat_map(|(_, t)| t.iter().copied()).collect(),
            cu_seqlens: vec![0],
            max_blocks,
            page_size: cache.page_size,
            ..Default::default()
        };
        for (seq, (_, toks)) in seqs.iter().zip(step) {
            let end = *layout.cu_seqlens.last().expect("starts with 0") + toks.len() as i32;
            layout.cu_seqlens.push(end);
            layout.start_positions.push(seq.len as i32);
            layout.slots.push(seq.slot as i32);
            let mut row: Vec<i32> = seq.pages.iter().map(|&p| p as i32).collect();
            row.resize(max_blocks, -1);
            layout.block_table.extend(row);
        }
        Ok(layout)
    }

    fn deltanet(
        &mut self,
        li: usize,
        batch: &DeviceBatch,
        cache: &mut GpuCache,
        x: &CudaSlice<bf16>,
        decode: bool,
    ) -> Result<CudaSlice<bf16>> {
        let Mixer::DeltaNet {
            in_proj,
            conv,
            a_log,
            dt_bias,
            norm,
            out_proj,
            index,
        } = &self.layers[li].mixer
        else {
            unreachable!("called for DeltaNet layers")
        };
        let (s, dn, c) = (&self.stream, self.dn, &self.config);
        let (t, h, d) = (batch.num_tokens(), c.hidden_size, gdn_kernels::HEAD_DIM);
        let mut proj = scratch::<bf16>(s, t * dn.proj_width())?;
        self.gemm
            .linear(x, in_proj, &mut proj, t, dn.proj_width(), h)?;
        let mut inputs = DeltaNetInputs {
            q: scratch(s, t * dn.qk_heads * d)?,
            k: scratch(s, t * dn.qk_heads * d)?,
            v: scratch(s, t * dn.v_heads * d)?,
            alpha: scratch(s, t * dn.v_heads)?,
            beta: scratch(s, t * dn.v_heads)?,
        };
        self.ops.deltanet_conv(
            batch,
            dn,
            &proj,
            conv,
            a_log,
            dt_bias,
            &mut cache.conv[*index],
            &mut inputs,
        )?;
        let scale = (d as f32).powf(-0.5);
        let mut core = scratch::<bf16>(s, t * dn.v_heads * d)?;
        let state = &mut cache.recurrent[*index];
        if decode {
            self.ops
                .deltanet_decode(batch, dn, &inputs, state, &mut core, scale)?;
        } else {
            let per = dn.recurrent_state_len();
            let mut initial = scratch::<f32>(s, batch.num_seqs() * per)?;
            self.ops.move_state(batch, state, &mut initial, per, true)?;
            let mut last = scratch::<f32>(s, batch.num_seqs() * per)?;
            self.gdn.run(
                PrefillBuffers {
                    q: &inputs.q,
                    k: &inputs.k,
                    v: &inputs.v,
                    alpha: &inputs.alpha,
                    beta: &inputs.beta,
                    cu_seqlens: batch.cu_seqlens(),
                    initial_state: Some(&initial),
                    final_state: &mut last,
                    output: &mut core,
                },
                scale,
            )?;
            self.ops.move_state(batch, state, &mut last, per, false)?;
        }
        let mut gated = scratch::<bf16>(s, t * dn.v_heads * d)?;
        self.ops
            .deltanet_out_norm(dn, &core, &proj, norm, &mut gated, c.rms_norm_eps)?;
        let mut out = scratch::<bf16>(s, t * h)?;
        self.gemm
            .linear(&gated, out_proj, &mut out, t, h, dn.v_heads * d)?;
        Ok(out)
    }

    fn attention(
        &mut self,
        li: usize,
        batch: &DeviceBatch,
        cache: &mut GpuCache,
        x: &CudaSlice<bf16>,
    ) -> Result<CudaSlice<bf16>> {
        let Mixer::Attention {
            qkv,
            q_norm,
            k_norm,
            o_proj,
            index,
        } = &self.layers[li].mixer
        else {
            unreachable!("called for attention layers")
        };
        let (s, a, c) = (&self.stream, self.attn, &self.config);
        let (t, h) = (batch.num_tokens(), c.hidden_size);
        let width = a.q_heads * a.head_dim;
        let mut proj = scratch::<bf16>(s, t * a.proj_width())?;
        self.gemm.linear(x, qkv, &mut proj, t, a.proj_width(), h)?;
        let mut q = scratch::<bf16>(s, t * width)?;
        let (keys, values) = (&mut cache.keys[*index], &mut cache.values[*index]);
        self.ops.attention_prep(
            batch,
            a,
            &proj,
            q_norm,
            k_norm,
            &self.inv_freq,
            &mut q,
            keys,
            values,
            c.rms_norm_eps,
        )?;
        let mut attn_out = scratch::<bf16>(s, t * width)?;
        self.ops
            .attention(batch, a, &q, keys, values, &proj, &mut attn_out)?;
        let mut out = scratch::<bf16>(s, t * h)?;
        self.gemm.linear(&attn_out, o_proj, &mut out, t, h, width)?;
        Ok(out)
    }
}
