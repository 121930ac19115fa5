//! The f32 CPU reference forward of Qwen3.5 (dense and MoE; the MoE block
//! is in `moe`): the oracle for the GPU runtime's
//! tests and the runtime CI can test the model with. It processes tokens one
//! by one (Gated DeltaNet in its recurrent form, attention over a growing
//! KV cache), so prefill, chunked prefill and decode are the same code path.
//! Written for clarity, not speed: only for tiny models.
//!
//! With a bf16 state dtype ([`CpuModel::with_state_dtype`]) the recurrent
//! state is rounded to bf16 after every token, as the GPU's decode step
//! stores it (the GPU prefill rounds once per chunk, at its end): the
//! oracle of the bf16 state, and how its drift is measured without a GPU.

mod moe;

use crate::config::{Config, LayerType};
use crate::error::{LoadError, RunError};
use crate::row_logits::RowLogits;
use crate::state_dtype::StateDtype;
use crate::weights::Weights;

/// Row-major `[rows, cols]` matrix times vector: `out[r] = sum_c w[r, c] x[c]`.
fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    debug_assert_eq!(w.len(), rows * cols);
    (0..rows)
        .map(|r| {
            w[r * cols..(r + 1) * cols]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum()
        })
        .collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    // torch.nn.functional.softplus with beta 1, threshold 20.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn rms(x: &[f32], eps: f32) -> f32 {
    1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt()
}

/// Qwen3.5's zero-centred RMSNorm: `x / rms(x) * (1 + w)`.
fn rms_norm_zc(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let r = rms(x, eps);
    x.iter().zip(w).map(|(v, w)| v * r * (1.0 + w)).collect()
}

/// A SwiGLU MLP: `down(silu(gate(x)) * up(x))` (the dense layers' MLP and
/// a MoE layer's shared expert).
struct Mlp {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    intermediate: usize,
}

impl Mlp {
    /// `{prefix}.{gate,up,down}_proj.weight`.
    fn load(w: &Weights, prefix: &str, intermediate: usize, h: usize) -> Result<Mlp, LoadError> {
        Ok(Mlp {
            gate: w.get(&format!("{prefix}.gate_proj.weight"), &[intermediate, h])?,
            up: w.get(&format!("{prefix}.up_proj.weight"), &[intermediate, h])?,
            down: w.get(&format!("{prefix}.down_proj.weight"), &[h, intermediate])?,
            intermediate,
        })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let gate = matvec(&self.gate, x, self.intermediate);
        let up = matvec(&self.up, x, self.intermediate);
        let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
        matvec(&self.down, &act, x.len())
    }
}

/// A decoder layer's MLP: dense, or the sparse MoE block.
enum Ffn {
    Dense(Mlp),
    Moe(Box<moe::SparseMoe>),
}

struct GatedDeltaNet {
    in_proj_qkv: Vec<f32>,
    in_proj_z: Vec<f32>,
    in_proj_b: Vec<f32>,
    in_proj_a: Vec<f32>,
    /// [conv_dim, kernel]
    conv1d: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Vec<f32>,
}

struct GatedAttention {
    q_proj: Vec<f32>,
    k_proj: Vec<f32>,
    v_proj: Vec<f32>,
    o_proj: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
}

enum Mixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

struct DecoderLayer {
    input_layernorm: Vec<f32>,
    post_attention_layernorm: Vec<f32>,
    mixer: Mixer,
    mlp: Ffn,
}

/// `[layer][token]`: the experts a MoE layer chose for a token, best
/// first, with their renormalised weights.
pub type Routes = Vec<Vec<Vec<(usize, f32)>>>;

/// Sees (and may edit) a MoE router's logits before the top-k:
/// `(layer, position, logits)`; see [`CpuModel::forward_with_router_hook`].
pub type RouterHook<'a> = &'a mut dyn FnMut(usize, usize, &mut [f32]);

pub struct CpuModel {
    pub config: Config,
    embed_tokens: Vec<f32>,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Vec<f32>>,
    inv_freq: Vec<f32>,
    /// How the recurrent state is stored between tokens (the math is f32).
    state_dtype: StateDtype,
}

/// Per-sequence state: conv and recurrent state of every DeltaNet layer, the
/// KV cache of every attention layer, and the position of the next token.
#[derive(Clone)]
pub struct CpuState {
    layers: Vec<LayerState>,
    pub position: usize,
}

