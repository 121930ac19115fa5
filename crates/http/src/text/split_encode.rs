//! Long prompts tokenized in pieces on several threads, with the ids a
//! single `encode` gives.
//!
//! `tokenizers` encodes one text on one thread, and all of it is on the
//! request's path to its first token: for long prompts that time counts
//! (measured with this crate's build of `tokenizers`, fancy-regex, in
//! docs/results/h200-2026-12-01/README.md, "Where TTFT goes at c = 1"). For tokenizers of Qwen's pipeline the text can be cut
//! where the result cannot change, and the pieces encoded in parallel
//! (`encode_batch_fast`, rayon):
//!
//! - normalizer NFC (or none): a cut before an ASCII space changes nothing
//!   (a space is a starter that never composes with what precedes it, and
//!   canonical reordering stops at starters);
//! - added tokens without spaces, `lstrip`, `rstrip` or `single_word`: no
//!   added-token match can span a cut before a space, so each piece finds
//!   the same ones;
//! - pre-tokenizer: a Qwen split regex ([`QWEN_SPLIT_REGEXES`], no
//!   look-behind or anchors) then byte-level without a prefix space. In those
//!   regexes a space inside a match is either its first character or part of
//!   a whitespace run, so when the character before the space is not
//!   whitespace a match ends exactly at the cut, and matching restarts there
//!   in the whole text just as it starts in the piece;
//! - model BPE without dropout (each pre-token is merged on its own); no
//!   post-processor other than byte-level (it adds no ids), no truncation,
//!   no padding.
//!
//! Any other tokenizer is encoded whole. Tests compare the pieces' ids with
//! the whole text's on many texts (`tests::pieces_give_the_whole_texts_ids`).
//!
//! Pieces: one per available core at most; `GDN_TOKENIZER_THREADS=N` caps
//! them (1: every text encoded whole, as before; for measurements).

use serde_json::{json, Value as Json};
use tokenizers::{ModelWrapper, Tokenizer};

/// The pre-tokenizer regexes of Qwen tokenizers: Qwen3.5's (letters with
/// their combining marks; the demo's and the benchmark's tokenizer), and
/// Qwen2/2.5/3's.
pub const QWEN_SPLIT_REGEXES: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Texts shorter than this are encoded whole (a piece's share of the
/// thread hand-off would outweigh what it saves).
pub const MIN_PIECE_BYTES: usize = 2048;

/// Whether `tokenizer` has the pipeline the cuts are proven for (module docs).
pub fn cuts_are_safe(tokenizer: &Tokenizer) -> bool {
    let normalizer_ok = match tokenizer.get_normalizer() {
        None => true,
        Some(n) => serde_json::to_value(n).ok() == Some(json!({"type": "NFC"})),
    };
    let pre_ok = tokenizer
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok())
        .is_some_and(|v| is_qwen_pre_tokenizer(&v));
    let model_ok = matches!(tokenizer.get_model(), ModelWrapper::BPE(b) if b.dropout.is_none());
    let post_ok = match tokenizer.get_post_processor() {
        None => true,
        Some(p) => serde_json::to_value(p)
            .ok()
            .is_some_and(|v| v["type"] == "ByteLevel"),
    };
    let added_ok = tokenizer.get_added_tokens_decoder().values().all(|t| {
        !t.content.chars().any(char::is_whitespace) && !t.lstrip && !t.rstrip && !t.single_word
    });
    normalizer_ok
        && pre_ok
        && model_ok
        && post_ok
        && added_ok
        && tokenizer.get_truncation().is_none()
        && tokenizer.get_padding().is_none()
}

fn is_qwen_pre_tokenizer(v: &Json) -> bool {
    let Some(steps) = v["pretokenizers"].as_array() else {
        return false;
    };
    v["type"] == "Sequence"
        && steps.len() == 2
        && QWEN_SPLIT_REGEXES.iter().any(|r| {
            steps[0]
                == json!({
                    "type": "Split",
                    "pattern": {"Regex": r},
                    "behavior": "Isolated",
                    "invert": false,
                })
        })
        && steps[1]["type"] == "ByteLevel"
        && steps[1]["add_prefix_space"] == false
        && steps[1]["use_regex"] == false
}

/// Cuts `text` into at most `pieces` pieces of at least [`MIN_PIECE_BYTES`]
/// (except the last), each cut right before an ASCII space whose preceding
/// character is not whitespace. Fewer pieces when the text has no such
/// spaces where needed; one piece for short texts.
pub fn cut(text: &str, pieces: usize) -> Vec<&str> {
    let pieces = pieces.min(text.len() / MIN_PIECE_BYTES).max(1);
    let target = (text.len() / pieces).max(MIN_PIECE_BYTES);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    while out.len() + 1 < pieces {
        // The first allowed cut at or after start + target.
        let from = start + target;
        if from >= text.len() {
            break;
        }
        let at = (from..bytes.len()).find(|&p| {
            bytes[p] == b' '
                && text[..p]
                    .chars()
                    .next_back()
                    .is_some_and(|c| !c.is_whitespace())
        });
        let Some(at) = at else { break };
        out.push(&text[start..at]);
        start = at;
    }
    out.push(&text[start..]);
    out
}

