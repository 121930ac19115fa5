//! Structured outputs end to end on the fake executor (its logits are a
//! hash of the history: a random model, so every valid output is the
//! constraint's doing) with the demo checkpoint's tokenizer: JSON schemas,
//! regexes, choices and Lark grammars sampled at temperature 1 all give
//! outputs that match and stop by the grammar; bad constraints are refused
//! with the compiler's message; a preempted constrained request samples
//! what it would have unpreempted.

use crate::common;

use std::time::Duration;

use common::{geometry, metric_value, metrics_text, Started};
use engine::{
    AdmissionPolicy, CacheGeometry, ConstraintError, ConstraintLimits, ConstraintSpec,
    EngineConfig, Event, FinishReason, GenerateRequest, SamplingParams, StopParams,
    StructuredOutputs, SubmitError,
};
use serde_json::{json, Value};

const DEMO_TOKENIZER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");
/// The demo model's logits width (its tokenizer has 635 tokens: the ids
/// above are never allowed) and EOS ids (`<|im_end|>`, `<|endoftext|>`).
const WIDTH: usize = 640;
const EOS: [u32; 2] = [604, 602];
/// Generous: a constrained output stops by its grammar long before.
const MAX_TOKENS: usize = 1000;

fn compiler(limits: ConstraintLimits) -> StructuredOutputs {
    StructuredOutputs::from_tokenizer_file(DEMO_TOKENIZER.as_ref(), &EOS, limits)
        .expect("the demo tokenizer loads")
}

fn start(geometry: CacheGeometry, max_num_seqs: usize, limits: ConstraintLimits) -> Started {
    start_compiling(geometry, max_num_seqs, compiler(limits))
}

fn start_compiling(
    geometry: CacheGeometry,
    max_num_seqs: usize,
    compiler: StructuredOutputs,
) -> Started {
    let mut config = EngineConfig::new(EOS.to_vec());
    config.max_num_batched_tokens = 4096;
    config.max_num_seqs = max_num_seqs;
    config.structured_outputs = Some(compiler);
    common::start(config, geometry)
}

fn wide(num_slots: usize, num_pages: usize, page_size: usize) -> CacheGeometry {
    CacheGeometry {
        vocab_size: WIDTH,
        ..geometry(num_slots, num_pages, page_size)
    }
}

fn constrained(constraint: ConstraintSpec, seed: u64) -> GenerateRequest {
    constrained_to(constraint, seed, MAX_TOKENS)
}

fn constrained_to(constraint: ConstraintSpec, seed: u64, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        // "<|im_start|>" then a few byte tokens: any prompt does.
        prompt: vec![603, 72, 105, 10],
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..Default::default()
        },
        stop: StopParams {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![],
            ignore_eos: false,
        },
        snapshot_points: Vec::new(),
        constraint: Some(constraint),
    }
}

/// Token bytes of the demo vocabulary (specials as their text).
fn vocabulary() -> Vec<Vec<u8>> {
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(DEMO_TOKENIZER).unwrap()).unwrap();
    llguidance::token_bytes_from_tokenizer_json(&json).unwrap()
}

/// The text of `tokens` without a final EOS.
fn text(vocab: &[Vec<u8>], tokens: &[u32]) -> String {
    let body = match tokens.last() {
        Some(t) if EOS.contains(t) => &tokens[..tokens.len() - 1],
        _ => tokens,
    };
    let bytes: Vec<u8> = body
        .iter()
        .flat_map(|&t| vocab[t as usize].iter().copied())
        .collect();
    String::from_utf8(bytes).expect("constrained output is UTF-8")
}

/// Submits every request at once; each one's tokens and finish reason.
async fn run(started: &Started, requests: Vec<GenerateRequest>) -> Vec<(Vec<u32>, FinishReason)> {
    let streams: Vec<_> = requests
        .into_iter()
        .map(|r| started.handle.submit(r).expect("accepted"))
        .collect();
    let mut out = Vec::new();
    for mut stream in streams {
        let mut tokens = Vec::new();
        loop {
            match stream.next().await.expect("a terminal event") {
                Event::Token(t) => tokens.push(t.token),
                Event::Finished { reason, .. } => {
                    out.push((tokens, reason));
                    break;
                }
                Event::Failed(f) => panic!("request failed: {f}"),
            }
        }
    }
    out
}