#[derive(Clone)]
enum LayerState {
    Linear {
        /// The last `kernel - 1` conv inputs, oldest first: [kernel - 1][conv_dim].
        conv: Vec<Vec<f32>>,
        /// [Hv][Dk][Dv], f32 as in HF.
        recurrent: Vec<f32>,
    },
    Full {
        /// Per position: [Hkv * D].
        keys: Vec<Vec<f32>>,
        values: Vec<Vec<f32>>,
    },
}

impl CpuState {
    /// The recurrent state (`[Hv][Dk][Dv]`) of layer `layer`, if that is a
    /// DeltaNet layer (tests compare the stored states of two runs).
    pub fn recurrent(&self, layer: usize) -> Option<&[f32]> {
        match self.layers.get(layer)? {
            LayerState::Linear { recurrent, .. } => Some(recurrent),
            LayerState::Full { .. } => None,
        }
    }

    /// Bytes of the conv and recurrent state (the part a GPU snapshot
    /// holds; the keys and values kept here per sequence are not counted).
    pub fn recurrent_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Linear { conv, recurrent } => {
                    (conv.iter().map(Vec::len).sum::<usize>() + recurrent.len()) * 4
                }
                LayerState::Full { .. } => 0,
            })
            .sum()
    }
}

impl CpuModel {
    /// Loads every tensor the config implies, checking names, shapes and dtypes.
    pub fn load(config: Config, w: &Weights) -> Result<CpuModel, LoadError> {
        let c = &config;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[v, h])?;
        let mut layers = vec![];
        for (i, ty) in c.layer_types.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = match ty {
                LayerType::Linear => {
                    let a = format!("{p}.linear_attn");
                    let (hv, dv) = (c.linear_num_value_heads, c.linear_value_head_dim);
                    let conv_dim = c.linear_conv_dim();
                    Mixer::Linear(GatedDeltaNet {
                        in_proj_qkv: w.get(&format!("{a}.in_proj_qkv.weight"), &[conv_dim, h])?,
                        in_proj_z: w.get(&format!("{a}.in_proj_z.weight"), &[hv * dv, h])?,
                        in_proj_b: w.get(&format!("{a}.in_proj_b.weight"), &[hv, h])?,
                        in_proj_a: w.get(&format!("{a}.in_proj_a.weight"), &[hv, h])?,
                        conv1d: w.get(
                            &format!("{a}.conv1d.weight"),
                            &[conv_dim, 1, c.linear_conv_kernel_dim],
                        )?,
                        a_log: w.get(&format!("{a}.A_log"), &[hv])?,
                        dt_bias: w.get(&format!("{a}.dt_bias"), &[hv])?,
                        norm: w.get(&format!("{a}.norm.weight"), &[dv])?,
                        out_proj: w.get(&format!("{a}.out_proj.weight"), &[h, hv * dv])?,
                    })
                }
                LayerType::Full => {
                    let a = format!("{p}.self_attn");
                    let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                    Mixer::Full(GatedAttention {
                        q_proj: w.get(&format!("{a}.q_proj.weight"), &[nh * d * 2, h])?,
                        k_proj: w.get(&format!("{a}.k_proj.weight"), &[nkv * d, h])?,
                        v_proj: w.get(&format!("{a}.v_proj.weight"), &[nkv * d, h])?,
                        o_proj: w.get(&format!("{a}.o_proj.weight"), &[h, nh * d])?,
                        q_norm: w.get(&format!("{a}.q_norm.weight"), &[d])?,
                        k_norm: w.get(&format!("{a}.k_norm.weight"), &[d])?,
                    })
                }
            };
            layers.push(DecoderLayer {
                input_layernorm: w.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_attention_layernorm: w
                    .get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mixer,
                mlp: match c.moe {
                    None => Ffn::Dense(Mlp::load(w, &format!("{p}.mlp"), c.intermediate_size, h)?),
                    Some(m) => Ffn::Moe(Box::new(moe::SparseMoe::load(w, i, m, h)?)),
                },
            });
        }
        let norm = w.get("model.norm.weight", &[h])?;
        // Tied, or a checkpoint without lm_head: the embedding serves as lm_head.
        let lm_head = if c.tie_word_embeddings || !w.contains("lm_head.weight") {
            None
        } else {
            Some(w.get("lm_head.weight", &[v, h])?)
        };
        let rot = c.rotary_dim();
        let inv_freq = (0..rot / 2)
            .map(|i| (1.0 / c.rope_theta.powf((2 * i) as f64 / rot as f64)) as f32)
            .collect();
        Ok(CpuModel {
            embed_tokens,
            layers,
            norm,
            lm_head,
            inv_freq,
            state_dtype: config.mamba_ssm_dtype,
            config,
        })
    }

    /// The same model with its recurrent state stored in `dtype` (the
    /// config's `mamba_ssm_dtype` unless set here).
    pub fn with_state_dtype(mut self, dtype: StateDtype) -> CpuModel {
        self.state_dtype = dtype;
        self
    }

    /// How the recurrent state is stored between tokens.
    pub fn state_dtype(&self) -> StateDtype {
        self.state_dtype
    }

    pub fn new_state(&self) -> CpuState {
        let c = &self.config;
        let layers = c
            .layer_types
            .iter()
            .map(|t| match t {
                LayerType::Linear => LayerState::Linear {
                    conv: vec![vec![0.0; c.linear_conv_dim()]; c.linear_conv_kernel_dim - 1],
                    recurrent: vec![
                        0.0;
                        c.linear_num_value_heads
                            * c.linear_key_head_dim
                            * c.linear_value_head_dim
                    ],
                },
                LayerType::Full => LayerState::Full {
                    keys: vec![],
                    values: vec![],
                },
            })
            .collect();
        CpuState {
            layers,
            position: 0,
        }
    }

    /// Runs `tokens` after whatever `state` has seen; returns logits `[tokens.len()][vocab]`.
    pub fn forward(&self, tokens: &[u32], state: &mut CpuState) -> Result<Vec<Vec<f32>>, RunError> {
        self.forward_logits(tokens, state, RowLogits::All)
    }

    /// [`CpuModel::forward`] with logits for every token (`All`), the last
    /// one only (`Last`: one row) or none: the lm_head is most of a tiny
    /// model's work per token. A refused call (token id out of range, a
    /// state of another model) changes nothing.
    pub fn forward_logits(
        &self,
        tokens: &[u32],
        state: &mut CpuState,
        which: RowLogits,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        self.run(tokens, state, which, None)
    }

    /// [`CpuModel::forward`] that also returns every MoE layer's routing:
    /// `routes[layer][token]` = the chosen experts, best first, with their
    /// renormalised weights (empty for a dense model's layers). The
    /// routing is what a MoE forward's tests compare first (a flipped
    /// expert moves the logits by far more than rounding does).
    pub fn forward_with_routes(
        &self,
        tokens: &[u32],
        state: &mut CpuState,
    ) -> Result<(Vec<Vec<f32>>, Routes), RunError> {
        self.forward_with_router_hook(tokens, state, RowLogits::All, &mut |_, _, _| {})
    }

    /// [`CpuModel::forward_with_routes`] with `hook(layer, position,
    /// logits)` called on every MoE router's logits (`[num_experts]`,
    /// `position` counted from the sequence's start) before the top-k: it
    /// may read them (the margin at the top-k boundary) or edit them (flip
    /// a near-tie). What a bf16 forward's routing may differ on is found
    /// this way (qwen35-testkit's `moe` gate).
    pub fn forward_with_router_hook(
        &self,
        tokens: &[u32],
        state: &mut CpuState,
        which: RowLogits,
        hook: RouterHook,
    ) -> Result<(Vec<Vec<f32>>, Routes), RunError> {
        let mut routes = vec![vec![]; self.layers.len()];
        let logits = self.run(tokens, state, which, Some((&mut routes, hook)))?;
        Ok((logits, routes))
    }

    fn run(
        &self,
        tokens: &[u32],
        state: &mut CpuState,
        which: RowLogits,
        mut probe: Option<(&mut Routes, RouterHook)>,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let c = &self.config;
        let kinds_match = state.layers.len() == self.layers.len()
            && state.layers.iter().zip(&self.layers).all(|(s, l)| {
                matches!(
                    (s, &l.mixer),
                    (LayerState::Linear { .. }, Mixer::Linear(_))
                        | (LayerState::Full { .. }, Mixer::Full(_))
                )
            });
        if !kinds_match {
            return Err(RunError::InvalidInput(
                "the state was made by a model with other layers (use this model's new_state)"
                    .into(),
            ));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(RunError::InvalidInput(format!(
                "token id {t} >= vocab_size {}",
                c.vocab_size
            )));
        }
        let mut out = Vec::with_capacity(tokens.len());
        for (i, &tok) in tokens.iter().enumerate() {
            let t = tok as usize;
            let mut x = self.embed_tokens[t * c.hidden_size..(t + 1) * c.hidden_size].to_vec();
            for (li, (layer, ls)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
                let normed = rms_norm_zc(&x, &layer.input_layernorm, c.rms_norm_eps);
                let mixed = match (&layer.mixer, ls) {
                    (Mixer::Linear(g), LayerState::Linear { conv, recurrent }) => {
                        let out = g.step(c, &normed, conv, recurrent);
                        if self.state_dtype != StateDtype::F32 {
                            let dtype = self.state_dtype;
                            recurrent.iter_mut().for_each(|x| *x = dtype.stored(*x));
                        }
                        out
                    }
                    (Mixer::Full(a), LayerState::Full { keys, values }) => {
                        a.step(c, &self.inv_freq, &normed, state.position, keys, values)
                    }
                    _ => unreachable!("state built from the same layer types"),
                };
                x.iter_mut().zip(&mixed).for_each(|(a, b)| *a += b);
                let normed = rms_norm_zc(&x, &layer.post_attention_layernorm, c.rms_norm_eps);
                let down = match &layer.mlp {
                    Ffn::Dense(m) => m.forward(&normed),
                    Ffn::Moe(m) => match probe.as_mut() {
                        Some((routes, hook)) => {
                            let position = state.position;
                            let (out, chosen) = m.forward(&normed, |l| hook(li, position, l));
                            routes[li].push(chosen);
                            out
                        }
                        None => m.forward(&normed, |_| {}).0,
                    },
                };
                x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
            }
            state.position += 1;
            let wanted = match which {
                RowLogits::All => true,
                RowLogits::Last => i + 1 == tokens.len(),
                RowLogits::None => false,
            };
            if wanted {
                let normed = rms_norm_zc(&x, &self.norm, c.rms_norm_eps);
                out.push(matvec(
                    self.lm_head.as_ref().unwrap_or(&self.embed_tokens),
                    &normed,
                    c.vocab_size,
                ));
            }
        }
        Ok(out)
    }
}

