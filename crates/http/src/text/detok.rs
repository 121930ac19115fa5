//! Token ids -> text, one token at a time, and stop strings.
//!
//! Byte-level BPE tokens are not characters: a token may end inside a UTF-8
//! sequence. As in TGI and vLLM, text is emitted only once the decode of a
//! short window no longer ends in U+FFFD, and only the part beyond what the
//! window's prefix already produced.

use std::sync::Arc;

use tokenizers::Tokenizer;

pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the window whose decode is compared.
    prefix_offset: usize,
    /// End of what was already turned into text.
    read_offset: usize,
}

impl IncrementalDetokenizer {
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        IncrementalDetokenizer {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .unwrap_or_default()
    }

    /// Adds one token; returns the new text it completes (maybe empty).
    pub fn push(&mut self, token: u32) -> String {
        self.ids.push(token);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = self.decode(&self.ids[self.prefix_offset..]);
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            let new = if full.starts_with(&prefix) {
                full[prefix.len()..].to_string()
            } else {
                // Normalizers may rewrite the window's start; fall back to
                // the part past the prefix's length on a char boundary.
                let mut at = prefix.len();
                while !full.is_char_boundary(at) {
                    at += 1;
                }
                full[at..].to_string()
            };
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            new
        } else {
            String::new()
        }
    }

    /// Text still held back at the end (an incomplete UTF-8 tail, shown as
    /// U+FFFD as a full decode would).
    pub fn flush(&mut self) -> String {
        if self.read_offset == self.ids.len() {
            return String::new();
        }
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = self.decode(&self.ids[self.prefix_offset..]);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        full.get(prefix.len()..).unwrap_or_default().to_string()
    }
}

/// Finds stop strings in a growing output text.
#[derive(Clone, Debug)]
pub struct StopStrings {
    stops: Vec<String>,
    longest: usize,
    include_in_output: bool,
}

impl StopStrings {
    pub fn new(stops: Vec<String>, include_in_output: bool) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopStrings {
            stops,
            longest,
            include_in_output,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// After `new_len` bytes were appended to `text`: if a stop string now
    /// occurs (it must overlap the new bytes), returns the length to cut
    /// `text` to and the stop string.
    pub fn check(&self, text: &str, new_len: usize) -> Option<(usize, String)> {
        if self.stops.is_empty() {
            return None;
        }
        let mut from = text.len().saturating_sub(new_len + self.longest);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        // Earliest occurrence wins (vLLM checks stops in order; the earliest
        // is what a client would see first).
        let mut best: Option<(usize, &String)> = None;
        for stop in &self.stops {
            if let Some(at) = text[from..].find(stop.as_str()) {
                let at = from + at;
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, stop));
                }
            }
        }
        best.map(|(at, stop)| {
            let cut = if self.include_in_output {
                at + stop.len()
            } else {
                at
            };
            (cut, stop.clone())
        })
    }

    /// How many trailing bytes of `text` must not be shown yet because they
    /// may be the start of a stop string.
    pub fn holdback(&self, text: &str) -> usize {
        let mut hold = 0;
        for stop in &self.stops {
            for k in (1..stop.len()).rev() {
                if k <= hold {
                    break;
                }
                if stop.is_char_boundary(k) && text.ends_with(&stop[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_found_across_pieces() {
        let stops = StopStrings::new(vec!["END".into(), "xy".into()], false);
        let mut text = String::from("abc E");
        assert_eq!(stops.check(&text, 2), None);
        assert_eq!(stops.holdback(&text), 1);
        text.push_str("ND more");
        assert_eq!(stops.check(&text, 7), Some((4, "END".into())));
        let inclusive = StopStrings::new(vec!["END".into()], true);
        assert_eq!(inclusive.check(&text, 7), Some((7, "END".into())));
    }

    #[test]
    fn earliest_stop_wins_and_holdback_is_a_prefix() {
        let stops = StopStrings::new(vec!["bc".into(), "ab".into()], false);
        assert_eq!(stops.check("zabc", 4), Some((1, "ab".into())));
        assert_eq!(stops.holdback("za"), 1);
        assert_eq!(stops.holdback("zz"), 0);
        let unicode = StopStrings::new(vec!["é!".into()], false);
        assert_eq!(unicode.holdback("xé"), 2);
    }
}
