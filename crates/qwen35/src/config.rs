//! `config.json` of a Qwen3.5 checkpoint, dense or mixture-of-experts, in
//! either layout: vision-language (`qwen3_5` / `qwen3_5_moe`, text settings
//! under `text_config`) or text-only (`qwen3_5_text` / `qwen3_5_moe_text`,
//! flat). Field names and defaults are HF's (transformers'
//! `configuration_qwen3_5{,_moe}.py`); anything this runtime does not
//! implement is refused here with the reason.

use std::path::Path;

use serde::Deserialize;

use crate::error::LoadError;
use crate::state_dtype::StateDtype;

mod moe;
mod parse;

pub use moe::{Architecture, MoeConfig, QWEN35_35B_A3B_TEXT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet.
    Linear,
    /// Gated softmax attention.
    Full,
}

/// The text model's settings, validated and with defaults resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The dense MLP's intermediate width; 0 for a MoE model, whose layers
    /// have no dense MLP (see `moe`).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub tie_word_embeddings: bool,
    pub layer_types: Vec<LayerType>,
    /// True for the `qwen3_5` layout: weights live under `model.language_model.`.
    pub vision_language: bool,
    /// `mamba_ssm_dtype`: how the DeltaNet recurrent state is stored (f32
    /// where the config does not say; see `state_dtype::from_config`).
    pub mamba_ssm_dtype: StateDtype,
    /// The experts of a `qwen3_5_moe` / `qwen3_5_moe_text` model; `None`
    /// for a dense one.
    pub moe: Option<MoeConfig>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    rope_type: Option<String>,
}

#[derive(Deserialize)]
struct RawText {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    /// Required of dense configs; MoE configs have none.
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: Option<usize>,
    #[serde(default = "d16")]
    linear_num_key_heads: usize,
    #[serde(default = "d32")]
    linear_num_value_heads: usize,
    #[serde(default = "d128")]
    linear_key_head_dim: usize,
    #[serde(default = "d128")]
    linear_value_head_dim: usize,
    #[serde(default = "d4")]
    linear_conv_kernel_dim: usize,
    #[serde(default = "eps")]
    rms_norm_eps: f32,
    rope_parameters: Option<RopeParameters>,
    /// Legacy top-level RoPE fields.
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    tie_word_embeddings: Option<bool>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    /// Not in HF's Qwen3.5 MoE config (its router always renormalises);
    /// read so that a config asking otherwise is refused.
    norm_topk_prob: Option<bool>,
    /// Likewise absent from HF's Qwen3.5 MoE config (every layer is sparse).
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    mamba_ssm_dtype: Option<serde_json::Value>,
}

fn d4() -> usize {
    4
}
fn d16() -> usize {
    16
}
fn d32() -> usize {
    32
}
fn d128() -> usize {
    128
}
fn eps() -> f32 {
    1e-6
}

#[derive(Deserialize)]
struct RawTop {
    model_type: Option<String>,
    text_config: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    mamba_ssm_dtype: Option<serde_json::Value>,
}

