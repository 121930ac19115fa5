//! The accuracy gate's floor: the exact f32 CPU forward against HF's bf16 GPU
//! goldens (teacher-forced top-64 log-probabilities, prompts of 1 to 128
//! tokens and, for text_gva2, 4100 tokens). Any engine is judged against the
//! same goldens with the same method (`qwen35::gate`); an exact forward must
//! pass with a margin, and its statistics are the floor recorded in
//! docs/qwen35.md.

use std::path::{Path, PathBuf};

use qwen35::gate::{compare, GateStats};
use qwen35::{Config, CpuModel, Weights};
use safetensors::SafeTensors;

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn rows<T>(st: &SafeTensors, key: &str, f: impl Fn(&[u8]) -> T) -> Vec<Vec<T>> {
    let t = st.tensor(key).unwrap();
    let cols = t.shape()[1];
    let flat: Vec<T> = t.data().chunks_exact(4).map(f).collect::<Vec<T>>();
    let mut out = vec![];
    let mut it = flat.into_iter();
    loop {
        let r: Vec<T> = it.by_ref().take(cols).collect();
        if r.is_empty() {
            break out;
        }
        out.push(r);
    }
}

#[test]
fn exact_forward_passes_the_bf16_gate_on_every_golden() {
    for name in ["text_gva2", "vl_gva1_sharded", "text_gva3_untied"] {
        let d = dir(name);
        let model = CpuModel::load(
            Config::from_file(&d.join("config.json")).unwrap(),
            &Weights::open(&d).unwrap(),
        )
        .unwrap();
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("prompts.json")).unwrap())
                .unwrap();
        let golden = std::fs::read(d.join("golden_bf16.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&golden).unwrap();
        for (i, p) in meta["prompts"].as_array().unwrap().iter().enumerate() {
            let ids: Vec<u32> = p
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let mut state = model.new_state();
            let logits = model.forward(&ids, &mut state).unwrap();
            let top_ids = rows(&st, &format!("topk_ids.{i}"), |b| {
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32
            });
            let top_lps = rows(&st, &format!("topk_logprobs.{i}"), |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            });
            let s: GateStats = compare(&logits, &top_ids, &top_lps);
            println!(
                "{name} prompt {i} (T={}): regret {:.3} mean {:.4} p99 {:.4} argmax mismatches {}/{}",
                ids.len(), s.max_regret, s.mean_abs, s.p99_abs, s.argmax_mismatches, s.positions
            );
            assert!(s.passes(), "{name} prompt {i}: {s:?}");
        }
    }
}
