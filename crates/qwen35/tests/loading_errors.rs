//! Loading a damaged checkpoint fails with an error that names the tensor,
//! the file or the config field; nothing panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qwen35::{Config, CpuModel, LoadError, Weights};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A copy of the text_gva2 fixture whose model.safetensors went through `edit`.
fn damaged(
    edit: impl Fn(&mut BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "generation_config.json"] {
        std::fs::copy(fixture("text_gva2").join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(fixture("text_gva2").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
    dir
}

fn load(dir: &Path) -> Result<CpuModel, LoadError> {
    let config = Config::from_file(&dir.join("config.json"))?;
    CpuModel::load(config, &Weights::open(dir)?)
}

#[test]
fn the_undamaged_copy_loads() {
    let d = damaged(|_| {});
    assert!(load(d.path()).is_ok());
}

#[test]
fn missing_tensor_is_named() {
    let d = damaged(|t| {
        t.remove("model.layers.3.self_attn.q_norm.weight");
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.3.self_attn.q_norm.weight") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn wrong_shape_is_named_with_both_shapes() {
    let d = damaged(|t| {
        let e = t
            .get_mut("model.layers.0.linear_attn.in_proj_a.weight")
            .unwrap();
        e.1 = vec![2, 128]; // same bytes, other shape
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("in_proj_a.weight") && err.contains("[2, 128]") && err.contains("[4, 64]"),
        "{err}"
    );
}

#[test]
fn wrong_dtype_is_named() {
    let d = damaged(|t| {
        let e = t.get_mut("model.norm.weight").unwrap();
        e.0 = Dtype::I16; // 2-byte elements: same byte length, unusable dtype
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.norm.weight") && err.contains("I16"),
        "{err}"
    );
}

#[test]
fn missing_shard_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("vl_gva1_sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    // The second shard the index names (the fixture has several).
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let mut shards: Vec<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    shards.sort();
    shards.dedup();
    assert!(shards.len() >= 2, "fixture is not sharded: {shards:?}");
    std::fs::remove_file(dir.path().join(shards[1])).unwrap();
    let err = Weights::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains(shards[1]), "{err}");
}

#[test]
fn unsupported_config_is_refused_before_weights_are_read() {
    let d = damaged(|_| {});
    let text = std::fs::read_to_string(d.path().join("config.json")).unwrap();
    std::fs::write(
        d.path().join("config.json"),
        text.replace("\"qwen3_5_text\"", "\"qwen3_5_moe\""),
    )
    .unwrap();
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("qwen3_5_moe") && err.contains("mixture-of-experts"),
        "{err}"
    );
}

#[test]
fn token_outside_the_vocabulary_is_an_error() {
    let m = load(&fixture("text_gva2")).unwrap();
    let mut st = m.new_state();
    let err = m.forward(&[5, 320], &mut st).unwrap_err().to_string();
    assert!(err.contains("320") && err.contains("vocab_size"), "{err}");
}

#[test]
fn state_of_another_model_is_refused() {
    let a = load(&fixture("text_gva2")).unwrap();
    let b = load(&fixture("text_gva3_untied")).unwrap();
    let mut foreign = b.new_state();
    let err = a.forward(&[5], &mut foreign).unwrap_err().to_string();
    assert!(err.contains("other layers"), "{err}");
}

#[test]
fn shard_names_must_stay_inside_the_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}"#,
    )
    .unwrap();
    let err = Weights::open(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("../elsewhere.safetensors") && err.contains("plain file name"),
        "{err}"
    );
}
