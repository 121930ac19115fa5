//! The forward of one layer over a step's batches: a DeltaNet layer (fused
//! decode kernel, or conv + GDN prefill op + gated norm; decode and prefill
//! rows of one step split where both are present) and an attention layer
//! (q/k norm + RoPE + KV write, the attention op, o_proj).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gdn_kernels::{
    DeltaNetInputs, DeviceBatch, GdnPrefill, GemmShape, ModelOps, PrefillBuffers, RecurrentState,
};
use half::bf16;

use super::plan::Batches;
use super::{scratch, GpuCache, GpuModel, Mixer};
use crate::error::RunError;

impl GpuModel {
    pub(super) fn deltanet(
        &mut self,
        li: usize,
        batches: &Batches,
        cache: &mut GpuCache,
        x: &CudaSlice<bf16>,
    ) -> Result<CudaSlice<bf16>, RunError> {
        let batch = &batches.full;
        let layer = self.layers[li].deltanet();
        let (s, dn, c) = (&self.stream, self.dn, &self.config);
        let (t, h, d) = (batch.num_tokens(), c.hidden_size, gdn_kernels::HEAD_DIM);
        let mut proj = scratch::<bf16>(s, t * dn.proj_width())?;
        self.gemm.linear(
            x,
            &layer.in_proj,
            &mut proj,
            GemmShape::new(t, dn.proj_width(), h),
        )?;
        let scale = (d as f32).powf(-0.5);
        let mut gated = scratch::<bf16>(s, t * dn.v_heads * d)?;
        if batches.parts.is_none()
            && t == batch.num_seqs()
            && self.ops.deltanet_decode_fused_pays(t, dn)
        {
            // Decode only: conv, gates, recurrent step and output norm in one
            // op (where the kernels crate measured it faster).
            self.ops.deltanet_decode_fused(
                batch,
                dn,
                &proj,
                layer.weights(),
                &mut cache.conv[layer.index],
                &mut cache.recurrent[layer.index],
                &mut gated,
                scale,
                c.rms_norm_eps,
            )?;
        } else {
            self.deltanet_unfused(li, batches, cache, &proj, &mut gated)?;
        }
        let out_proj = &self.layers[li].deltanet().out_proj;
        let (s, h) = (&self.stream, self.config.hidden_size);
        let mut out = scratch::<bf16>(s, t * h)?;
        self.gemm.linear(
            &gated,
            out_proj,
            &mut out,
            GemmShape::new(t, h, dn.v_heads * d),
        )?;
        Ok(out)
    }

