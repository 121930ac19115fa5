//! The MoE section of a Qwen3.5 config (`qwen3_5_moe_text`, also under a
//! `qwen3_5_moe` VL config's `text_config`): fields and defaults of
//! transformers' `Qwen3_5MoeTextConfig`, and what the architecture is
//! called in logs.

use super::{unsupported, RawText};
use crate::error::LoadError;

/// The sparse MLP of a mixture-of-experts model (every decoder layer has
/// one; HF's `Qwen3_5MoeSparseMoeBlock`): a softmax router picks
/// `num_experts_per_tok` of `num_experts` SwiGLU experts per token, their
/// weights renormalised to sum 1, plus one shared SwiGLU expert scaled by
/// `sigmoid(shared_expert_gate(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Each routed expert's intermediate width.
    pub moe_intermediate_size: usize,
    /// The shared expert's intermediate width.
    pub shared_expert_intermediate_size: usize,
}

/// Which MLP the decoder layers have: what `/v1/models` and the startup log
/// report. `Display` gives `dense` or `MoE (8 experts, top-2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Dense,
    Moe(MoeConfig),
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Architecture::Dense => f.write_str("dense"),
            Architecture::Moe(m) => write!(
                f,
                "MoE ({} experts, top-{}, shared expert)",
                m.num_experts, m.num_experts_per_tok
            ),
        }
    }
}

/// The MoE section of a `qwen3_5_moe_text` config, with HF's defaults
/// (those of Qwen3.5-35B-A3B) and the variants HF's Qwen3.5 MoE model
/// cannot express refused.
pub(super) fn moe_config(raw: &RawText) -> Result<MoeConfig, LoadError> {
    if raw.norm_topk_prob == Some(false) {
        return Err(unsupported(
            "norm_topk_prob = false: Qwen3.5 MoE routing always renormalises the top-k \
             weights"
                .into(),
        ));
    }
    if let Some(step) = raw.decoder_sparse_step.filter(|&s| s != 1) {
        return Err(unsupported(format!(
            "decoder_sparse_step = {step}: Qwen3.5 MoE has experts in every layer"
        )));
    }
    if let Some(layers) = raw.mlp_only_layers.as_ref().filter(|l| !l.is_empty()) {
        return Err(unsupported(format!(
            "mlp_only_layers = {layers:?}: Qwen3.5 MoE has experts in every layer"
        )));
    }
    let m = MoeConfig {
        num_experts: raw.num_experts.unwrap_or(256),
        num_experts_per_tok: raw.num_experts_per_tok.unwrap_or(8),
        moe_intermediate_size: raw.moe_intermediate_size.unwrap_or(512),
        shared_expert_intermediate_size: raw.shared_expert_intermediate_size.unwrap_or(512),
    };
    for (name, v) in [
        ("num_experts", m.num_experts),
        ("num_experts_per_tok", m.num_experts_per_tok),
        ("moe_intermediate_size", m.moe_intermediate_size),
        (
            "shared_expert_intermediate_size",
            m.shared_expert_intermediate_size,
        ),
    ] {
        if v == 0 {
            return Err(unsupported(format!("{name} must be positive, got 0")));
        }
    }
    if m.num_experts_per_tok > m.num_experts {
        return Err(unsupported(format!(
            "num_experts_per_tok {} exceeds num_experts {}",
            m.num_experts_per_tok, m.num_experts
        )));
    }
    Ok(m)
}