fn unsupported(what: String) -> LoadError {
    LoadError::UnsupportedConfig(what)
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// The config of a `config.json`'s text.
    pub fn from_json(text: &str) -> Result<Config, LoadError> {
        Config::parse(text, "config")
    }

    fn validate(&self) -> Result<(), LoadError> {
        let rule = |ok: bool, what: String| if ok { Ok(()) } else { Err(unsupported(what)) };
        rule(
            self.layer_types.len() == self.num_hidden_layers,
            format!(
                "layer_types has {} entries for num_hidden_layers = {}",
                self.layer_types.len(),
                self.num_hidden_layers
            ),
        )?;
        if self.moe.is_none() {
            rule(
                self.intermediate_size > 0,
                format!(
                    "intermediate_size must be positive, got {}",
                    self.intermediate_size
                ),
            )?;
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
        ] {
            rule(v > 0, format!("{name} must be positive, got {v}"))?;
        }
        rule(
            self.num_attention_heads % self.num_key_value_heads == 0,
            format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ),
        )?;
        rule(
            self.linear_num_value_heads % self.linear_num_key_heads == 0,
            format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ),
        )?;
        // Every weight shape must be computable without overflow.
        let products = [
            self.vocab_size.checked_mul(self.hidden_size),
            self.intermediate_size.checked_mul(self.hidden_size),
            self.num_attention_heads
                .checked_mul(self.head_dim)
                .and_then(|x| x.checked_mul(2))
                .and_then(|x| x.checked_mul(self.hidden_size)),
            self.num_key_value_heads
                .checked_mul(self.head_dim)
                .and_then(|x| x.checked_mul(self.hidden_size)),
            (2 * self.linear_num_key_heads as u128 * self.linear_key_head_dim as u128
                + self.linear_num_value_heads as u128 * self.linear_value_head_dim as u128)
                .checked_mul(self.hidden_size.max(self.linear_conv_kernel_dim) as u128)
                .and_then(|x| usize::try_from(x).ok()),
            self.linear_num_value_heads
                .checked_mul(self.linear_key_head_dim)
                .and_then(|x| x.checked_mul(self.linear_value_head_dim)),
            // A fused expert tensor [E, 2I, H], and the shared expert.
            self.moe.map_or(Some(0), |m| {
                m.num_experts
                    .checked_mul(m.moe_intermediate_size)
                    .and_then(|x| x.checked_mul(2))
                    .and_then(|x| x.checked_mul(self.hidden_size))
            }),
            self.moe.map_or(Some(0), |m| {
                m.shared_expert_intermediate_size
                    .checked_mul(self.hidden_size)
            }),
        ];
        rule(
            products.iter().all(Option::is_some),
            "tensor sizes overflow usize".to_string(),
        )?;
        let rot = self.rotary_dim();
        rule(rot % 2 == 0 && rot <= self.head_dim, format!(
            "rotary dim {rot} (head_dim {} x partial_rotary_factor {}) must be even and <= head_dim", self.head_dim, self.partial_rotary_factor))
    }

    /// Dense or MoE, with the experts' counts.
    pub fn architecture(&self) -> Architecture {
        self.moe.map_or(Architecture::Dense, Architecture::Moe)
    }

    /// Dimensions of each attention head that RoPE rotates.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// Channels of the Gated DeltaNet causal convolution: [q | k | v].
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }
}