impl GatedDeltaNet {
    /// One token through the DeltaNet mixer (HF `Qwen3_5GatedDeltaNet.forward`).
    fn step(&self, c: &Config, x: &[f32], conv: &mut [Vec<f32>], s: &mut [f32]) -> Vec<f32> {
        let (hk, hv, dk, dv) = (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        );
        let (kernel, conv_dim) = (c.linear_conv_kernel_dim, c.linear_conv_dim());
        // 1. projections
        let qkv = matvec(&self.in_proj_qkv, x, conv_dim);
        let z = matvec(&self.in_proj_z, x, hv * dv);
        let b = matvec(&self.in_proj_b, x, hv);
        let a = matvec(&self.in_proj_a, x, hv);
        // 2. depthwise causal conv1d over [q | k | v] with the last kernel-1 inputs, then SiLU
        let mut mixed = vec![0.0f32; conv_dim];
        for (ch, m) in mixed.iter_mut().enumerate() {
            let w = &self.conv1d[ch * kernel..(ch + 1) * kernel];
            let mut acc = w[kernel - 1] * qkv[ch];
            for j in 0..kernel - 1 {
                acc += w[j] * conv[j][ch];
            }
            *m = silu(acc);
        }
        if kernel > 1 {
            conv.rotate_left(1);
            conv[kernel - 2].copy_from_slice(&qkv);
        }
        // 3. gates
        let r = hv / hk;
        let mut o = vec![0.0f32; hv * dv];
        for h in 0..hv {
            let beta = sigmoid(b[h]);
            let g = -self.a_log[h].exp() * softplus(a[h] + self.dt_bias[h]);
            let kh = h / r;
            // 4. q, k L2-normalised (eps 1e-6), q scaled by dk^-1/2
            let q_raw = &mixed[kh * dk..(kh + 1) * dk];
            let k_raw = &mixed[hk * dk + kh * dk..hk * dk + (kh + 1) * dk];
            let v = &mixed[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let qn = 1.0 / (q_raw.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
            let kn = 1.0 / (k_raw.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
            let scale = (dk as f32).powf(-0.5);
            let q: Vec<f32> = q_raw.iter().map(|x| x * qn * scale).collect();
            let k: Vec<f32> = k_raw.iter().map(|x| x * kn).collect();
            // 5. recurrence on S[h] = [dk][dv]
            let st = &mut s[h * dk * dv..(h + 1) * dk * dv];
            let decay = g.exp();
            st.iter_mut().for_each(|e| *e *= decay);
            for j in 0..dv {
                let kv_mem: f32 = (0..dk).map(|i| st[i * dv + j] * k[i]).sum();
                let delta = (v[j] - kv_mem) * beta;
                for i in 0..dk {
                    st[i * dv + j] += k[i] * delta;
                }
            }
            for j in 0..dv {
                o[h * dv + j] = (0..dk).map(|i| st[i * dv + j] * q[i]).sum();
            }
            // 6. gated RMSNorm per head: plain weight, times silu(z)
            let oh = &mut o[h * dv..(h + 1) * dv];
            let rr = rms(oh, c.rms_norm_eps);
            for (j, e) in oh.iter_mut().enumerate() {
                *e = *e * rr * self.norm[j] * silu(z[h * dv + j]);
            }
        }
        // 7. out projection
        matvec(&self.out_proj, &o, c.hidden_size)
    }
}

impl GatedAttention {
    /// One token through gated attention (HF `Qwen3_5Attention.forward`).
    fn step(
        &self,
        c: &Config,
        inv_freq: &[f32],
        x: &[f32],
        pos: usize,
        keys: &mut Vec<Vec<f32>>,
        values: &mut Vec<Vec<f32>>,
    ) -> Vec<f32> {
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        // 1. projections; q_proj rows are [q_h | gate_h] per head
        let qg = matvec(&self.q_proj, x, nh * d * 2);
        let k = matvec(&self.k_proj, x, nkv * d);
        let v = matvec(&self.v_proj, x, nkv * d);
        // 2. q/k norm, then partial NeoX RoPE on the first rotary dims
        let rot = 2 * inv_freq.len();
        let rope = |h: &mut [f32]| {
            let half = rot / 2;
            for i in 0..half {
                let f = pos as f32 * inv_freq[i];
                let (sin, cos) = f.sin_cos();
                let (a, b) = (h[i], h[i + half]);
                h[i] = a * cos - b * sin;
                h[i + half] = b * cos + a * sin;
            }
        };
        let mut q = vec![0.0f32; nh * d];
        let mut gate = vec![0.0f32; nh * d];
        for hh in 0..nh {
            let qh = rms_norm_zc(
                &qg[hh * 2 * d..hh * 2 * d + d],
                &self.q_norm,
                c.rms_norm_eps,
            );
            q[hh * d..(hh + 1) * d].copy_from_slice(&qh);
            rope(&mut q[hh * d..(hh + 1) * d]);
            gate[hh * d..(hh + 1) * d].copy_from_slice(&qg[hh * 2 * d + d..(hh + 1) * 2 * d]);
        }
        let mut kk = vec![0.0f32; nkv * d];
        for hh in 0..nkv {
            let kh = rms_norm_zc(&k[hh * d..(hh + 1) * d], &self.k_norm, c.rms_norm_eps);
            kk[hh * d..(hh + 1) * d].copy_from_slice(&kh);
            rope(&mut kk[hh * d..(hh + 1) * d]);
        }
        keys.push(kk);
        values.push(v);
        // 3. causal softmax attention over the cache, GQA
        let scale = (d as f32).powf(-0.5);
        let mut out = vec![0.0f32; nh * d];
        for hh in 0..nh {
            let kvh = hh / (nh / nkv);
            let qh = &q[hh * d..(hh + 1) * d];
            let scores: Vec<f32> = keys
                .iter()
                .map(|kp| {
                    qh.iter()
                        .zip(&kp[kvh * d..(kvh + 1) * d])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            for (p, vp) in exps.iter().zip(values.iter()) {
                for j in 0..d {
                    out[hh * d + j] += p / sum * vp[kvh * d + j];
                }
            }
        }
        // 4. output gate, o_proj
        for (o, g) in out.iter_mut().zip(&gate) {
            *o *= sigmoid(*g);
        }
        matvec(&self.o_proj, &out, c.hidden_size)
    }
}
