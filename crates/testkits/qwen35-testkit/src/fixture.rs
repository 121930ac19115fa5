//! The tiny-model fixtures as the tests read them (one reader for the CPU
//! gate, the bf16 floor and the GPU gates): qwen35's tests/fixtures (or
//! `QWEN35_FIXTURES`), made by checks/fixtures/make_qwen35_fixtures.py.

use std::path::PathBuf;

use qwen35::{Config, Weights};
use safetensors::SafeTensors;

/// The tiny models of tests/fixtures.
pub const MODELS: [&str; 3] = ["text_gva2", "vl_gva1_sharded", "text_gva3_untied"];

/// The tiny MoE models of tests/fixtures (8 experts, top-2, a shared
/// expert): VL layout with fused 3-D expert tensors, sharded; text-only
/// layout with per-expert matrices. Their HF fp32 references are made on
/// the CPU, their bf16 goldens (when present) on a GPU.
pub const MOE_MODELS: [&str; 2] = ["moe_vl_fused", "moe_text_per_expert"];

/// HF's top-k per position: token ids and log-probabilities, best first.
pub type TopK = (Vec<Vec<u32>>, Vec<Vec<f32>>);

/// The directory of fixture `name`: under `QWEN35_FIXTURES` if set, else
/// qwen35's tests/fixtures.
pub fn dir(name: &str) -> PathBuf {
    std::env::var_os("QWEN35_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(FIXTURES))
        .join(name)
}

/// qwen35's tests/fixtures, from this crate's directory.
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../qwen35/tests/fixtures");

/// One fixture model: its checkpoint, prompts, and HF's outputs on them.
pub struct Fixture {
    pub dir: PathBuf,
    pub config: Config,
    pub weights: Weights,
    pub prompts: Vec<Vec<u32>>,
    /// (prompt index, prefix, steps)
    pub decode: (usize, usize, usize),
    /// `None` for fixtures made without a GPU (no bf16 goldens).
    golden: Option<Vec<u8>>,
    reference: Vec<u8>,
}

/// Rows of a 2-D tensor of 4-byte elements.
fn rows<T>(bytes: &[u8], key: &str, f: impl Fn([u8; 4]) -> T) -> Vec<Vec<T>> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let t = st.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
    let cols = t.shape()[1];
    t.data()
        .chunks_exact(4 * cols)
        .map(|r| {
            r.chunks_exact(4)
                .map(|b| f([b[0], b[1], b[2], b[3]]))
                .collect()
        })
        .collect()
}

impl Fixture {
    pub fn load(name: &str) -> Fixture {
        let d = dir(name);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("prompts.json")).unwrap())
                .unwrap();
        let prompts = meta["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect();
        let dec = &meta["decode"];
        let u = |k: &str| dec[k].as_u64().unwrap() as usize;
        Fixture {
            config: Config::from_file(&d.join("config.json")).unwrap(),
            weights: Weights::open(&d).unwrap(),
            prompts,
            decode: (u("prompt_index"), u("prefix"), u("steps")),
            golden: std::fs::read(d.join("golden_bf16.safetensors")).ok(),
            reference: std::fs::read(d.join("reference.safetensors")).unwrap(),
            dir: d,
        }
    }

    /// HF's bf16 top-k of prompt `i`.
    pub fn golden(&self, i: usize) -> TopK {
        self.golden_keys(&format!("topk_ids.{i}"), &format!("topk_logprobs.{i}"))
    }

    pub fn golden_keys(&self, ids_key: &str, lps_key: &str) -> TopK {
        let golden = self.golden.as_deref().unwrap_or_else(|| {
            panic!(
                "{}: no golden_bf16.safetensors (a fixture made without a GPU)",
                self.dir.display()
            )
        });
        (
            rows(golden, ids_key, |b| i32::from_le_bytes(b) as u32),
            rows(golden, lps_key, f32::from_le_bytes),
        )
    }

    /// HF's fp32 logits (`logits.<i>`, `decode.logits`).
    pub fn reference(&self, key: &str) -> Vec<Vec<f32>> {
        rows(&self.reference, key, f32::from_le_bytes)
    }

    /// A 1-D f32 tensor of the reference (the MoE fixtures'
    /// `router_margin.<layer>.<i>`).
    pub fn reference_vector(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.reference).unwrap();
        let t = st.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(t.shape().len(), 1, "{key}: not 1-D");
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// A 2-D int32 tensor of the reference as ids (the MoE fixtures'
    /// `router_topk.<layer>.<i>`: HF's chosen experts, best first).
    pub fn reference_ids(&self, key: &str) -> Vec<Vec<u32>> {
        rows(&self.reference, key, |b| i32::from_le_bytes(b) as u32)
    }

    /// HF's bf16 top-k at every position of the decode fixture's tokens
    /// (`decode_setup`'s prompt up to prefix + steps): the prompt's
    /// teacher-forced rows before the prefix's last token, then the cached
    /// decode's rows (`decode.topk_*`: the prefix's last token and each
    /// decoded one). What a MoE gate fits its routing to.
    pub fn golden_decode_positions(&self) -> TopK {
        let (pi, prefix, steps) = self.decode;
        let (mut ids, mut lps) = self.golden(pi);
        let (di, dl) = self.golden_keys("decode.topk_ids", "decode.topk_logprobs");
        assert_eq!(
            di.len(),
            steps + 1,
            "decode rows: the prefix's last, then each step"
        );
        ids.truncate(prefix - 1);
        lps.truncate(prefix - 1);
        ids.extend(di);
        lps.extend(dl);
        (ids, lps)
    }

    /// The decode fixture: the prompt, prefix length, decode steps, and the
    /// other short prompts that decode alongside it in batched runs.
    pub fn decode_setup(&self) -> (&[u32], usize, usize, Vec<&Vec<u32>>) {
        let (pi, prefix, steps) = self.decode;
        let ids = &self.prompts[pi];
        let others = self
            .prompts
            .iter()
            .filter(|p| p.len() > 1 && p.len() <= 128 && *p != ids)
            .collect();
        (ids, prefix, steps, others)
    }
}
