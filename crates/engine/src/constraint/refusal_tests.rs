//! Constraints that compile but cannot be followed are refused by the
//! compile, before any request samples under them; a long choice list
//! compiles to one lexeme and works.

use std::time::{Duration, Instant};

use serde_json::json;

use super::matcher::RequestMatcher;
use super::{ConstraintError, ConstraintLimits, ConstraintSpec, StructuredOutputs};

const DEMO_TOKENIZER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");
const EOS: [u32; 2] = [604, 602];
const WIDTH: usize = 640;
/// What a refusal may take (the HTTP layer's promise), unoptimised build
/// included.
const PROMPT: Duration = Duration::from_secs(1);

fn compiler() -> StructuredOutputs {
    StructuredOutputs::from_tokenizer_file(
        DEMO_TOKENIZER.as_ref(),
        &EOS,
        ConstraintLimits::default(),
    )
    .unwrap()
}

/// The refusal of `spec`, checked to come within [`PROMPT`] and to leave
/// nothing in the cache.
fn refused(compiler: &StructuredOutputs, spec: ConstraintSpec) -> ConstraintError {
    let cached = compiler.cached_grammars();
    let started = Instant::now();
    let error = match compiler.compile(&spec) {
        Err(e) => e,
        Ok(_) => panic!("{spec:?} compiled"),
    };
    let took = started.elapsed();
    assert!(took < PROMPT, "{spec:?} took {took:?} to be refused");
    assert_eq!(
        compiler.cached_grammars(),
        cached,
        "a refusal is not cached"
    );
    error
}

fn empty(compiler: &StructuredOutputs, spec: ConstraintSpec) {
    match refused(compiler, spec.clone()) {
        ConstraintError::Empty { message, .. } => {
            assert_eq!(message, "NoExtensionBias", "{spec:?}")
        }
        other => panic!("{spec:?} gave {other:?}"),
    }
}

/// Byte-level BPE: the demo's single-byte tokens start at `!`.
fn byte(b: u8) -> u32 {
    (b - b'!') as u32
}

fn allowed(words: &[u32]) -> Vec<u32> {
    (0..words.len() as u32 * 32)
        .filter(|&t| words[t as usize / 32] >> (t % 32) & 1 == 1)
        .collect()
}

#[test]
fn a_schema_whose_refs_only_loop_is_refused_as_empty() {
    let compiler = compiler();
    empty(&compiler, ConstraintSpec::JsonSchema(json!({"$ref": "#"})));
    let cycle = json!({
        "$ref": "#/$defs/a",
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}
    });
    empty(&compiler, ConstraintSpec::JsonSchema(cycle));
    // A recursive schema that can end is fine.
    let tree = json!({
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}
    });
    compiler.compile(&ConstraintSpec::JsonSchema(tree)).unwrap();
}

#[test]
fn a_regex_or_grammar_with_an_empty_language_is_refused_as_empty() {
    let compiler = compiler();
    empty(&compiler, ConstraintSpec::Regex(r"[^\s\S]".into()));
    empty(&compiler, ConstraintSpec::Regex(r"a[^\s\S]".into()));
    empty(
        &compiler,
        ConstraintSpec::Lark("start: /[^\\s\\S]/\n".into()),
    );
    // A rule that never ends: no string in its language.
    empty(
        &compiler,
        ConstraintSpec::Lark("start: x\nx: x \"a\"\n".into()),
    );
    // The empty string is a language of one: only EOS may come.
    let mut matcher =
        RequestMatcher::new(compiler.compile(&ConstraintSpec::Regex("".into())).unwrap());
    assert_eq!(allowed(&matcher.mask(WIDTH).unwrap()), [602, 604]);
}

#[test]
fn a_regex_past_the_lexers_fuel_is_refused_at_compile_time() {
    let compiler = compiler();
    // Small enough to skip the compile-time precomputation, and its first
    // mask runs out of the lexer's fuel.
    let spec = ConstraintSpec::Regex("[a-z]?".repeat(200));
    match refused(&compiler, spec) {
        ConstraintError::TooComplex { step, message, .. } => {
            assert_eq!(step, "its first mask");
            assert!(message.contains("too many expressions"), "{message}");
        }
        other => panic!("gave {other:?}"),
    }
    // Larger: refused by the precomputation while compiling.
    let spec = ConstraintSpec::Regex("[a-z]?".repeat(400));
    match refused(&compiler, spec) {
        ConstraintError::Invalid { message, .. } => {
            assert!(message.contains("lexer precomputation failed"), "{message}")
        }
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn a_grammar_over_the_parsers_row_limit_is_refused_at_its_first_token() {
    let compiler = compiler();
    let alternatives: Vec<String> = (0..2000).map(|i| format!("\"c{i}\"")).collect();
    let lark = format!("start: {}\n", alternatives.join(" | "));
    match refused(&compiler, ConstraintSpec::Lark(lark)) {
        ConstraintError::TooComplex { step, message, .. } => {
            assert!(step.starts_with("its first token"), "{step}");
            assert!(message.contains("2001 items; max is 2000"), "{message}");
        }
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn two_thousand_choices_and_more_are_one_lexeme_and_work() {
    let compiler = compiler();
    for n in [2000, 5000] {
        let choices: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let spec = ConstraintSpec::Choice(choices);
        let mut matcher = RequestMatcher::new(compiler.compile(&spec).unwrap());
        for b in "c199".bytes() {
            let mask = allowed(&matcher.mask(WIDTH).unwrap());
            assert!(mask.contains(&byte(b)), "{n}: {b} not in {mask:?}");
            assert!(!matcher.advance(byte(b)).unwrap());
        }
        // `c199` may end or go on to `c1990`..`c1999`.
        let mask = allowed(&matcher.mask(WIDTH).unwrap());
        assert!(
            mask.contains(&EOS[0]) && mask.contains(&byte(b'9')),
            "{mask:?}"
        );
        // `c1999` is the end: no choice goes on from it.
        assert!(matcher.advance(byte(b'9')).unwrap());
        assert_eq!(allowed(&matcher.mask(WIDTH).unwrap()), [602, 604]);
    }
    // A prefix of another choice may end or go on; the empty choice and
    // DEL compile.
    let spec = ConstraintSpec::Choice(vec!["a".into(), "ab".into(), "".into(), "\u{7f}".into()]);
    let mut matcher = RequestMatcher::new(compiler.compile(&spec).unwrap());
    let first = allowed(&matcher.mask(WIDTH).unwrap());
    assert!(
        first.contains(&byte(b'a')) && first.contains(&EOS[0]),
        "{first:?}"
    );
    assert!(!matcher.advance(byte(b'a')).unwrap());
    let after_a = allowed(&matcher.mask(WIDTH).unwrap());
    assert_eq!(after_a, [byte(b'b'), 602, 604]);
    // The empty choice alone: only EOS.
    let spec = ConstraintSpec::Choice(vec!["".into()]);
    let mut matcher = RequestMatcher::new(compiler.compile(&spec).unwrap());
    assert_eq!(allowed(&matcher.mask(WIDTH).unwrap()), [602, 604]);
}
