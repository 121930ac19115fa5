//! The bf16 recurrent state on the CPU reference forward (the oracle of the
//! GPU's `--mamba-ssm-cache-dtype bfloat16`), on the committed fixtures:
//! - after one token both dtypes computed the same f32 values: the bf16
//!   run's stored state is exactly the f32 run's rounded to bf16, and the
//!   logits are identical (the output reads the state before it is stored);
//! - every stored value of a bf16 run is a bf16 value, at every token;
//! - over a whole prompt, the first DeltaNet layer's state (the layer whose
//!   inputs do not depend on any earlier state) stays within the bound the
//!   rounding implies (below);
//! - the CPU executor loaded with `bfloat16` reports it and half the
//!   recurrent bytes, and runs the fixtures' prompts.
//!
//! The bound: a head's step is `S' = alpha S (I - beta k k^T) + beta v k^T`
//! with `||k|| <= 1` (L2-normalised, eps inside the root), `beta` in (0, 1)
//! and `alpha` in (0, 1], so `S -> alpha S (I - beta k k^T)` is
//! non-expansive in the Frobenius norm. With the same inputs (the first
//! DeltaNet layer sees the same tokens in both runs) the difference of the
//! two stored states grows per token by at most what the store rounds off,
//! `2^-9 ||S_bf16||` (round to nearest: half of bf16's 2^-8 relative
//! spacing), plus both runs' f32 arithmetic: a row's dot product over 128
//! terms is off by at most `128 * 2^-24 = 2^-17` of `||row||` (Cauchy-
//! Schwarz with `||k|| <= 1`), allowed here as `2^-16` of the larger state
//! norm per run. So `||S_bf16(t) - S_f32(t)||_F <= sum over tokens of
//! (2^-9 ||S_bf16|| + 2^-15 max(||S_bf16||, ||S_f32||))` per head.

use qwen35::engine_exec::{CpuExecutor, CpuSizing};
use qwen35::{CpuModel, LayerType, StateDtype, StateDtypeRequest};
use qwen35_testkit::drive::{run, Request};
use qwen35_testkit::{dir, Fixture, MODELS};

fn models(f: &Fixture) -> (CpuModel, CpuModel) {
    let load = |dtype| {
        CpuModel::load(f.config.clone(), &f.weights)
            .unwrap()
            .with_state_dtype(dtype)
    };
    (load(StateDtype::F32), load(StateDtype::Bf16))
}

fn linear_layers(model: &CpuModel) -> Vec<usize> {
    (0..model.config.layer_types.len())
        .filter(|&i| model.config.layer_types[i] == LayerType::Linear)
        .collect()
}

fn is_bf16(x: f32) -> bool {
    half::bf16::from_f32(x).to_f32() == x
}

#[test]
fn the_fixtures_say_nothing_so_the_state_stays_f32() {
    for name in MODELS {
        let f = Fixture::load(name);
        assert_eq!(f.config.mamba_ssm_dtype, StateDtype::F32, "{name}");
        let model = CpuModel::load(f.config.clone(), &f.weights).unwrap();
        assert_eq!(model.state_dtype(), StateDtype::F32, "{name}");
    }
}

#[test]
fn after_one_token_the_bf16_state_is_the_f32_state_rounded() {
    for name in MODELS {
        let f = Fixture::load(name);
        let (full, half) = models(&f);
        let token = &f.prompts[0][..1];
        let (mut sf, mut sh) = (full.new_state(), half.new_state());
        let lf = full.forward(token, &mut sf).unwrap();
        let lh = half.forward(token, &mut sh).unwrap();
        assert_eq!(lf, lh, "{name}: the first token's logits");
        let mut rounded_some = false;
        for layer in linear_layers(&full) {
            let (a, b) = (sf.recurrent(layer).unwrap(), sh.recurrent(layer).unwrap());
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                assert_eq!(
                    half::bf16::from_f32(x).to_f32(),
                    y,
                    "{name} layer {layer} [{i}]"
                );
                rounded_some |= x != y;
            }
        }
        assert!(rounded_some, "{name}: the f32 state was all bf16 values");
    }
}