/// Asserts every output stopped by its grammar (not by length) and
/// returns their texts.
fn stopped_texts(vocab: &[Vec<u8>], outputs: &[(Vec<u32>, FinishReason)]) -> Vec<String> {
    outputs
        .iter()
        .map(|(tokens, reason)| {
            assert!(
                matches!(reason, FinishReason::Stop { .. }),
                "stopped by {reason:?} after {} tokens: {:?}",
                tokens.len(),
                text(vocab, tokens)
            );
            text(vocab, tokens)
        })
        .collect()
}

fn schemas() -> Vec<Value> {
    let name = json!({"type": "string", "maxLength": 12});
    vec![
        json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4}),
        json!({"type": "string", "enum": ["red", "green", "blue"]}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", 3, null]}}, "required": ["color"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "integer", "minimum": 10, "maximum": 99}, {"type": "string", "pattern": "^[a-z]{2,4}$"}]}),
        json!({"type": "number", "minimum": -1.5, "maximum": 2.5}),
        json!({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000}),
        json!({"type": "string", "pattern": "^[A-Z][a-z]{1,5}-[0-9]{3}$"}),
        json!({"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3}}, "required": ["id", "tags"], "additionalProperties": false}}, "required": ["user"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "string", "maxLength": 4}, "c": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}),
        json!({"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}], "items": false}),
        json!({"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "number", "minimum": -10, "maximum": 10}, "y": {"type": "number", "minimum": -10, "maximum": 10}}, "required": ["kind", "x", "y"], "additionalProperties": false}),
        json!({"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["v"], "additionalProperties": false}}, "type": "object", "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}}, "required": ["left", "right"], "additionalProperties": false}),
        json!({"type": ["integer", "null"], "minimum": 0, "maximum": 50}),
        json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[0-9]{4}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 20}}, "required": ["sku", "qty"], "additionalProperties": false}, "minItems": 1, "maxItems": 3}}, "required": ["items"], "additionalProperties": false}),
        json!({"type": "string", "format": "date"}),
        json!({"type": "object", "properties": {"mode": {"anyOf": [{"const": "fast"}, {"type": "object", "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["level"], "additionalProperties": false}]}}, "required": ["mode"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}, "minItems": 2, "maxItems": 3}),
        json!({"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "exclusiveMaximum": 100}, "currency": {"enum": ["EUR", "USD"]}, "note": {"type": "string", "minLength": 1, "maxLength": 8}}, "required": ["price", "currency"], "additionalProperties": false}),
    ]
}

#[tokio::test]
async fn json_schema_outputs_parse_validate_and_stop_by_the_grammar() {
    let compiler = compiler(ConstraintLimits::default());
    let started = start_compiling(wide(32, 2048, 16), 32, compiler.clone());
    let vocab = vocabulary();
    let schemas = schemas();
    assert_eq!(schemas.len(), 20);
    for (i, schema) in schemas.iter().enumerate() {
        let validator = jsonschema::validator_for(schema).expect("a valid test schema");
        let requests = (0..10)
            .map(|seed| constrained(ConstraintSpec::JsonSchema(schema.clone()), seed))
            .collect();
        let outputs = run(&started, requests).await;
        let longest = outputs.iter().map(|o| o.0.len()).max().unwrap();
        println!("schema {i}: longest output {longest} tokens");
        for text in stopped_texts(&vocab, &outputs) {
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("schema {i}: {text:?} does not parse: {e}"));
            assert!(
                validator.is_valid(&value),
                "schema {i}: {text} does not validate against {schema}"
            );
        }
    }
    let metrics = metrics_text(&started.registry);
    let masks = metric_value(&metrics, "gdn:structured_output_masks_total");
    assert!(masks >= 200.0, "masks counted: {masks}");
    let waits = metric_value(&metrics, "gdn:structured_output_mask_waits_total");
    assert!(waits <= masks);
    // One compile per schema: the ten requests of a schema share it.
    assert_eq!(compiler.cached_grammars(), 20);
}

#[tokio::test]
async fn json_object_regex_choice_and_lark_outputs_match() {
    let started = start(wide(16, 1024, 16), 16, ConstraintLimits::default());
    let vocab = vocabulary();
    let ten = |spec: ConstraintSpec| (0..10).map(move |s| constrained(spec.clone(), 100 + s));

    // Free-form objects: a random model ends a free string only when it
    // happens on a quote, so these run longer than the others.
    let objects = (0..10)
        .map(|s| constrained_to(ConstraintSpec::JsonObject, 100 + s, 8000))
        .collect();
    let objects = run(&started, objects).await;
    let longest = objects.iter().map(|o| o.0.len()).max().unwrap();
    println!("json_object: longest output {longest} tokens");
    for text in stopped_texts(&vocab, &objects) {
        // Any JSON: numbers beyond f64 too (serde_json's `Value` refuses
        // those; skipping the value checks the syntax only).
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
        assert!(text.trim_start().starts_with('{'), "not an object: {text}");
    }

    let pattern = "[a-c]{2,5}@[0-9]{1,3}\\.(com|org)";
    let full = regex_lite_match(pattern);
    let outputs = run(
        &started,
        ten(ConstraintSpec::Regex(pattern.into())).collect(),
    )
    .await;
    for text in stopped_texts(&vocab, &outputs) {
        assert!(full(&text), "{text:?} does not match {pattern}");
    }

    let choices = vec!["yes".to_string(), "no".into(), "maybe later".into()];
    let outputs = run(
        &started,
        ten(ConstraintSpec::Choice(choices.clone())).collect(),
    )
    .await;
    for text in stopped_texts(&vocab, &outputs) {
        assert!(choices.contains(&text), "{text:?} is not a choice");
    }

    // A tool call in Qwen's XML shape with JSON arguments.
    let lark = r#"
start: "<tool_call>\n" "{\"name\": \"get_weather\", \"arguments\": " args "}\n</tool_call>"
args: %json {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}
"#;
    let outputs = run(&started, ten(ConstraintSpec::Lark(lark.into())).collect()).await;
    let call_schema = json!({"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"]});
    let validator = jsonschema::validator_for(&call_schema).unwrap();
    for text in stopped_texts(&vocab, &outputs) {
        let body = text
            .strip_prefix("<tool_call>\n")
            .and_then(|t| t.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("not a tool call: {text:?}"));
        let call: Value = serde_json::from_str(body).expect("the call parses");
        assert!(validator.is_valid(&call), "{body}");
    }
}

/// A whole-string matcher for the test's one regex shape, written out by
/// hand (no regex engine in the test's dependencies).
fn regex_lite_match(pattern: &str) -> impl Fn(&str) -> bool {
    assert_eq!(pattern, "[a-c]{2,5}@[0-9]{1,3}\\.(com|org)");
    |s: &str| {
        let Some((user, rest)) = s.split_once('@') else {
            return false;
        };
        let Some((digits, tld)) = rest.split_once('.') else {
            return false;
        };
        (2..=5).contains(&user.len())
            && user.bytes().all(|b| (b'a'..=b'c').contains(&b))
            && (1..=3).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (tld == "com" || tld == "org")
    }
}

#[test]
fn bad_constraints_are_refused_with_the_compilers_message() {
    let limits = ConstraintLimits {
        max_text_bytes: 4096,
        ..ConstraintLimits::default()
    };
    let started = start(wide(4, 64, 16), 4, limits);
    let handle = &started.handle;
    let invalid = |spec: ConstraintSpec| match handle.check_constraint(&spec) {
        Err(ConstraintError::Invalid { message, .. }) => message,
        other => panic!("{spec:?} gave {other:?}"),
    };
    let bad_type = invalid(ConstraintSpec::JsonSchema(json!({"type": "nonsense"})));
    assert!(bad_type.contains("nonsense"), "{bad_type}");
    let unsupported = invalid(ConstraintSpec::JsonSchema(
        json!({"type": "array", "uniqueItems": true}),
    ));
    assert!(unsupported.contains("uniqueItems"), "{unsupported}");
    invalid(ConstraintSpec::JsonSchema(json!(["not", "a", "schema"])));
    invalid(ConstraintSpec::Regex("(unclosed".into()));
    invalid(ConstraintSpec::Lark("start: undefined_rule".into()));
    invalid(ConstraintSpec::Choice(vec![]));

    let huge = (0..2000).map(|i| format!("\"w{i}\"")).collect::<Vec<_>>();
    let huge = format!("start: {}", huge.join(" | "));
    match handle.check_constraint(&ConstraintSpec::Lark(huge.clone())) {
        Err(ConstraintError::TooLarge { bytes, limit, .. }) => {
            assert_eq!((bytes, limit), (huge.len(), 4096))
        }
        other => panic!("a huge grammar gave {other:?}"),
    }
    // The same refusal at submit, and nothing queued.
    let mut request = constrained(ConstraintSpec::Regex("(unclosed".into()), 1);
    assert!(matches!(
        handle.submit(request.clone()),
        Err(SubmitError::Constraint(ConstraintError::Invalid { .. }))
    ));
    request.constraint = Some(ConstraintSpec::Lark(huge));
    assert!(matches!(
        handle.submit(request),
        Err(SubmitError::Constraint(ConstraintError::TooLarge { .. }))
    ));
    assert_eq!(handle.stats().waiting, 0);
}

#[test]
fn grammars_over_the_compilers_size_limit_are_refused() {
    let limits = ConstraintLimits {
        max_grammar_size: 2_000,
        ..ConstraintLimits::default()
    };
    let started = start(wide(4, 64, 16), 4, limits);
    let properties: serde_json::Map<String, Value> = (0..400)
        .map(|i| {
            (
                format!("field{i}"),
                json!({"type": "string", "pattern": "^[a-z]{1,9}$"}),
            )
        })
        .collect();
    let schema = json!({"type": "object", "properties": properties, "required": ["field0"]});
    match started
        .handle
        .check_constraint(&ConstraintSpec::JsonSchema(schema))
    {
        Err(ConstraintError::Invalid { message, .. }) => {
            assert!(message.to_lowercase().contains("size"), "{message}")
        }
        other => panic!("an oversized grammar gave {other:?}"),
    }
}

#[test]
fn a_short_compile_timeout_refuses_a_slow_grammar() {
    let limits = ConstraintLimits {
        compile_timeout: Duration::from_nanos(1),
        ..ConstraintLimits::default()
    };
    let started = start(wide(4, 64, 16), 4, limits);
    let spec = ConstraintSpec::JsonSchema(schemas()[15].clone());
    assert!(matches!(
        started.handle.check_constraint(&spec),
        Err(ConstraintError::CompileTimeout { .. })
    ));
}

#[test]
fn an_engine_without_a_tokenizer_refuses_constraints() {
    let started = common::start(EngineConfig::new(EOS.to_vec()), wide(4, 64, 16));
    let spec = ConstraintSpec::JsonObject;
    assert_eq!(
        started.handle.check_constraint(&spec),
        Err(ConstraintError::Unsupported)
    );
    assert_eq!(
        started.handle.submit(constrained(spec, 1)).err(),
        Some(SubmitError::Constraint(ConstraintError::Unsupported))
    );
}

#[tokio::test]
async fn a_preempted_constrained_request_samples_what_it_would_have() {
    let schema = schemas()[0].clone();
    let requests: Vec<GenerateRequest> = (0..6)
        .map(|seed| constrained_to(ConstraintSpec::JsonSchema(schema.clone()), 40 + seed, 150))
        .collect();
    // Room for all of them at once.
    let roomy = start(wide(8, 512, 4), 8, ConstraintLimits::default());
    let alone = run(&roomy, requests.clone()).await;
    assert_eq!(roomy.handle.stats().preemptions, 0);
    // Few pages of 4 tokens: the outputs outgrow them and the latest
    // admitted are preempted and recomputed (the watermark admits them).
    let mut config = EngineConfig::new(EOS.to_vec());
    config.max_num_batched_tokens = 4096;
    config.max_num_seqs = 8;
    config.structured_outputs = Some(compiler(ConstraintLimits::default()));
    config.admission = AdmissionPolicy::Watermark;
    let tight = common::start(config, wide(8, 40, 4));
    let squeezed = run(&tight, requests).await;
    let longest = alone.iter().map(|o| o.0.len()).max().unwrap();
    println!("longest output {longest} tokens");
    assert!(
        tight.handle.stats().preemptions > 0,
        "the pool was meant to force preemption"
    );
    assert_eq!(squeezed, alone);
    let vocab = vocabulary();
    for text in stopped_texts(&vocab, &squeezed) {
        serde_json::from_str::<Value>(&text).expect("parses");
    }
}

#[tokio::test]
async fn min_tokens_bans_apply_within_the_grammar_and_give_way_when_it_must_end() {
    let started = start(wide(16, 256, 16), 16, ConstraintLimits::default());
    let vocab = vocabulary();
    let with_min = |spec: ConstraintSpec, seed: u64| {
        let mut r = constrained_to(spec, seed, 200);
        r.stop.min_tokens = 6;
        r
    };
    // EOS is banned below 6 tokens while letters are allowed: every output
    // that ends on EOS has at least 6 tokens before it.
    let letters = ConstraintSpec::Regex("[a-z]{1,40}".into());
    let outputs = run(
        &started,
        (0..10)
            .map(|s| with_min(letters.clone(), 300 + s))
            .collect(),
    )
    .await;
    for ((tokens, reason), text) in outputs.iter().zip(stopped_texts(&vocab, &outputs)) {
        assert!(text.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");
        match reason {
            FinishReason::Stop { token } if EOS.contains(token) => {
                assert!(tokens.len() > 6, "EOS after {} tokens", tokens.len() - 1)
            }
            _ => assert_eq!(text.len(), 40, "ended by the grammar at its limit"),
        }
    }
    // Only "yes" is allowed, shorter than min_tokens: the grammar wins.
    let yes = ConstraintSpec::Choice(vec!["yes".into()]);
    let outputs = run(&started, vec![with_min(yes, 7)]).await;
    assert_eq!(stopped_texts(&vocab, &outputs), ["yes"]);
}

#[tokio::test]
async fn prefix_cache_hits_leave_constrained_outputs_unchanged() {
    let mut config = EngineConfig::new(EOS.to_vec());
    config.max_num_batched_tokens = 4096;
    config.max_num_seqs = 8;
    config.structured_outputs = Some(compiler(ConstraintLimits::default()));
    config.prefix_cache = engine::prefix_cache::PrefixCacheConfig {
        enabled: true,
        max_snapshots: 32,
        snapshot_after: vec![],
        snapshot_interval: 0,
        snapshot_before_last_token: true,
        in_step_snapshots: true,
    };
    let started = common::start_with_snapshots(config, wide(8, 512, 4), 32);
    let schema = ConstraintSpec::JsonSchema(schemas()[12].clone());
    let request = |seed: u64| {
        let mut r = constrained_to(schema.clone(), seed, 400);
        r.prompt = (0..40).map(|i| 1 + (i * 37) % 500).collect();
        r
    };
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let mut round = Vec::new();
        for seed in 0..3 {
            let mut stream = started.handle.submit(request(seed)).expect("accepted");
            let mut tokens = Vec::new();
            loop {
                match stream.next().await.expect("a terminal event") {
                    Event::Token(t) => tokens.push(t.token),
                    Event::Finished { reason, usage } => {
                        round.push((tokens, reason, usage.cached_tokens));
                        break;
                    }
                    Event::Failed(f) => panic!("request failed: {f}"),
                }
            }
        }
        rounds.push(round);
    }
    // The first request of the first round had nothing cached; every
    // request of the second round resumed from the shared prompt.
    assert_eq!(rounds[0][0].2, 0);
    assert!(rounds[1].iter().all(|r| r.2 > 0), "{:?}", rounds[1]);
    let tokens = |round: &[(Vec<u32>, FinishReason, usize)]| {
        round.iter().map(|r| (r.0.clone(), r.1)).collect::<Vec<_>>()
    };
    assert_eq!(tokens(&rounds[1]), tokens(&rounds[0]));
    let vocab = vocabulary();
    for text in stopped_texts(&vocab, &tokens(&rounds[1])) {
        serde_json::from_str::<Value>(&text).expect("parses");
    }
}

/// A compiler read on its own thread (the server's start does not wait for
/// the vocabulary) serves the first request once the read is done; one
/// whose vocabulary cannot be read refuses every constraint as unsupported.
#[test]
fn a_compiler_read_in_the_background_serves_once_read() {
    let spawned = StructuredOutputs::spawn_from_tokenizer_file(
        DEMO_TOKENIZER.into(),
        EOS.to_vec(),
        ConstraintLimits::default(),
    );
    assert_eq!(spawned.vocab_size(), 635);
    let started = start_compiling(wide(4, 64, 16), 4, spawned);
    let choice = ConstraintSpec::Choice(vec!["yes".into(), "no".into()]);
    started.handle.check_constraint(&choice).expect("compiles");

    let missing = StructuredOutputs::spawn_from_tokenizer_file(
        "/nonexistent/tokenizer.json".into(),
        EOS.to_vec(),
        ConstraintLimits::default(),
    );
    assert_eq!(missing.vocab_size(), 0);
    let started = start_compiling(wide(4, 64, 16), 4, missing);
    let e = started.handle.check_constraint(&choice).unwrap_err();
    assert!(matches!(e, ConstraintError::Unsupported), "{e}");
}
