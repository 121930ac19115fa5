//! Building a [`GpuModel`] from a weight source: the context set up for one
//! stream, the kernels (so an unsupported shape is refused before any
//! upload), then the weights, layer by layer.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gdn_kernels::{
    AttentionShape, DeltaNetShape, GdnGeometry, GdnPrefill, Gemm, ModelOps, MoePath,
};

use super::load::WeightSource;
use super::mlp::Mlp;
use super::{
    keep_pool_memory, moe_shape, shapes, DeltaNetLayer, GpuModel, GpuOptions, Layer, Mixer,
    NEXT_MODEL_ID,
};
use crate::config::{Config, LayerType};
use crate::error::{DeviceError, LoadError};
use crate::timing::PhaseTimes;

impl GpuModel {
    pub(super) fn build(
        config: Config,
        src: &mut dyn WeightSource,
        stream: Arc<CudaStream>,
        options: GpuOptions,
        mut phases: PhaseTimes,
    ) -> Result<GpuModel, LoadError> {
        let c = &config;
        let (dn, attn) = shapes(c)?;
        let moe = moe_shape(c)?;
        let state_dtype = options.state_dtype.resolve(c.mamba_ssm_dtype);
        use_one_stream(&stream)?;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let (ops, gemm, gdn) = init_kernels(&stream, options, h, dn, attn, &mut phases)?;
        let upload_start = std::time::Instant::now();
        let embed = src.matrix(&[("model.embed_tokens.weight", v)], h)?;
        let (layers, n_linear, n_full) = load_layers(src, c, dn, attn)?;
        let norm = src.vector("model.norm.weight", &[h])?;
        let lm_head = if c.tie_word_embeddings || !src.contains("lm_head.weight") {
            None
        } else {
            Some(src.matrix(&[("lm_head.weight", v)], h)?)
        };
        let inv_freq = stream.clone_htod(&rope_inv_freq(c))?;
        // The copies are asynchronous: the upload ends when they are done.
        stream.synchronize()?;
        phases.push("weights_upload", upload_start.elapsed());
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
            state_dtype,
            moe,
            moe_path: MoePath::Auto,
            embed,
            lm_head,
            norm,
            inv_freq,
            layers,
            load_phases: phases,
            clock: None,
        })
    }
}

/// Sets the context of `stream` up for a model that lives on that one
/// stream: no cross-stream event tracking, and a memory pool that keeps
/// what it reserved.
///
/// Note for callers: this switches cudarc's event tracking off for the
/// whole context (buffers allocated afterwards on other streams of it get
/// no automatic cross-stream ordering either).
fn use_one_stream(stream: &Arc<CudaStream>) -> Result<(), DeviceError> {
    // cudarc gives every buffer allocated while event tracking is on two
    // CUDA events (created with it, destroyed with it) for cross-stream
    // ordering: four driver calls per activation buffer, about 1300 per
    // decode step. The model, its caches and its activations live on one
    // stream, so the tracking buys nothing here.
    // SAFETY: every buffer the model allocates is used only on `stream`
    // (weights, caches, activations, the ops' own buffers).
    unsafe { stream.context().disable_event_tracking() };
    keep_pool_memory(stream)
}

/// The model kernels, cuBLAS and the GDN prefill op, each load timed in
/// `phases`.
fn init_kernels(
    stream: &Arc<CudaStream>,
    options: GpuOptions,
    hidden: usize,
    dn: DeltaNetShape,
    attn: AttentionShape,
    phases: &mut PhaseTimes,
) -> Result<(ModelOps, Gemm, GdnPrefill), LoadError> {
    let ops = phases.time("model_kernels", || {
        ModelOps::with_attention(stream.clone(), options.attention)
    })?;
    // Refuse unsupported shapes now, not mid-step after state changed.
    ops.check_model(hidden, dn, attn)?;
    let gemm = phases.time("cublas", || Gemm::new(stream.clone()))?;
    let gdn = phases.time("gdn_prefill_init", || {
        GdnPrefill::new(
            stream.clone(),
            GdnGeometry {
                num_qk_heads: dn.qk_heads,
                num_v_heads: dn.v_heads,
                head_dim: gdn_kernels::HEAD_DIM,
            },
            options.gdn_backend,
        )
    })?;
    Ok((ops, gemm, gdn))
}

/// Every decoder layer's weights, with the numbers of DeltaNet and of
/// attention layers (each mixer's index among its kind).
fn load_layers(
    src: &mut dyn WeightSource,
    c: &Config,
    dn: DeltaNetShape,
    attn: AttentionShape,
) -> Result<(Vec<Layer>, usize, usize), LoadError> {
    let h = c.hidden_size;
    let (mut n_linear, mut n_full) = (0, 0);
    let mut layers = vec![];
    for (li, ty) in c.layer_types.iter().enumerate() {
        let p = format!("model.layers.{li}");
        let mixer = match ty {
            LayerType::Linear => {
                let m = Mixer::DeltaNet(load_deltanet(src, &p, dn, h, n_linear)?);
                n_linear += 1;
                m
            }
            LayerType::Full => {
                let m = load_attention(src, &p, attn, h, n_full)?;
                n_full += 1;
                m
            }
        };
        layers.push(Layer {
            input_norm: src.vector(&format!("{p}.input_layernorm.weight"), &[h])?,
            post_norm: src.vector(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            mixer,
            mlp: Mlp::load(src, c, li)?,
        });
    }
    Ok((layers, n_linear, n_full))
}

/// The Gated DeltaNet mixer of layer `p`, the `index`-th DeltaNet layer.
fn load_deltanet(
    src: &mut dyn WeightSource,
    p: &str,
    dn: DeltaNetShape,
    h: usize,
    index: usize,
) -> Result<DeltaNetLayer, LoadError> {
    let a = format!("{p}.linear_attn");
    let n = |s: &str| format!("{a}.{s}");
    let (hv, dv) = (dn.v_heads, gdn_kernels::HEAD_DIM);
    Ok(DeltaNetLayer {
        in_proj: src.matrix(
            &[
                (&n("in_proj_qkv.weight"), dn.conv_dim()),
                (&n("in_proj_z.weight"), hv * dv),
                (&n("in_proj_b.weight"), hv),
                (&n("in_proj_a.weight"), hv),
            ],
            h,
        )?,
        conv: src.vector(&n("conv1d.weight"), &[dn.conv_dim(), 1, dn.conv_kernel])?,
        a_log: src.vector(&n("A_log"), &[hv])?,
        dt_bias: src.vector(&n("dt_bias"), &[hv])?,
        norm: src.vector(&n("norm.weight"), &[dv])?,
        out_proj: src.matrix(&[(&n("out_proj.weight"), h)], hv * dv)?,
        index,
    })
}

/// The gated attention mixer of layer `p`, the `index`-th attention layer.
fn load_attention(
    src: &mut dyn WeightSource,
    p: &str,
    attn: AttentionShape,
    h: usize,
    index: usize,
) -> Result<Mixer, LoadError> {
    let a = format!("{p}.self_attn");
    let n = |s: &str| format!("{a}.{s}");
    let (nh, nkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    Ok(Mixer::Attention {
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
        index,
    })
}

/// RoPE's inverse frequencies: exact fp32, computed as the CPU reference
/// does.
fn rope_inv_freq(c: &Config) -> Vec<f32> {
    let rot = c.rotary_dim();
    (0..rot / 2)
        .map(|k| (1.0 / c.rope_theta.powf((2 * k) as f64 / rot as f64)) as f32)
        .collect()
}
