//! A compiled constraint's first step, taken once when it is compiled and
//! before any request uses it: the first mask, one token's advance and the
//! mask after it. A constraint that compiles can still be one no output
//! follows: a language with no string in it (`[^\s\S]`, a JSON schema
//! whose `$ref`s only loop, a Lark rule that never ends) leaves no token
//! and not even EOS allowed, which llguidance reports as `NoExtensionBias`
//! at the first mask; and a grammar past llguidance's per-step limits
//! (a regex whose automaton outgrows the lexer's fuel, a start row over
//! the Earley parser's item limit) fails on the first mask or the first
//! advance. Found here, either is a refusal the client gets as a 400;
//! found by the mask pool, it would fail the request after a token had
//! gone out.
//!
//! One step is a sample, not a proof: a grammar that only breaks its
//! limits deeper in (or after some other first token) still fails at
//! that step. The first step is where the hostile constraints seen in
//! practice fail, and it costs two masks once per compiled grammar (the
//! cache keeps what passed).

use llguidance::api::StopReason;
use llguidance::toktrie::TokTrie;
use llguidance::TokenParser;

use super::ConstraintError;

/// Takes `parser`'s first step on a copy that shares its lexer (the
/// automaton states built here serve the requests that follow); `trie`
/// names the EOS tokens.
pub(super) fn check_first_step(
    kind: &'static str,
    parser: &TokenParser,
    trie: &TokTrie,
) -> Result<(), ConstraintError> {
    let mut parser = parser.clone();
    parser.start_without_prompt();
    let mut tokens = match parser.compute_mask() {
        Ok(mask) => mask,
        Err(e) if parser.stop_reason() == StopReason::NoExtensionBias => {
            return Err(ConstraintError::Empty {
                kind,
                message: first_line(&e),
            });
        }
        Err(e) => return Err(too_complex(kind, "its first mask", &e)),
    };
    tokens.sub(&trie.eos_token_set());
    // The longest token allowed (the lowest id of those): the most bytes
    // through the lexer in one step, the deepest state the next mask
    // starts from. Only EOS allowed: the empty output, which is fine.
    let mut longest: Option<(usize, u32)> = None;
    tokens.iter_set_entries(|t| {
        let len = trie.token_len(t as u32);
        if longest.is_none_or(|(most, _)| len > most) {
            longest = Some((len, t as u32));
        }
    });
    let Some((_, token)) = longest else {
        return Ok(());
    };
    if let Err(e) = parser
        .consume_token(token)
        .and_then(|_| parser.check_stop())
    {
        return Err(too_complex(kind, "its first token", &e));
    }
    if parser.stopped() {
        return Ok(());
    }
    match parser.compute_mask() {
        Ok(_) => Ok(()),
        Err(e) => Err(too_complex(kind, "the mask after its first token", &e)),
    }
}

fn too_complex(
    kind: &'static str,
    step: &'static str,
    error: &impl std::fmt::Display,
) -> ConstraintError {
    ConstraintError::TooComplex {
        kind,
        step,
        message: first_line(error),
    }
}

/// llguidance's message without what follows its first line (a dump of
/// the parser's state where its errors are verbose).
fn first_line(error: &impl std::fmt::Display) -> String {
    let message = error.to_string();
    message
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}