    /// The DeltaNet mixer between its projections for prefill and mixed
    /// steps, and for decode steps where the fused op does not pay: conv and
    /// gates over every token, then the recurrent step for decode rows and
    /// the GDN prefill op for the others, then the gated norm. Decode rows
    /// must take the recurrent step: through the GDN prefill op and per-row
    /// state copies a decode step is far slower (ncu of such a step:
    /// docs/results/h200-2026-12-01-s2/
    /// `ncu-decode-b16-integrated-before-decode-fix.txt`).
    fn deltanet_unfused(
        &mut self,
        li: usize,
        batches: &Batches,
        cache: &mut GpuCache,
        proj: &CudaSlice<bf16>,
        gated: &mut CudaSlice<bf16>,
    ) -> Result<(), RunError> {
        let batch = &batches.full;
        let layer = self.layers[li].deltanet();
        let (s, dn, c) = (&self.stream, self.dn, &self.config);
        let (t, d) = (batch.num_tokens(), gdn_kernels::HEAD_DIM);
        let scale = (d as f32).powf(-0.5);
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
            proj,
            &layer.conv,
            &layer.a_log,
            &layer.dt_bias,
            &mut cache.conv[layer.index],
            &mut inputs,
        )?;
        let mut core = scratch::<bf16>(s, t * dn.v_heads * d)?;
        let state = &mut cache.recurrent[layer.index];
        let per = dn.recurrent_state_len();
        let (ops, gdn) = (&self.ops, &mut self.gdn);
        match &batches.parts {
            None if t == batch.num_seqs() => {
                ops.deltanet_decode(batch, dn, &inputs, state, &mut core, scale)?
            }
            None => prefill_core(ops, gdn, batch, &inputs, (state, per), &mut core, scale)?,
            Some((dec, pre)) => {
                // Decode rows lead the batch: the first `td` tokens take the
                // recurrent step, the rest the prefill op, each on its own
                // copy of its rows (the ops take whole buffers).
                let td = dec.num_tokens();
                let part = |range: std::ops::Range<usize>| -> Result<DeltaNetInputs, RunError> {
                    Ok(DeltaNetInputs {
                        q: copy_rows(s, &inputs.q, range.clone(), dn.qk_heads * d)?,
                        k: copy_rows(s, &inputs.k, range.clone(), dn.qk_heads * d)?,
                        v: copy_rows(s, &inputs.v, range.clone(), dn.v_heads * d)?,
                        alpha: copy_rows(s, &inputs.alpha, range.clone(), dn.v_heads)?,
                        beta: copy_rows(s, &inputs.beta, range, dn.v_heads)?,
                    })
                };
                let width = dn.v_heads * d;
                let mut core_d = scratch::<bf16>(s, td * width)?;
                ops.deltanet_decode(dec, dn, &part(0..td)?, state, &mut core_d, scale)?;
                let mut core_p = scratch::<bf16>(s, (t - td) * width)?;
                let inputs_p = part(td..t)?;
                prefill_core(ops, gdn, pre, &inputs_p, (state, per), &mut core_p, scale)?;
                s.memcpy_dtod(&core_d, &mut core.slice_mut(..td * width))?;
                s.memcpy_dtod(&core_p, &mut core.slice_mut(td * width..))?;
            }
        }
        self.ops
            .deltanet_out_norm(dn, &core, proj, &layer.norm, gated, c.rms_norm_eps)?;
        Ok(())
    }

    pub(super) fn attention(
        &mut self,
        li: usize,
        batch: &DeviceBatch,
        cache: &mut GpuCache,
        x: &CudaSlice<bf16>,
    ) -> Result<CudaSlice<bf16>, RunError> {
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
        self.gemm
            .linear(x, qkv, &mut proj, GemmShape::new(t, a.proj_width(), h))?;
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
        self.gemm
            .linear(&attn_out, o_proj, &mut out, GemmShape::new(t, h, width))?;
        Ok(out)
    }
}

/// Rows `range` of a row-major buffer of `width`-element rows, copied.
fn copy_rows<T: cudarc::driver::DeviceRepr>(
    s: &Arc<CudaStream>,
    src: &CudaSlice<T>,
    range: std::ops::Range<usize>,
    width: usize,
) -> Result<CudaSlice<T>, RunError> {
    let mut out = scratch::<T>(s, range.len() * width)?;
    s.memcpy_dtod(&src.slice(range.start * width..range.end * width), &mut out)?;
    Ok(out)
}

/// The GDN prefill op over `batch`, its initial state gathered from the
/// slots and its final state scattered back. The op takes and leaves f32
/// states: a bf16 state is widened into the f32 scratch and the final
/// state rounded back to bf16 by the gather and scatter (the math stays
/// f32 within a chunk; the state is rounded once, at its end).
#[allow(clippy::too_many_arguments)]
fn prefill_core(
    ops: &ModelOps,
    gdn: &mut GdnPrefill,
    batch: &DeviceBatch,
    inputs: &DeltaNetInputs,
    (state, per): (&mut RecurrentState, usize),
    core: &mut CudaSlice<bf16>,
    scale: f32,
) -> Result<(), RunError> {
    let s = ops.stream();
    let mut initial = scratch::<f32>(s, batch.num_seqs() * per)?;
    ops.move_state(batch, state, &mut initial, per, true)?;
    let mut last = scratch::<f32>(s, batch.num_seqs() * per)?;
    gdn.run(
        PrefillBuffers {
            q: &inputs.q,
            k: &inputs.k,
            v: &inputs.v,
            alpha: &inputs.alpha,
            beta: &inputs.beta,
            cu_seqlens: batch.cu_seqlens(),
            initial_state: Some(&initial),
            final_state: &mut last,
            output: core,
        },
        scale,
    )?;
    ops.move_state(batch, state, &mut last, per, false)?;
    Ok(())
}
