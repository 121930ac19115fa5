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

type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

/// A copy of the text_gva2 fixture whose model.safetensors went through `edit`.
fn damaged(edit: impl Fn(&mut Tensors)) -> tempfile::TempDir {
    damaged_copy("text_gva2", edit)
}

/// A copy of fixture `name` whose tensors (all shards merged into one
/// model.safetensors, names as stored) went through `edit`.
fn damaged_copy(name: &str, edit: impl Fn(&mut Tensors)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "generation_config.json"] {
        std::fs::copy(fixture(name).join(f), dir.path().join(f)).unwrap();
    }
    let mut tensors = Tensors::new();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let path = e.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap();
        if !file.starts_with("model") || !file.ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        tensors.extend(
            st.tensors()
                .into_iter()
                .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec()))),
        );
    }
    assert!(!tensors.is_empty(), "{name}: no weights read");
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
        text.replace("\"qwen3_5_text\"", "\"qwen3_next\""),
    )
    .unwrap();
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("qwen3_next") && err.contains("qwen3_5_moe_text"),
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

// MoE checkpoints: moe_vl_fused stores experts as fused 3-D tensors under
// the VL prefix, moe_text_per_expert as per-expert matrices. Errors name
// tensors as normalised to the text layout (`model.layers.L...`).

const VL: &str = "model.language_model.layers";

#[test]
fn undamaged_moe_copies_load_in_both_expert_layouts() {
    for name in ["moe_vl_fused", "moe_text_per_expert"] {
        let d = damaged_copy(name, |_| {});
        let m = load(d.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            m.config.architecture().to_string(),
            "MoE (8 experts, top-2, shared expert)"
        );
    }
}

#[test]
fn missing_or_misshaped_per_expert_tensors_are_named() {
    let d = damaged_copy("moe_text_per_expert", |t| {
        t.remove("model.layers.2.mlp.experts.5.up_proj.weight");
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.2.mlp.experts.5.up_proj.weight") && err.contains("missing"),
        "{err}"
    );
    let d = damaged_copy("moe_text_per_expert", |t| {
        let e = t
            .get_mut("model.layers.1.mlp.experts.3.down_proj.weight")
            .unwrap();
        e.1 = vec![32, 64]; // transposed: same bytes, [H, I] expected
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.1.mlp.experts.3.down_proj.weight")
            && err.contains("[32, 64]")
            && err.contains("[64, 32]"),
        "{err}"
    );
}

#[test]
fn missing_or_misshaped_fused_expert_tensors_are_named() {
    let d = damaged_copy("moe_vl_fused", |t| {
        t.remove(&format!("{VL}.1.mlp.experts.down_proj"));
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.1.mlp.experts.down_proj") && err.contains("missing"),
        "{err}"
    );
    let d = damaged_copy("moe_vl_fused", |t| {
        let e = t
            .get_mut(&format!("{VL}.3.mlp.experts.gate_up_proj"))
            .unwrap();
        e.1 = vec![8, 32, 128]; // same bytes, [E, 2I, H] = [8, 64, 64] expected
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.3.mlp.experts.gate_up_proj")
            && err.contains("[8, 32, 128]")
            && err.contains("[8, 64, 64]"),
        "{err}"
    );
    // No expert tensor at all: the fused layout's first tensor is missing.
    let d = damaged_copy("moe_vl_fused", |t| {
        t.retain(|n, _| !n.starts_with(&format!("{VL}.0.mlp.experts.")));
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.0.mlp.experts.gate_up_proj") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_layer_with_both_expert_layouts_is_refused_naming_one_of_each() {
    let d = damaged_copy("moe_vl_fused", |t| {
        let (dtype, _, bytes) = t[&format!("{VL}.0.mlp.shared_expert.up_proj.weight")].clone();
        // A [48, 64] matrix, as a per-expert tensor would sit next to the fused ones.
        t.insert(
            format!("{VL}.2.mlp.experts.0.gate_proj.weight"),
            (dtype, vec![48, 64], bytes),
        );
    });
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.2.mlp.experts.gate_up_proj")
            && err.contains("model.layers.2.mlp.experts.0.gate_proj.weight")
            && err.contains("two layouts"),
        "{err}"
    );
}

#[test]
fn missing_router_and_shared_expert_tensors_are_named() {
    for tensor in [
        "model.layers.0.mlp.gate.weight",
        "model.layers.3.mlp.shared_expert.down_proj.weight",
        "model.layers.1.mlp.shared_expert_gate.weight",
    ] {
        let d = damaged_copy("moe_text_per_expert", |t| {
            t.remove(tensor);
        });
        let err = load(d.path()).err().unwrap().to_string();
        assert!(err.contains(tensor) && err.contains("missing"), "{err}");
    }
}

#[test]
fn a_dense_checkpoint_declared_moe_is_refused_naming_the_router() {
    let d = damaged(|_| {});
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("config.json")).unwrap())
            .unwrap();
    config["model_type"] = "qwen3_5_moe_text".into();
    config["num_experts"] = 8.into();
    config["num_experts_per_tok"] = 2.into();
    std::fs::write(d.path().join("config.json"), config.to_string()).unwrap();
    let err = load(d.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.layers.0.mlp.gate.weight") && err.contains("missing"),
        "{err}"
    );
}