/// Qwen3.5-4B's text config (the shapes of Hugging Face `Qwen/Qwen3.5-4B`,
/// text part): benchmarks build a random-weight model of this size.
pub const QWEN35_4B_TEXT: &str = r#"{
  "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 2560,
  "intermediate_size": 9216, "num_hidden_layers": 32, "full_attention_interval": 4,
  "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
  "linear_num_key_heads": 16, "linear_num_value_heads": 32,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "hidden_act": "silu",
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}
}"#;

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{"model_type": "qwen3_5_text", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}}"#;

    #[test]
    fn interval_gives_every_fourth_layer_full() {
        let c = Config::from_json(TEXT).unwrap();
        let full: Vec<usize> = (0..8)
            .filter(|&i| c.layer_types[i] == LayerType::Full)
            .collect();
        assert_eq!(full, vec![3, 7]);
        assert_eq!(c.rotary_dim(), 8);
        assert_eq!(c.linear_conv_dim(), 2 * 2 * 32 + 4 * 32);
        assert!(!c.vision_language);
    }

    #[test]
    fn vl_layout_reads_text_config_and_top_level_tie() {
        let text: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        let vl = serde_json::json!({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": true});
        let c = Config::from_json(&vl.to_string()).unwrap();
        assert!(c.vision_language && c.tie_word_embeddings);
    }

    #[test]
    fn mamba_ssm_dtype_is_read_from_either_level_and_defaults_to_float32() {
        let text: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        let read = |v: &serde_json::Value| Config::from_json(&v.to_string());
        // Absent everywhere: f32 (HF's; vLLM would take the model dtype).
        assert_eq!(read(&text).unwrap().mamba_ssm_dtype, StateDtype::F32);
        let mut flat = text.clone();
        flat["mamba_ssm_dtype"] = "bfloat16".into();
        assert_eq!(read(&flat).unwrap().mamba_ssm_dtype, StateDtype::Bf16);
        flat["mamba_ssm_dtype"] = "float32".into();
        assert_eq!(read(&flat).unwrap().mamba_ssm_dtype, StateDtype::F32);
        // VL layout: at the top level, inside text_config, and both
        // (text_config's wins: it is the text model's config).
        let top = serde_json::json!({"model_type": "qwen3_5", "text_config": text,
            "mamba_ssm_dtype": "bfloat16"});
        assert_eq!(read(&top).unwrap().mamba_ssm_dtype, StateDtype::Bf16);
        let mut inner = serde_json::json!({"model_type": "qwen3_5", "text_config": text});
        inner["text_config"]["mamba_ssm_dtype"] = "bfloat16".into();
        assert_eq!(read(&inner).unwrap().mamba_ssm_dtype, StateDtype::Bf16);
        let mut both = top.clone();
        both["text_config"]["mamba_ssm_dtype"] = "float32".into();
        assert_eq!(read(&both).unwrap().mamba_ssm_dtype, StateDtype::F32);
    }

    #[test]
    fn a_bad_mamba_ssm_dtype_is_refused_naming_field_and_value() {
        let text: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        for (value, needle) in [
            (
                serde_json::json!("float16"),
                "mamba_ssm_dtype = \"float16\"",
            ),
            (serde_json::json!(32), "mamba_ssm_dtype = 32"),
            (serde_json::json!("auto"), "mamba_ssm_dtype = \"auto\""),
        ] {
            let mut flat = text.clone();
            flat["mamba_ssm_dtype"] = value.clone();
            let err = Config::from_json(&flat.to_string())
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle) && err.contains("bfloat16"), "{err}");
            let mut vl = serde_json::json!({"model_type": "qwen3_5", "text_config": text});
            vl["text_config"]["mamba_ssm_dtype"] = value;
            let err = Config::from_json(&vl.to_string()).unwrap_err().to_string();
            assert!(err.contains("text_config.mamba_ssm_dtype"), "{err}");
        }
    }

    #[test]
    fn head_dim_defaults_to_hf_256() {
        let mut v: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        v.as_object_mut().unwrap().remove("head_dim");
        assert_eq!(Config::from_json(&v.to_string()).unwrap().head_dim, 256);
    }

    #[test]
    fn zero_sizes_and_overflowing_shapes_are_refused() {
        let v: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        for (key, value, needle) in [
            (
                "intermediate_size",
                serde_json::json!(0),
                "intermediate_size must be positive",
            ),
            (
                "linear_num_value_heads",
                serde_json::json!(0),
                "linear_num_value_heads must be positive",
            ),
            ("vocab_size", serde_json::json!(usize::MAX / 2), "overflow"),
        ] {
            let mut w = v.clone();
            w[key] = value;
            let err = Config::from_json(&w.to_string()).unwrap_err().to_string();
            assert!(err.contains(needle), "{key}: {err}");
        }
    }

    #[test]
    fn legacy_rope_fields_are_read() {
        let mut v: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_theta"] = 5e5.into();
        v["partial_rotary_factor"] = 0.5.into();
        let c = Config::from_json(&v.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.rotary_dim()), (5e5, 16));
    }

    #[test]
    fn unsupported_configs_are_refused_with_the_reason() {
        let mut v: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        for (key, value, needle) in [
            (
                "model_type",
                serde_json::json!("qwen3_5_moe"),
                "qwen3_5_moe without text_config",
            ),
            ("model_type", serde_json::json!("llama"), "\"llama\""),
            ("num_experts", serde_json::json!(8), "qwen3_5_moe_text"),
            ("hidden_act", serde_json::json!("gelu"), "gelu"),
            (
                "layer_types",
                serde_json::json!(["linear_attention"]),
                "layer_types has 1",
            ),
            (
                "num_key_value_heads",
                serde_json::json!(3),
                "not a multiple",
            ),
        ] {
            let saved = v[key].clone();
            v[key] = value;
            let err = Config::from_json(&v.to_string()).unwrap_err().to_string();
            assert!(err.contains(needle), "{key}: {err}");
            v[key] = saved;
        }
    }

    #[test]
    fn the_4b_benchmark_config_has_the_published_shapes() {
        let c = Config::from_json(QWEN35_4B_TEXT).unwrap();
        let full = c
            .layer_types
            .iter()
            .filter(|t| **t == LayerType::Full)
            .count();
        assert_eq!((c.layer_types.len(), full), (32, 8));
        assert_eq!(c.layer_types[3], LayerType::Full);
        assert_eq!((c.rotary_dim(), c.linear_conv_dim()), (64, 8192));
        assert!(c.tie_word_embeddings);
    }
}