/// Qwen3.5-35B-A3B's text config (the shapes of Hugging Face
/// `Qwen/Qwen3.5-35B-A3B`, text part): the MoE benchmarks' random model.
pub const QWEN35_35B_A3B_TEXT: &str = r#"{
  "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
  "num_hidden_layers": 40, "full_attention_interval": 4,
  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
  "linear_num_key_heads": 16, "linear_num_value_heads": 32,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
  "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
  "shared_expert_intermediate_size": 512, "mamba_ssm_dtype": "float32",
  "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "hidden_act": "silu",
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}
}"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const DENSE: &str = r#"{"model_type": "qwen3_5_text", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}}"#;

    /// TEXT as a MoE text config: 8 experts, top-2.
    fn moe_text() -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(DENSE).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("intermediate_size");
        o.insert("model_type".into(), "qwen3_5_moe_text".into());
        o.insert("num_experts".into(), 8.into());
        o.insert("num_experts_per_tok".into(), 2.into());
        o.insert("moe_intermediate_size".into(), 24.into());
        o.insert("shared_expert_intermediate_size".into(), 40.into());
        v
    }

    #[test]
    fn moe_configs_are_read_in_both_layouts() {
        let want = MoeConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 24,
            shared_expert_intermediate_size: 40,
        };
        let flat = Config::from_json(&moe_text().to_string()).unwrap();
        assert_eq!((flat.moe, flat.vision_language), (Some(want), false));
        assert_eq!(flat.intermediate_size, 0);
        assert_eq!(flat.architecture(), Architecture::Moe(want));
        assert_eq!(
            flat.architecture().to_string(),
            "MoE (8 experts, top-2, shared expert)"
        );
        let vl = serde_json::json!({"model_type": "qwen3_5_moe", "text_config": moe_text(),
            "tie_word_embeddings": true});
        let vl = Config::from_json(&vl.to_string()).unwrap();
        assert_eq!((vl.moe, vl.vision_language), (Some(want), true));
        assert!(vl.tie_word_embeddings);
        let dense = Config::from_json(DENSE).unwrap();
        assert_eq!(dense.architecture().to_string(), "dense");
    }

    #[test]
    fn moe_fields_default_to_hf_values() {
        let mut v = moe_text();
        let o = v.as_object_mut().unwrap();
        for k in [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ] {
            o.remove(k);
        }
        // A leftover dense width is ignored, not refused.
        o.insert("intermediate_size".into(), 96.into());
        let c = Config::from_json(&v.to_string()).unwrap();
        assert_eq!(
            c.moe,
            Some(MoeConfig {
                num_experts: 256,
                num_experts_per_tok: 8,
                moe_intermediate_size: 512,
                shared_expert_intermediate_size: 512,
            })
        );
        assert_eq!(c.intermediate_size, 0);
    }

    #[test]
    fn moe_configs_we_cannot_run_are_refused_with_the_reason() {
        for (key, value, needle) in [
            (
                "num_experts",
                serde_json::json!(0),
                "num_experts must be positive",
            ),
            (
                "num_experts_per_tok",
                serde_json::json!(9),
                "num_experts_per_tok 9 exceeds num_experts 8",
            ),
            (
                "moe_intermediate_size",
                serde_json::json!(0),
                "moe_intermediate_size must be positive",
            ),
            (
                "shared_expert_intermediate_size",
                serde_json::json!(0),
                "shared_expert_intermediate_size must be positive",
            ),
            (
                "norm_topk_prob",
                serde_json::json!(false),
                "norm_topk_prob = false",
            ),
            (
                "decoder_sparse_step",
                serde_json::json!(2),
                "decoder_sparse_step = 2",
            ),
            (
                "mlp_only_layers",
                serde_json::json!([0, 3]),
                "mlp_only_layers = [0, 3]",
            ),
            ("num_experts", serde_json::json!(usize::MAX / 4), "overflow"),
        ] {
            let mut v = moe_text();
            v[key] = value;
            let err = Config::from_json(&v.to_string()).unwrap_err().to_string();
            assert!(err.contains(needle), "{key}: {err}");
        }
        // Harmless spellings of HF's behaviour are accepted.
        let mut v = moe_text();
        v["norm_topk_prob"] = true.into();
        v["decoder_sparse_step"] = 1.into();
        v["mlp_only_layers"] = serde_json::json!([]);
        v["router_aux_loss_coef"] = 0.001.into();
        assert!(Config::from_json(&v.to_string()).is_ok());
        // The VL layout's text config must be the MoE text config, and a
        // dense text config must not sit under a MoE top level.
        let dense: serde_json::Value = serde_json::from_str(DENSE).unwrap();
        let vl = serde_json::json!({"model_type": "qwen3_5_moe", "text_config": dense});
        let err = Config::from_json(&vl.to_string()).unwrap_err().to_string();
        assert!(err.contains("expected qwen3_5_moe_text"), "{err}");
        let vl = serde_json::json!({"model_type": "qwen3_5", "text_config": moe_text()});
        let err = Config::from_json(&vl.to_string()).unwrap_err().to_string();
        assert!(err.contains("expected qwen3_5_text"), "{err}");
        // A dense config needs its MLP width.
        let mut v = dense.clone();
        v.as_object_mut().unwrap().remove("intermediate_size");
        let err = Config::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(err.contains("intermediate_size is missing"), "{err}");
    }

    #[test]
    fn the_35b_a3b_benchmark_config_has_the_published_shapes() {
        use crate::config::LayerType;
        use crate::state_dtype::StateDtype;
        let c = Config::from_json(QWEN35_35B_A3B_TEXT).unwrap();
        let want = MoeConfig {
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
        };
        assert_eq!(c.moe, Some(want));
        assert_eq!(c.architecture(), Architecture::Moe(want));
        assert_eq!(
            c.architecture().to_string(),
            "MoE (256 experts, top-8, shared expert)"
        );
        assert_eq!((c.layer_types.len(), c.hidden_size), (40, 2048));
        let full: Vec<usize> = (0..40)
            .filter(|&i| c.layer_types[i] == LayerType::Full)
            .collect();
        assert_eq!(full, (3..40).step_by(4).collect::<Vec<_>>());
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (16, 2, 256)
        );
        assert_eq!((c.rotary_dim(), c.linear_conv_dim()), (64, 8192));
        assert_eq!((c.vocab_size, c.intermediate_size), (248320, 0));
        assert_eq!(c.mamba_ssm_dtype, StateDtype::F32);
        assert!(!c.tie_word_embeddings && !c.vision_language);
    }
}
