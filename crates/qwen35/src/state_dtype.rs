//! The recurrent state's dtype as a setting, with vLLM's names and meaning:
//! config.json's `mamba_ssm_dtype` says what the model was made for, and
//! `--mamba-ssm-cache-dtype auto|float32|bfloat16` ([`StateDtypeRequest`])
//! overrides it (`auto`: take config.json's). A bf16 state is bf16 storage
//! with f32 math (see `gdn_kernels::StateDtype`); the conv state is bf16
//! either way.

use std::fmt;
use std::str::FromStr;

pub use gdn_kernels::StateDtype;

use crate::error::LoadError;

/// The config.json field naming the state dtype.
pub const CONFIG_FIELD: &str = "mamba_ssm_dtype";

/// The state dtype config.json asks for: the `mamba_ssm_dtype` of
/// `text_config` (the VL layout), else the top level's; float32 where
/// neither has one. Real Qwen3.5 configs say float32. vLLM would fall back
/// to the model dtype (bf16) where the field is absent; we keep HF's f32
/// there, and `--mamba-ssm-cache-dtype bfloat16` asks for bf16 explicitly.
/// Any value but `"float32"` or `"bfloat16"` is refused, naming the field.
pub(crate) fn from_config(
    text: Option<&serde_json::Value>,
    top: Option<&serde_json::Value>,
) -> Result<StateDtype, LoadError> {
    let (value, place) = match (text, top) {
        (Some(v), _) if !v.is_null() => (v, "text_config.mamba_ssm_dtype"),
        (_, Some(v)) if !v.is_null() => (v, CONFIG_FIELD),
        _ => return Ok(StateDtype::F32),
    };
    value
        .as_str()
        .and_then(StateDtype::from_name)
        .ok_or_else(|| {
            LoadError::UnsupportedConfig(format!(
                "{place} = {value}: expected \"float32\" or \"bfloat16\""
            ))
        })
}

/// What the runtime was asked for: `Auto` (config.json's
/// `mamba_ssm_dtype`) or a dtype that overrides it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateDtypeRequest {
    #[default]
    Auto,
    Fixed(StateDtype),
}

impl StateDtypeRequest {
    /// The dtype to run with, given the config's.
    pub fn resolve(self, from_config: StateDtype) -> StateDtype {
        match self {
            StateDtypeRequest::Auto => from_config,
            StateDtypeRequest::Fixed(d) => d,
        }
    }
}

/// A value of `--mamba-ssm-cache-dtype` that is not one of its choices.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown recurrent-state dtype {0:?}: expected auto, float32 or bfloat16")]
pub struct UnknownStateDtype(pub String);

impl FromStr for StateDtypeRequest {
    type Err = UnknownStateDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(StateDtypeRequest::Auto);
        }
        StateDtype::from_name(s)
            .map(StateDtypeRequest::Fixed)
            .ok_or_else(|| UnknownStateDtype(s.to_string()))
    }
}

impl fmt::Display for StateDtypeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateDtypeRequest::Auto => f.write_str("auto"),
            StateDtypeRequest::Fixed(d) => f.write_str(d.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_parse_with_vllms_names_and_refuse_others() {
        for (text, want) in [
            ("auto", StateDtypeRequest::Auto),
            ("float32", StateDtypeRequest::Fixed(StateDtype::F32)),
            ("bfloat16", StateDtypeRequest::Fixed(StateDtype::Bf16)),
        ] {
            let got: StateDtypeRequest = text.parse().unwrap();
            assert_eq!(got, want);
            assert_eq!(got.to_string(), text);
        }
        for bad in ["float16", "bf16", "fp32", "", "Float32"] {
            let err = bad.parse::<StateDtypeRequest>().unwrap_err();
            assert_eq!(err, UnknownStateDtype(bad.to_string()));
            assert!(err.to_string().contains("auto, float32 or bfloat16"));
        }
    }

    #[test]
    fn auto_takes_the_config_and_a_fixed_dtype_overrides_it() {
        for config in [StateDtype::F32, StateDtype::Bf16] {
            assert_eq!(StateDtypeRequest::Auto.resolve(config), config);
            for fixed in [StateDtype::F32, StateDtype::Bf16] {
                assert_eq!(StateDtypeRequest::Fixed(fixed).resolve(config), fixed);
            }
        }
    }

    #[test]
    fn text_config_wins_then_the_top_level_then_float32() {
        let (f32_, bf16_) = (json!("float32"), json!("bfloat16"));
        assert_eq!(
            from_config(Some(&bf16_), Some(&f32_)).unwrap(),
            StateDtype::Bf16
        );
        assert_eq!(from_config(None, Some(&bf16_)).unwrap(), StateDtype::Bf16);
        assert_eq!(
            from_config(Some(&json!(null)), Some(&bf16_)).unwrap(),
            StateDtype::Bf16
        );
        assert_eq!(from_config(None, None).unwrap(), StateDtype::F32);
    }
}
