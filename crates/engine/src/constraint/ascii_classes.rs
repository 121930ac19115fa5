//! A regex constraint reads the Perl classes as ASCII: `\d` is `[0-9]`, `\w`
//! is `[0-9A-Za-z_]` and `\s` is `[\t\n\x0B\x0C\r ]` (`\D`, `\W`, `\S` their
//! complements), as vLLM's default backend reads them. llguidance's regex
//! syntax makes them Unicode classes, so `\d{5}` let a random model write
//! digits such as '၆' or '۱' that no client expects.
//!
//! The rewrite turns each into the syntax's POSIX class (`[:digit:]`,
//! `[:word:]`, `[:space:]`, ASCII by definition), inside brackets as it is
//! and outside wrapped in a bracket of its own. Every other escape and
//! literal passes through unchanged; an escaped backslash stays one.

/// `regex` with its Perl classes made ASCII.
pub(crate) fn ascii_perl_classes(regex: &str) -> String {
    let mut out = String::with_capacity(regex.len() + 16);
    let mut chars = regex.chars().peekable();
    // Nesting depth of bracketed classes (the syntax allows `[a[b]]`).
    let mut depth = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => match posix_class(n) {
                    Some(class) if depth > 0 => out.push_str(class),
                    Some(class) => {
                        out.push('[');
                        out.push_str(class);
                        out.push(']');
                    }
                    None => {
                        out.push('\\');
                        out.push(n);
                    }
                },
                None => out.push('\\'),
            },
            '[' if depth > 0 && chars.peek() == Some(&':') => {
                // A POSIX class inside a bracket: copied up to its `:]`.
                out.push('[');
                while let Some(p) = chars.next() {
                    out.push(p);
                    if p == ':' && chars.peek() == Some(&']') {
                        out.push(chars.next().unwrap_or(']'));
                        break;
                    }
                }
            }
            '[' => {
                depth += 1;
                out.push('[');
                // A leading `^` negates; a `]` right after is a literal.
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap_or('^'));
                }
                if chars.peek() == Some(&']') {
                    out.push(chars.next().unwrap_or(']'));
                }
            }
            ']' if depth > 0 => {
                depth -= 1;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

/// The ASCII POSIX class (bracket form, without the outer brackets) of a
/// Perl class letter.
fn posix_class(letter: char) -> Option<&'static str> {
    Some(match letter {
        'd' => "[:digit:]",
        'D' => "[:^digit:]",
        'w' => "[:word:]",
        'W' => "[:^word:]",
        's' => "[:space:]",
        'S' => "[:^space:]",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::ascii_perl_classes as ascii;
    use crate::constraint::matcher::RequestMatcher;
    use crate::constraint::{ConstraintLimits, ConstraintSpec, StructuredOutputs};

    const DEMO_TOKENIZER: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../server/demo/tokenizer.json");

    /// The tokens a fresh matcher of `regex` allows, as their bytes.
    fn first_tokens(regex: &str) -> Vec<Vec<u8>> {
        let json = std::fs::read_to_string(DEMO_TOKENIZER).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let words = llguidance::token_bytes_from_tokenizer_json(&value).unwrap();
        let compiler = StructuredOutputs::from_tokenizer_file(
            DEMO_TOKENIZER.as_ref(),
            &[604],
            ConstraintLimits::default(),
        )
        .unwrap();
        let spec = ConstraintSpec::Regex(regex.into());
        let mask = RequestMatcher::new(compiler.compile(&spec).unwrap())
            .mask(words.len().next_multiple_of(32))
            .unwrap();
        (0..words.len())
            .filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1)
            .map(|t| words[t].clone())
            .collect()
    }

    #[test]
    fn a_compiled_digit_class_allows_ascii_digits_only() {
        // The demo's byte-level vocabulary has a token for every byte, so a
        // Unicode \d would allow the lead bytes of other scripts' digits.
        let digits = first_tokens(r"\d{5}");
        assert!(digits.iter().any(|w| w == b"0") && digits.iter().any(|w| w == b"9"));
        for word in &digits {
            assert!(
                word.iter().all(u8::is_ascii_digit),
                "{word:?} is allowed for \\d"
            );
        }
        let word_chars = first_tokens(r"\w");
        assert!(word_chars.iter().any(|w| w == b"_") && word_chars.iter().any(|w| w == b"Z"));
        for word in &word_chars {
            assert!(
                word.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_'),
                "{word:?} is allowed for \\w"
            );
        }
        for word in &first_tokens(r"\s") {
            assert!(
                word.iter().all(|b| b" \t\n\x0b\x0c\r".contains(b)),
                "{word:?}"
            );
        }
        // The complement still takes any other character, in any script,
        // and a Unicode class asked for by name stays Unicode.
        assert!(first_tokens(r"\D").iter().any(|w| !w.is_ascii()));
        assert!(first_tokens(r"\p{Nd}").iter().any(|w| !w.is_ascii()));
    }

    #[test]
    fn perl_classes_become_ascii_classes_in_and_out_of_brackets() {
        assert_eq!(ascii(r"\d{5}"), r"[[:digit:]]{5}");
        assert_eq!(
            ascii(r"\D\w\W\s\S"),
            r"[[:^digit:]][[:word:]][[:^word:]][[:space:]][[:^space:]]"
        );
        assert_eq!(ascii(r"[\d.]+"), r"[[:digit:].]+");
        assert_eq!(ascii(r"[^\s,]"), r"[^[:space:],]");
        assert_eq!(ascii(r"[a[\w-]]"), r"[a[[:word:]-]]");
    }

    #[test]
    fn everything_else_passes_through() {
        for regex in [
            r"[a-c]{2,6}x",
            r"\\d",
            r"\.\[\]\(\)\p{Greek}\x{41}\u{263A}\bword\b",
            r"[]\d]",
            r"[^]a]",
            r"[[:alpha:]\]]",
            r"trailing\",
            "",
        ] {
            let expected = match regex {
                r"[]\d]" => r"[][:digit:]]",
                _ => regex,
            };
            assert_eq!(ascii(regex), expected, "{regex}");
        }
    }
}
