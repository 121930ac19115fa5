//! The sparse MoE block of the f32 CPU reference (HF's
//! `Qwen3_5MoeSparseMoeBlock`, transformers' `modeling_qwen3_5_moe.py`):
//! - router: softmax in f32 over all experts' logits, the top k kept and
//!   renormalised to sum 1 (`Qwen3_5MoeTopKRouter`);
//! - each chosen expert: `down(silu(gate(x)) * up(x))`, weighted and summed
//!   in ascending expert order, as HF's `index_add_` loop does;
//! - plus the shared expert times `sigmoid(shared_expert_gate(x))`.

use super::{matvec, sigmoid, Mlp};
use crate::config::MoeConfig;
use crate::error::LoadError;
use crate::experts::{load_experts_f32, ExpertF32};
use crate::weights::Weights;

pub(super) struct SparseMoe {
    config: MoeConfig,
    /// `[E, H]`
    router: Vec<f32>,
    experts: Vec<ExpertF32>,
    shared_expert: Mlp,
    /// `[1, H]`
    shared_expert_gate: Vec<f32>,
}

/// The `k` largest probabilities' experts, largest first (ties: lower
/// index first), with their weights renormalised to sum 1.
pub(super) fn route(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
    let top: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, exps[e] / sum)).collect();
    let kept: f32 = top.iter().map(|t| t.1).sum();
    top.into_iter().map(|(e, p)| (e, p / kept)).collect()
}

impl SparseMoe {
    pub(super) fn load(
        w: &Weights,
        layer: usize,
        config: MoeConfig,
        hidden: usize,
    ) -> Result<SparseMoe, LoadError> {
        let p = format!("model.layers.{layer}.mlp");
        let shared = config.shared_expert_intermediate_size;
        Ok(SparseMoe {
            router: w.get(&format!("{p}.gate.weight"), &[config.num_experts, hidden])?,
            experts: load_experts_f32(w, layer, &config, hidden)?,
            shared_expert: Mlp::load(w, &format!("{p}.shared_expert"), shared, hidden)?,
            shared_expert_gate: w.get(&format!("{p}.shared_expert_gate.weight"), &[1, hidden])?,
            config,
        })
    }

    /// One token's MoE output for the normed hidden state `x`, and the
    /// experts chosen (best first, with their weights); `hook` sees the
    /// router's logits before the top-k.
    pub(super) fn forward(
        &self,
        x: &[f32],
        hook: impl FnOnce(&mut [f32]),
    ) -> (Vec<f32>, Vec<(usize, f32)>) {
        let (i, h) = (self.config.moe_intermediate_size, x.len());
        let mut logits = matvec(&self.router, x, self.config.num_experts);
        hook(&mut logits);
        let chosen = route(&logits, self.config.num_experts_per_tok);
        let mut by_expert = chosen.clone();
        by_expert.sort_by_key(|c| c.0);
        let mut out = vec![0.0f32; h];
        for (e, weight) in by_expert {
            let expert = &self.experts[e];
            let gate_up = matvec(&expert.gate_up, x, 2 * i);
            let act: Vec<f32> = gate_up[..i]
                .iter()
                .zip(&gate_up[i..])
                .map(|(g, u)| super::silu(*g) * u)
                .collect();
            let down = matvec(&expert.down, &act, h);
            out.iter_mut()
                .zip(&down)
                .for_each(|(o, d)| *o += d * weight);
        }
        let gate = sigmoid(matvec(&self.shared_expert_gate, x, 1)[0]);
        let shared = self.shared_expert.forward(x);
        out.iter_mut()
            .zip(&shared)
            .for_each(|(o, s)| *o += gate * s);
        (out, chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routing_keeps_the_top_k_softmax_weights_renormalised() {
        // softmax of [0, ln 2, ln 3, ln 4] is [1, 2, 3, 4] / 10; top-2 keeps
        // experts 3 and 2 with 4/7 and 3/7.
        let logits = [0.0, 2f32.ln(), 3f32.ln(), 4f32.ln()];
        let r = route(&logits, 2);
        assert_eq!((r[0].0, r[1].0), (3, 2));
        assert!((r[0].1 - 4.0 / 7.0).abs() < 1e-6 && (r[1].1 - 3.0 / 7.0).abs() < 1e-6);
        // Large logits do not overflow (the max is subtracted first).
        let r = route(&[1000.0, 999.0, -5.0], 1);
        assert_eq!(r, vec![(0, 1.0)]);
    }
}