/// The ids of `text`: in parallel pieces when `safe` (see
/// [`cuts_are_safe`]) and the text is long enough, else one encode.
pub fn encode(
    tokenizer: &Tokenizer,
    safe: bool,
    text: &str,
    add_special_tokens: bool,
) -> tokenizers::Result<Vec<u32>> {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match std::env::var("GDN_TOKENIZER_THREADS").map(|v| v.parse::<usize>()) {
            Ok(Ok(n)) if n >= 1 => n.min(cores),
            _ => cores,
        }
    });
    let pieces = if safe { cut(text, threads) } else { vec![text] };
    if pieces.len() == 1 {
        return Ok(tokenizer
            .encode_fast(text, add_special_tokens)?
            .get_ids()
            .to_vec());
    }
    let encodings = tokenizer.encode_batch_fast(pieces, add_special_tokens)?;
    Ok(encodings
        .iter()
        .flat_map(|e| e.get_ids().iter().copied())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tokenizer of gdn-server's embedded demo checkpoint (Qwen3.5's).
    fn demo_tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/demo");
        Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    fn whole(t: &Tokenizer, text: &str) -> Vec<u32> {
        t.encode_fast(text, true).unwrap().get_ids().to_vec()
    }

    /// A deterministic mix of what the cuts must survive: words of several
    /// scripts, combining marks (NFD input that NFC composes), digits,
    /// punctuation runs, contractions, runs of spaces, tabs and newlines
    /// before and after words, special tokens, and long runs without spaces.
    fn texts() -> Vec<String> {
        let atoms = [
            "hello",
            "World",
            "it's",
            "they'LL",
            "don't",
            " ",
            "  ",
            "   ",
            "\t",
            "\n",
            "\n\n",
            " \n ",
            "\r\n",
            "123",
            "4.56",
            "!!",
            "?!.",
            "(x)",
            "->",
            "Привет",
            "мир",
            "東京都",
            "中国青年创先争优",
            "e\u{301}",
            "a\u{308}\u{301}",
            "\u{1100}\u{1161}",
            "ﬁ",
            "\u{2003}",
            "<|im_start|>",
            "<|im_end|>",
            "user",
            "<think>",
            "é",
            "ÿ",
            "🙂",
            "x\u{200d}y",
        ];
        let mut out = Vec::new();
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for n in [10usize, 200, 900, 1500, 3000, 6000] {
            for _ in 0..4 {
                let mut s = String::new();
                for _ in 0..n {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    s.push_str(atoms[(state >> 33) as usize % atoms.len()]);
                }
                out.push(s);
            }
        }
        // Long texts with no allowed cut, and one made of spaces only.
        out.push("字".repeat(9000));
        out.push(" ".repeat(9000));
        out.push(format!("{}end", "a ".repeat(5000)));
        out
    }

    #[test]
    fn the_demo_tokenizer_has_the_qwen_pipeline() {
        assert!(cuts_are_safe(&demo_tokenizer()));
    }

    /// The demo tokenizer with Qwen2's split regex instead of Qwen3.5's.
    fn qwen2_regex_tokenizer() -> Tokenizer {
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::pre_tokenizers::sequence::Sequence;
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        use tokenizers::SplitDelimiterBehavior;
        let split = Split::new(
            SplitPattern::Regex(QWEN_SPLIT_REGEXES[1].into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap();
        let mut t = demo_tokenizer();
        t.with_pre_tokenizer(Some(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])));
        t
    }

    #[test]
    fn pieces_give_the_whole_texts_ids() {
        same_ids_whole_and_in_pieces(&demo_tokenizer());
    }

    #[test]
    fn pieces_give_the_whole_texts_ids_with_qwen2s_regex() {
        let t = qwen2_regex_tokenizer();
        assert!(cuts_are_safe(&t));
        same_ids_whole_and_in_pieces(&t);
    }

    fn same_ids_whole_and_in_pieces(t: &Tokenizer) {
        let mut cut_somewhere = 0;
        for text in texts() {
            let want = whole(t, &text);
            for pieces in [2, 3, 8, 16] {
                let parts = cut(&text, pieces);
                assert_eq!(parts.concat(), text, "cuts lose no byte");
                if parts.len() > 1 {
                    cut_somewhere += 1;
                }
                let got: Vec<u32> = parts.iter().flat_map(|p| whole(t, p)).collect();
                assert_eq!(
                    got,
                    want,
                    "{pieces} pieces of {:?}",
                    &text[..text.len().min(80)]
                );
            }
            assert_eq!(encode(t, true, &text, true).unwrap(), want);
        }
        assert!(
            cut_somewhere > 20,
            "the texts exercise the cuts ({cut_somewhere})"
        );
    }

    #[test]
    fn cuts_fall_only_before_a_space_after_non_whitespace() {
        let text = format!("{}  \n word{}", "ab ".repeat(2000), " cd".repeat(2000));
        let parts = cut(&text, 4);
        assert!(parts.len() > 1);
        let mut at = 0;
        for p in &parts[..parts.len() - 1] {
            at += p.len();
            assert_eq!(text.as_bytes()[at], b' ');
            assert!(!text[..at].chars().next_back().unwrap().is_whitespace());
            assert!(p.len() >= MIN_PIECE_BYTES);
        }
        // Short texts stay whole; no allowed cut, no cut.
        assert_eq!(cut("short text", 8).len(), 1);
        assert_eq!(cut(&"字".repeat(5000), 8).len(), 1);
    }

    #[test]
    fn other_pipelines_are_encoded_whole() {
        let mut t = demo_tokenizer();
        assert!(cuts_are_safe(&t));
        t.with_pre_tokenizer(Some(
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(true, true, true),
        ));
        assert!(!cuts_are_safe(&t));
        let mut t = demo_tokenizer();
        t.with_normalizer(Some(tokenizers::normalizers::unicode::NFKC))
            .unwrap();
        assert!(!cuts_are_safe(&t));
    }
}
