//! How far a bf16 recurrent state drifts from the f32 state over a long
//! generation, on the CPU reference forward (the oracle of the GPU's
//! `--mamba-ssm-cache-dtype bfloat16`), for every fixture model:
//! - greedy generation from the fixture's first prompt with the f32 state
//!   and, separately, with the bf16 state: how many tokens agree, and where
//!   the first disagreement is;
//! - the bf16 state teacher-forced on the f32 run's tokens: the largest
//!   |logit difference| and |log-probability difference| at any position
//!   (the same contexts on both sides, so the numbers measure the state
//!   alone, not a diverged text), and how often the argmax differs;
//! - at the end, the relative Frobenius distance of each DeltaNet layer's
//!   state.
//!
//! Run: `cargo run -p qwen35 --example state_dtype_drift -- [TOKENS]`
//! (default 4096 generated tokens; fixtures from tests/fixtures or
//! `QWEN35_FIXTURES`). The numbers are in crates/server/README.md.

use qwen35::{CpuModel, CpuState, LayerType, StateDtype};
use qwen35_testkit::{Fixture, MODELS};

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// Greedy generation of `n` tokens after `prompt`; returns the tokens and
/// the logits row each was chosen from.
fn generate(model: &CpuModel, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>, CpuState) {
    let mut state = model.new_state();
    let mut row = model
        .forward_logits(prompt, &mut state, qwen35::RowLogits::Last)
        .unwrap()
        .pop()
        .unwrap();
    let (mut tokens, mut rows) = (vec![], vec![]);
    for _ in 0..n {
        let t = argmax(&row);
        tokens.push(t);
        rows.push(row);
        row = model.forward(&[t], &mut state).unwrap().pop().unwrap();
    }
    (tokens, rows, state)
}

/// The rows `model` gives teacher-forced on `tokens` after `prompt` (row i
/// predicts token i; one more row after the last token), and the state
/// after every token (as [`generate`] leaves it).
fn forced(model: &CpuModel, prompt: &[u32], tokens: &[u32]) -> (Vec<Vec<f32>>, CpuState) {
    let mut state = model.new_state();
    let mut rows = model
        .forward_logits(prompt, &mut state, qwen35::RowLogits::Last)
        .unwrap();
    rows.extend(model.forward(tokens, &mut state).unwrap());
    (rows, state)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("TOKENS: a number"))
        .unwrap_or(4096);
    println!("| fixture | generated | greedy tokens equal | first difference | teacher-forced max abs logit diff (max abs logit) | max abs logprob diff | argmax differs | state rel. distance at the end (max over layers) |");
    println!("|---|---|---|---|---|---|---|---|");
    for name in MODELS {
        let f = Fixture::load(name);
        let load = |dtype| {
            CpuModel::load(f.config.clone(), &f.weights)
                .unwrap()
                .with_state_dtype(dtype)
        };
        let (full, half) = (load(StateDtype::F32), load(StateDtype::Bf16));
        let prompt = &f.prompts[0];
        let (tokens_f, rows_f, state_f) = generate(&full, prompt, n);
        let (tokens_h, _, _) = generate(&half, prompt, n);
        let equal = tokens_f
            .iter()
            .zip(&tokens_h)
            .filter(|(a, b)| a == b)
            .count();
        let first = tokens_f.iter().zip(&tokens_h).position(|(a, b)| a != b);
        let (rows_h, state_h) = forced(&half, prompt, &tokens_f);
        let (mut max_logit, mut max_lp, mut argmax_diff) = (0f64, 0f64, 0usize);
        let mut scale = 0f64;
        for (a, b) in rows_f.iter().zip(&rows_h) {
            for (x, y) in a.iter().zip(b) {
                max_logit = max_logit.max((*x as f64 - *y as f64).abs());
                scale = scale.max((*x as f64).abs());
            }
            for (x, y) in log_softmax(a).iter().zip(log_softmax(b)) {
                max_lp = max_lp.max((x - y).abs());
            }
            argmax_diff += (argmax(a) != argmax(b)) as usize;
        }
        let mut rel = 0f64;
        for (i, t) in full.config.layer_types.iter().enumerate() {
            if *t != LayerType::Linear {
                continue;
            }
            let (a, b) = (state_f.recurrent(i).unwrap(), state_h.recurrent(i).unwrap());
            let d: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
                .sum();
            let s: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
            rel = rel.max((d / s.max(f64::MIN_POSITIVE)).sqrt());
        }
        let distinct = {
            let mut t = tokens_f.clone();
            t.sort();
            t.dedup();
            t.len()
        };
        println!(
            "| {name} ({}-token prompt, {distinct} distinct tokens generated) | {n} | {equal} / {n} | {} | {max_logit:.2e} ({scale:.2}) | {max_lp:.2e} | {argmax_diff} / {n} | {rel:.2e} |",
            prompt.len(),
            first.map_or("none".to_string(), |p| format!("token {p}")),
        );
    }
}
