//! A constraint that passes its compile-time first step but breaks
//! llguidance's limits deeper in fails its request at that step, and the
//! token of the failed step (drawn with nothing allowed) never goes out:
//! the client sees the valid output up to there, then the failure. The
//! compile-time refusals themselves are the constraint module's unit tests.

use crate::common;

use common::{geometry, metric_value, metrics_text};
use engine::{
    CacheGeometry, ConstraintLimits, ConstraintSpec, EngineConfig, Event, FailureCause,
    GenerateRequest, SamplingParams, StopParams, StructuredOutputs,
};
use serde_json::Value;

const DEMO_TOKENIZER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");
/// The demo tokenizer's logits width and EOS ids.
const WIDTH: usize = 640;
const EOS: [u32; 2] = [604, 602];

#[tokio::test]
async fn a_constraint_failing_mid_output_withholds_the_failed_steps_token() {
    let compiler = StructuredOutputs::from_tokenizer_file(
        DEMO_TOKENIZER.as_ref(),
        &EOS,
        ConstraintLimits::default(),
    )
    .unwrap();
    let mut config = EngineConfig::new(EOS.to_vec());
    config.structured_outputs = Some(compiler);
    let started = common::start(
        config,
        CacheGeometry {
            vocab_size: WIDTH,
            ..geometry(2, 64, 16)
        },
    );
    // A literal longer than any token, then a rule of 2,000 alternatives:
    // the first step passes (one token into the literal), the row after
    // the literal is over llguidance's 2,000 items.
    let prefix = "abcdefghijklmnopqrstuvwxyz";
    let alternatives: Vec<String> = (0..2000).map(|i| format!("\"c{i}\"")).collect();
    let lark = format!("start: \"{prefix}\" y\ny: {}\n", alternatives.join(" | "));
    let spec = ConstraintSpec::Lark(lark);
    started
        .handle
        .check_constraint(&spec)
        .expect("its first step passes");
    let request = GenerateRequest {
        prompt: vec![603, 72, 105, 10],
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..Default::default()
        },
        stop: StopParams {
            max_tokens: 100,
            min_tokens: 0,
            stop_token_ids: vec![],
            ignore_eos: false,
        },
        snapshot_points: Vec::new(),
        constraint: Some(spec),
    };
    let mut stream = started.handle.submit(request).unwrap();
    let mut tokens = Vec::new();
    let failure = loop {
        match stream.next().await.expect("a terminal event") {
            Event::Token(t) => tokens.push(t.token),
            Event::Finished { reason, .. } => panic!("finished ({reason:?}) after {tokens:?}"),
            Event::Failed(f) => break f,
        }
    };
    assert_eq!(failure.cause, FailureCause::StepFailed);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(DEMO_TOKENIZER).unwrap()).unwrap();
    let vocab = llguidance::token_bytes_from_tokenizer_json(&json).unwrap();
    let text: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| vocab[t as usize].iter().copied())
        .collect();
    // Every token that went out is the constraint's: the whole literal,
    // and nothing of the step whose mask failed.
    assert_eq!(String::from_utf8(text).unwrap(), prefix);
    let metrics = metrics_text(&started.registry);
    let failed = "vllm:request_success_total{finished_reason=\"error\"}";
    assert_eq!(metric_value(&metrics, failed), 1.0);
    common::assert_clean(&started);
}
