//! The accuracy gate's floor: the exact f32 CPU forward against HF's bf16 GPU
//! goldens (teacher-forced top-64 log-probabilities, prompts of 1 to 128
//! tokens and, for text_gva2, 4100 tokens). Any engine is judged against the
//! same goldens with the same method (`qwen35_testkit::gate`); an exact forward must
//! pass with a margin, and its statistics are the floor recorded in
//! docs/qwen35.md.

use qwen35::CpuModel;
use qwen35_testkit::gate::{compare, GateStats};
use qwen35_testkit::{Fixture, MODELS};

#[test]
fn exact_forward_passes_the_bf16_gate_on_every_golden() {
    for name in MODELS {
        let f = Fixture::load(name);
        let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        for (i, ids) in f.prompts.iter().enumerate() {
            let mut state = model.new_state();
            let logits = model.forward(ids, &mut state).unwrap();
            let (top_ids, top_lps) = f.golden(i);
            let s: GateStats = compare(&logits, &top_ids, &top_lps);
            println!(
                "{name} prompt {i} (T={}): regret {:.3} mean {:.4} p99 {:.4} argmax mismatches {}/{}",
                ids.len(), s.max_regret, s.mean_abs, s.p99_abs, s.argmax_mismatches, s.positions
            );
            assert!(s.passes(), "{name} prompt {i}: {s:?}");
        }
    }
}
