//! Where a MoE layer's routed experts are in a checkpoint. Writers store
//! them in one of two layouts (the released checkpoints' indexes list the
//! fused one; transformers 5.x holds experts fused but its
//! `save_pretrained` writes them per expert, as the random benchmark
//! checkpoint of checks/bench/make_random_checkpoint.py found):
//! - fused: `P.gate_up_proj` `[E, 2I, H]` (gate rows first, then up) and
//!   `P.down_proj` `[E, H, I]`;
//! - per expert: `P.N.gate_proj.weight` `[I, H]`, `P.N.up_proj.weight`
//!   `[I, H]`, `P.N.down_proj.weight` `[H, I]` for N in 0..E,
//!
//! with `P` = `model.layers.L.mlp.experts` (names normalised as in
//! [`Weights`]). Both load to the fused layout's matrices.

use crate::config::MoeConfig;
use crate::error::LoadError;
use crate::weights::Weights;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertLayout {
    Fused,
    PerExpert,
}

/// The experts' tensor-name prefix of decoder layer `layer`.
pub fn experts_prefix(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts")
}

/// Which layout layer `layer` stores its experts in. Neither present is a
/// missing `gate_up_proj` (the fused name); both present is an error naming
/// a tensor of each.
pub fn expert_layout(w: &Weights, layer: usize) -> Result<ExpertLayout, LoadError> {
    let p = experts_prefix(layer);
    let fused_names = [format!("{p}.gate_up_proj"), format!("{p}.down_proj")];
    let fused = fused_names.iter().find(|n| w.contains(n));
    let except: Vec<&str> = fused_names.iter().map(String::as_str).collect();
    let per_expert = w.first_with_prefix(&format!("{p}."), &except);
    match (fused, per_expert) {
        (Some(f), Some(e)) => Err(LoadError::MixedExpertLayouts {
            fused: f.clone(),
            per_expert: e.to_string(),
        }),
        (Some(_), None) => Ok(ExpertLayout::Fused),
        (None, Some(_)) => Ok(ExpertLayout::PerExpert),
        (None, None) => Err(LoadError::MissingTensor {
            tensor: fused_names[0].clone(),
        }),
    }
}

/// One routed expert in f32: `gate_up` `[2I, H]` (gate rows, then up rows)
/// and `down` `[H, I]`.
pub struct ExpertF32 {
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

/// Every routed expert of layer `layer` as f32, from either layout, each
/// tensor checked for presence, shape and dtype.
pub fn load_experts_f32(
    w: &Weights,
    layer: usize,
    m: &MoeConfig,
    hidden: usize,
) -> Result<Vec<ExpertF32>, LoadError> {
    let (e, i, h) = (m.num_experts, m.moe_intermediate_size, hidden);
    let p = experts_prefix(layer);
    match expert_layout(w, layer)? {
        ExpertLayout::Fused => {
            let gate_up = w.get(&format!("{p}.gate_up_proj"), &[e, 2 * i, h])?;
            let down = w.get(&format!("{p}.down_proj"), &[e, h, i])?;
            Ok(gate_up
                .chunks_exact(2 * i * h)
                .zip(down.chunks_exact(h * i))
                .map(|(gu, d)| ExpertF32 {
                    gate_up: gu.to_vec(),
                    down: d.to_vec(),
                })
                .collect())
        }
        ExpertLayout::PerExpert => (0..e)
            .map(|n| {
                let mut gate_up = w.get(&format!("{p}.{n}.gate_proj.weight"), &[i, h])?;
                gate_up.extend(w.get(&format!("{p}.{n}.up_proj.weight"), &[i, h])?);
                let down = w.get(&format!("{p}.{n}.down_proj.weight"), &[h, i])?;
                Ok(ExpertF32 { gate_up, down })
            })
            .collect(),
    }
}