#[test]
fn the_first_deltanet_layer_stays_within_the_rounding_bound_over_a_prompt() {
    let (u_store, u_f32) = (2f64.powi(-9), 2f64.powi(-15));
    for name in MODELS {
        let f = Fixture::load(name);
        let (full, half) = models(&f);
        let first = linear_layers(&full)[0];
        let c = &full.config;
        let head = c.linear_key_head_dim * c.linear_value_head_dim;
        let prompt = f.prompts.iter().max_by_key(|p| p.len()).unwrap();
        let tokens = &prompt[..prompt.len().min(512)];
        let (mut sf, mut sh) = (full.new_state(), half.new_state());
        let mut bound = vec![0f64; c.linear_num_value_heads];
        let mut worst = 0f64;
        for (t, tok) in tokens.iter().enumerate() {
            full.forward(&[*tok], &mut sf).unwrap();
            half.forward(&[*tok], &mut sh).unwrap();
            let (a, b) = (sf.recurrent(first).unwrap(), sh.recurrent(first).unwrap());
            for layer in linear_layers(&half) {
                let s = sh.recurrent(layer).unwrap();
                assert!(
                    s.iter().all(|&x| is_bf16(x)),
                    "{name} token {t} layer {layer}"
                );
            }
            for (h, bound) in bound.iter_mut().enumerate() {
                let (x, y) = (&a[h * head..(h + 1) * head], &b[h * head..(h + 1) * head]);
                let norm = |v: &[f32]| v.iter().map(|&e| (e as f64).powi(2)).sum::<f64>().sqrt();
                let diff: f64 = x
                    .iter()
                    .zip(y)
                    .map(|(&p, &q)| (p as f64 - q as f64).powi(2))
                    .sum::<f64>()
                    .sqrt();
                *bound += u_store * norm(y) + u_f32 * norm(x).max(norm(y));
                assert!(
                    diff <= *bound,
                    "{name} token {t} head {h}: ||bf16 - f32|| {diff:.3e} > bound {bound:.3e}"
                );
                worst = worst.max(diff / *bound);
            }
        }
        println!(
            "{name}: {} tokens, first DeltaNet layer within {worst:.3} of its bound at worst",
            tokens.len()
        );
        assert!(worst > 0.0, "{name}: the two runs never differed");
    }
}

#[test]
fn the_cpu_executor_takes_the_setting_and_reports_half_the_bytes() {
    for name in MODELS {
        let sizing = CpuSizing {
            num_slots: 4,
            num_pages: 4 * 16,
            page_size: 16,
            max_model_len: 256,
        };
        let load = |request| CpuExecutor::load_with_state_dtype(&dir(name), sizing, request);
        let auto = load(StateDtypeRequest::Auto).unwrap();
        let mut half = load(StateDtypeRequest::Fixed(StateDtype::Bf16)).unwrap();
        use engine::Executor;
        let (ga, gh) = (auto.state_geometry(), half.state_geometry());
        assert_eq!(
            (ga.recurrent_dtype, gh.recurrent_dtype),
            ("float32", "bfloat16")
        );
        assert_eq!(ga.recurrent_bytes_per_slot, 2 * gh.recurrent_bytes_per_slot);
        assert_eq!(
            ga.slot_bytes - gh.slot_bytes,
            gh.recurrent_bytes_per_slot,
            "{name}: only the recurrent part halves"
        );
        assert_eq!(half.model().state_dtype(), StateDtype::Bf16);
        let f = Fixture::load(name);
        let mut reqs: Vec<Request> = f
            .prompts
            .iter()
            .filter(|p| p.len() <= 128)
            .take(4)
            .enumerate()
            .map(|(slot, p)| Request::new(slot as u32, 16, p, 16, 8))
            .collect();
        run(&mut half, &mut reqs);
        assert!(reqs.iter().all(|r| r.done()), "{name}");
    }
}

#[test]
fn the_engine_publishes_the_state_dtype_and_bytes_in_its_metrics() {
    use engine::{Engine, EngineConfig, Executor};
    use prometheus::Encoder;
    let name = MODELS[0];
    let sizing = CpuSizing {
        num_slots: 3,
        num_pages: 3 * 16,
        page_size: 16,
        max_model_len: 256,
    };
    let registry = prometheus::Registry::new();
    let mut config = EngineConfig::new(vec![]);
    config.max_num_seqs = sizing.num_slots;
    let handle = Engine::start(
        config,
        move || {
            let request = StateDtypeRequest::Fixed(StateDtype::Bf16);
            let exec = CpuExecutor::load_with_state_dtype(&dir(name), sizing, request)
                .map_err(|e| e.to_string())?;
            Ok(Box::new(exec) as Box<dyn Executor>)
        },
        &registry,
    )
    .expect("engine starts");
    let f = Fixture::load(name);
    let c = &f.config;
    let linear = c
        .layer_types
        .iter()
        .filter(|t| **t == LayerType::Linear)
        .count();
    let per_slot =
        linear * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 2;
    let want = [
        format!("gdn:recurrent_state_slot_bytes{{dtype=\"bfloat16\"}} {per_slot}"),
        format!(
            "gdn:recurrent_state_bytes{{dtype=\"bfloat16\"}} {}",
            3 * per_slot
        ),
    ];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut text = vec![];
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        if want.iter().all(|w| text.lines().any(|l| l == w)) {
            assert!(!text.contains("dtype=\"float32\""), "{text}");
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "{want:?} not in:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(handle);
}
