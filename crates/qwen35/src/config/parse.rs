//! Reading a `config.json` into a [`Config`]: the layout its model_type
//! names, then the text settings, each refused with its reason where this
//! runtime does not implement it. The checks run in a fixed order, so a
//! config with several faults is always told of the same one.

use super::{moe, unsupported, Config, LayerType, MoeConfig, RawText, RawTop};
use crate::error::LoadError;
use crate::state_dtype;

impl Config {
    /// `origin` names the text in errors (the file's path).
    pub(super) fn parse(text: &str, origin: &str) -> Result<Config, LoadError> {
        let top: RawTop = serde_json::from_str(text).map_err(json_error(origin.to_string()))?;
        let model_type = top.model_type.clone().unwrap_or_default();
        let top_state_dtype = top.mamba_ssm_dtype.clone();
        let (vision_language, is_moe) = layout(&model_type)?;
        let (raw, top_tie) =
            text_settings(top, text, origin, &model_type, vision_language, is_moe)?;
        let moe = experts(&raw, is_moe, &model_type)?;
        let intermediate_size = dense_mlp_width(&raw, is_moe)?;
        refuse_unimplemented(&raw)?;
        let (rope_theta, partial_rotary_factor) = rope(&raw)?;
        // HF's Qwen3_5TextConfig default.
        let head_dim = raw.head_dim.unwrap_or(256);
        let layer_types = layer_types(&raw)?;
        // The flat layout's top level is its text config.
        let top_state_dtype = top_state_dtype.filter(|_| vision_language);
        let mamba_ssm_dtype =
            state_dtype::from_config(raw.mamba_ssm_dtype.as_ref(), top_state_dtype.as_ref())?;
        let c = Config {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads,
            head_dim,
            linear_num_key_heads: raw.linear_num_key_heads,
            linear_num_value_heads: raw.linear_num_value_heads,
            linear_key_head_dim: raw.linear_key_head_dim,
            linear_value_head_dim: raw.linear_value_head_dim,
            linear_conv_kernel_dim: raw.linear_conv_kernel_dim,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            partial_rotary_factor,
            tie_word_embeddings: top_tie.or(raw.tie_word_embeddings).unwrap_or(false),
            layer_types,
            vision_language,
            mamba_ssm_dtype,
            moe,
        };
        c.validate()?;
        Ok(c)
    }
}

/// A JSON error of the text that `what` names.
fn json_error(what: String) -> impl FnOnce(serde_json::Error) -> LoadError {
    move |source: serde_json::Error| LoadError::Json { what, source }
}

/// (vision-language, MoE) of each accepted model_type; the VL ones nest the
/// text config, whose model_type is the text-only one.
fn layout(model_type: &str) -> Result<(bool, bool), LoadError> {
    match model_type {
        "qwen3_5" => Ok((true, false)),
        "qwen3_5_text" => Ok((false, false)),
        "qwen3_5_moe" => Ok((true, true)),
        "qwen3_5_moe_text" => Ok((false, true)),
        other => Err(unsupported(format!(
            "model_type {other:?}: expected qwen3_5, qwen3_5_text, qwen3_5_moe or \
             qwen3_5_moe_text"
        ))),
    }
}

/// The text settings, with the top level's `tie_word_embeddings` where the
/// layout nests them under `text_config` (whose own model_type, if given,
/// must then be the text-only one); the flat layout's are the whole file.
fn text_settings(
    top: RawTop,
    text: &str,
    origin: &str,
    model_type: &str,
    vision_language: bool,
    is_moe: bool,
) -> Result<(RawText, Option<bool>), LoadError> {
    let text_type = if is_moe {
        "qwen3_5_moe_text"
    } else {
        "qwen3_5_text"
    };
    let (raw, top_tie): (RawText, Option<bool>) = if vision_language {
        let tc = top
            .text_config
            .ok_or_else(|| unsupported(format!("model_type {model_type} without text_config")))?;
        (
            serde_json::from_value(tc).map_err(json_error(format!("{origin}: text_config")))?,
            top.tie_word_embeddings,
        )
    } else {
        (
            serde_json::from_str(text).map_err(json_error(origin.to_string()))?,
            None,
        )
    };
    if let Some(mt) = &raw.model_type {
        if vision_language && mt != text_type {
            return Err(unsupported(format!(
                "text_config.model_type {mt:?}: expected {text_type} under {model_type}"
            )));
        }
    }
    Ok((raw, top_tie))
}

/// The experts of a MoE model; a dense one must not name any.
fn experts(raw: &RawText, is_moe: bool, model_type: &str) -> Result<Option<MoeConfig>, LoadError> {
    if is_moe {
        return Ok(Some(moe::moe_config(raw)?));
    }
    if raw.num_experts.unwrap_or(0) > 0 {
        return Err(unsupported(format!(
            "num_experts > 0 in a dense {model_type} config: a mixture-of-experts \
             checkpoint has model_type qwen3_5_moe or qwen3_5_moe_text"
        )));
    }
    Ok(None)
}

/// The dense MLP's width: required of a dense model, 0 for a MoE one.
fn dense_mlp_width(raw: &RawText, is_moe: bool) -> Result<usize, LoadError> {
    match (raw.intermediate_size, is_moe) {
        (Some(i), false) => Ok(i),
        (None, false) => Err(unsupported(
            "intermediate_size is missing (a dense model's MLP width)".into(),
        )),
        // MoE layers have no dense MLP; a value in the file is unused.
        (_, true) => Ok(0),
    }
}

/// Refuses the activation and attention variants this runtime lacks.
fn refuse_unimplemented(raw: &RawText) -> Result<(), LoadError> {
    if let Some(act) = &raw.hidden_act {
        if act != "silu" {
            return Err(unsupported(format!(
                "hidden_act {act:?}: only silu is implemented"
            )));
        }
    }
    if raw.attention_bias == Some(true) {
        return Err(unsupported(
            "attention_bias = true: Qwen3.5 attention has no biases".into(),
        ));
    }
    Ok(())
}

/// `(rope_theta, partial_rotary_factor)` of default RoPE (the only kind
/// implemented): `rope_parameters` first, then the legacy top-level fields,
/// then the defaults.
fn rope(raw: &RawText) -> Result<(f64, f64), LoadError> {
    let rope = raw.rope_parameters.as_ref();
    if let Some(t) = rope.and_then(|r| r.rope_type.as_deref()) {
        if t != "default" {
            return Err(unsupported(format!(
                "rope_type {t:?}: only default RoPE is implemented"
            )));
        }
    }
    let rope_theta = rope
        .and_then(|r| r.rope_theta)
        .or(raw.rope_theta)
        .unwrap_or(10_000_000.0);
    let partial_rotary_factor = rope
        .and_then(|r| r.partial_rotary_factor)
        .or(raw.partial_rotary_factor)
        .unwrap_or(0.25);
    Ok((rope_theta, partial_rotary_factor))
}

/// Each layer's mixer: `layer_types` where given, else full attention
/// every `full_attention_interval` layers (4 by default).
fn layer_types(raw: &RawText) -> Result<Vec<LayerType>, LoadError> {
    match (&raw.layer_types, raw.full_attention_interval) {
        (Some(types), _) => types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                "linear_attention" => Ok(LayerType::Linear),
                "full_attention" => Ok(LayerType::Full),
                other => Err(unsupported(format!("layer_types[{i}] = {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>(),
        (None, interval) => {
            let interval = interval.unwrap_or(4).max(1);
            Ok((0..raw.num_hidden_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerType::Full
                    } else {
                        LayerType::Linear
                    }
                })
                .collect())
        }
    }
}
