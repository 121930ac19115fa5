//! Compiling constraints: the tokenizer's trie for llguidance, the limits
//! a constraint must keep, and a bounded cache of compiled grammars keyed
//! by their text (a client that sends one schema many times compiles it
//! once).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::ascii_classes::ascii_perl_classes;
use super::first_step::check_first_step;
use llguidance::{ParserFactory, TokenParser};
use thiserror::Error;

use super::{ConstraintError, ConstraintSpec};

/// What a constraint may cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintLimits {
    /// The longest constraint text compiled (a schema as compact JSON, a
    /// regex, the choices, a grammar), in bytes.
    pub max_text_bytes: usize,
    /// llguidance's grammar size limit (symbols in productions).
    pub max_grammar_size: usize,
    /// How long a compile may take before the request is refused (the
    /// compile then finishes in the background and is thrown away).
    pub compile_timeout: Duration,
    /// Compiled grammars kept, least recently used dropped first.
    pub cache_entries: usize,
    /// Copies of a cached grammar's lexer that its requests share, round
    /// robin. A lexer is behind one mutex, held through a whole mask, and
    /// keeps the automaton states its requests have built: one copy for
    /// all serialises the masks of every request on that grammar across
    /// the mask pool; one per request makes each build its automaton anew.
    /// As many as the pool has threads balances the two (0: one each;
    /// measured in docs/results/, see docs/performance.md).
    pub lexer_copies: usize,
}

impl Default for ConstraintLimits {
    fn default() -> Self {
        ConstraintLimits {
            // Far above any tool or response schema seen in practice, far
            // below what would stall the compiler.
            max_text_bytes: 256 * 1024,
            // llguidance's own default.
            max_grammar_size: 500_000,
            compile_timeout: Duration::from_secs(10),
            cache_entries: 64,
            lexer_copies: super::default_mask_threads(),
        }
    }
}

/// Why the tokenizer could not be prepared for structured outputs.
#[derive(Debug, Error)]
pub enum StructuredOutputsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tokenizer.json is not JSON: {0}")]
    Json(serde_json::Error),
    /// llguidance could not read the vocabulary (its message).
    #[error("tokenizer.json's vocabulary: {0}")]
    Vocabulary(String),
    #[error("no EOS id below the tokenizer's {vocab} tokens (given {eos:?})")]
    NoEos { eos: Vec<u32>, vocab: usize },
}

/// The compiler of constraints for one tokenizer: cheap to clone (shared),
/// given to the engine through [`crate::EngineConfig::structured_outputs`].
/// Built at once ([`Self::from_tokenizer_json`]) or on a thread of its own
/// ([`Self::spawn_from_tokenizer_file`]: reading a 248k vocabulary takes
/// over a second, which a server's start should not wait for); its first
/// use waits for that build.
#[derive(Clone)]
pub struct StructuredOutputs {
    source: Arc<Source>,
    limits: ConstraintLimits,
}

/// The compiler, or the build that will give it.
struct Source {
    ready: OnceLock<Result<Inner, StructuredOutputsError>>,
    building: Mutex<Option<mpsc::Receiver<Result<Inner, StructuredOutputsError>>>>,
}

impl Source {
    fn built(inner: Inner) -> Self {
        Source {
            ready: OnceLock::from(Ok(inner)),
            building: Mutex::new(None),
        }
    }

    /// The compiler, waiting for its build; `Err` (the build's error) when
    /// it failed.
    fn get(&self) -> Result<&Inner, &StructuredOutputsError> {
        self.ready
            .get_or_init(|| {
                let pending = self
                    .building
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                match pending.map(|rx| rx.recv()) {
                    Some(Ok(built)) => built,
                    Some(Err(_)) | None => Err(StructuredOutputsError::Vocabulary(
                        "the vocabulary's reader stopped".into(),
                    )),
                }
            })
            .as_ref()
    }
}

struct Inner {
    factory: ParserFactory,
    /// Most recently used last.
    cache: Mutex<VecDeque<Cached>>,
}

/// A cached grammar: its lexer copies ([`ConstraintLimits::lexer_copies`];
/// the first is the parser as compiled) and the copy the next request
/// shares.
struct Cached {
    key: String,
    copies: Vec<TokenParser>,
    next: usize,
}

impl Cached {
    fn new(key: String, parser: &TokenParser, copies: usize) -> Self {
        // A plain clone shares the lexer; a deep clone has its own.
        let copies = (0..copies.max(1)).map(|_| parser.deep_clone()).collect();
        Cached {
            key,
            copies,
            next: 0,
        }
    }

    /// A matcher's parser: sharing the next lexer copy, or (no sharing)
    /// a lexer of its own.
    fn hand_out(&mut self, share: bool) -> TokenParser {
        let at = self.next % self.copies.len();
        self.next = self.next.wrapping_add(1);
        if share {
            self.copies[at].clone()
        } else {
            self.copies[at].deep_clone()
        }
    }
}

/// A compiled constraint, ready to start a matcher.
pub(crate) struct Compiled(pub(crate) TokenParser);

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled")
    }
}

impl StructuredOutputs {
    /// From a Hugging Face `tokenizer.json` (byte-level BPE or byte
    /// fallback) and the model's EOS ids (the grammar allows them where it
    /// accepts).
    pub fn from_tokenizer_json(
        json: &str,
        eos_token_ids: &[u32],
        limits: ConstraintLimits,
    ) -> Result<Self, StructuredOutputsError> {
        let inner = Inner::from_tokenizer_json(json, eos_token_ids, &limits)?;
        Ok(StructuredOutputs {
            source: Arc::new(Source::built(inner)),
            limits,
        })
    }

    /// [`Self::from_tokenizer_file`] on a thread of its own: returns at
    /// once; the first compile waits for the vocabulary, and a vocabulary
    /// that cannot be read makes every constraint
    /// [`ConstraintError::Unsupported`] (and is logged).
    pub fn spawn_from_tokenizer_file(
        path: PathBuf,
        eos_token_ids: Vec<u32>,
        limits: ConstraintLimits,
    ) -> Self {
        let (done, building) = mpsc::channel();
        let for_build = limits.clone();
        let spawned = std::thread::Builder::new()
            .name("gdn-vocab".into())
            .spawn(move || {
                let built = std::fs::read_to_string(&path)
                    .map_err(|source| StructuredOutputsError::Read {
                        path: path.display().to_string(),
                        source,
                    })
                    .and_then(|json| Inner::from_tokenizer_json(&json, &eos_token_ids, &for_build));
                if let Err(why) = &built {
                    log::warn!("structured outputs are off: {why}");
                }
                let _ = done.send(built);
            });
        if let Err(e) = spawned {
            log::warn!("structured outputs are off: could not start the vocabulary's reader: {e}");
        }
        StructuredOutputs {
            source: Arc::new(Source {
                ready: OnceLock::new(),
                building: Mutex::new(Some(building)),
            }),
            limits,
        }
    }
}

impl Inner {
    fn from_tokenizer_json(
        json: &str,
        eos_token_ids: &[u32],
        limits: &ConstraintLimits,
    ) -> Result<Inner, StructuredOutputsError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(StructuredOutputsError::Json)?;
        let words = llguidance::token_bytes_from_tokenizer_json(&value)
            .map_err(|e| StructuredOutputsError::Vocabulary(e.to_string()))?;
        let vocab = words.len();
        let eos: Vec<u32> = eos_token_ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < vocab)
            .collect();
        let Some(&first) = eos.first() else {
            return Err(StructuredOutputsError::NoEos {
                eos: eos_token_ids.to_vec(),
                vocab,
            });
        };
        let info = TokRxInfo::new(vocab as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        // Greedy tokenisation is enough: the engine never forces tokens
        // (no fast-forward), it only asks for masks.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| StructuredOutputsError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = parser_limits(limits);
        Ok(Inner {
            factory,
            cache: Mutex::new(VecDeque::new()),
        })
    }
}

/// llguidance's limits, each named here rather than left to its defaults
/// (the values are its defaults but two): the ones checked while compiling
/// refuse a grammar at once; the per-step ones would fail a request after
/// tokens went out, so a grammar's first step is taken at compile time
/// (`first_step.rs`) and one that breaks them there is refused too.
fn parser_limits(limits: &ConstraintLimits) -> ParserLimits {
    ParserLimits {
        // Compile time: symbols in the grammar's productions.
        max_grammar_size: limits.max_grammar_size,
        // Compile time: a large lexeme (a long regex, a big alternation)
        // has its automaton built over the whole vocabulary while
        // compiling, with this much fuel, so one too large to build is
        // refused then, not on a mask mid-output.
        precompute_large_lexemes: true,
        initial_lexer_fuel: 1_000_000,
        // Per step: one mask's lexer work, items and automaton states.
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_lexer_states: 250_000,
        // Per step: an Earley row's items. A choice list is one lexeme
        // (see `grammar_of`), so its length does not count here.
        max_items_in_row: 2_000,
        // llguidance's message alone: its verbose form appends the parser
        // state and the whole grammar (up to the text limit) to every
        // error, which a client's 400 and a log line do not want.
        verbose_errors: false,
    }
}

impl StructuredOutputs {
    /// [`Self::from_tokenizer_json`] of the file at `path`.
    pub fn from_tokenizer_file(
        path: &Path,
        eos_token_ids: &[u32],
        limits: ConstraintLimits,
    ) -> Result<Self, StructuredOutputsError> {
        let json =
            std::fs::read_to_string(path).map_err(|source| StructuredOutputsError::Read {
                path: path.display().to_string(),
                source,
            })?;
        Self::from_tokenizer_json(&json, eos_token_ids, limits)
    }

    /// Tokens the tokenizer knows (ids from here up to the logits' width
    /// are never allowed).
    /// Waits for a spawned build; 0 when it failed.
    pub fn vocab_size(&self) -> usize {
        self.source
            .get()
            .map_or(0, |inner| inner.factory.tok_env().tok_trie().vocab_size())
    }

    pub fn limits(&self) -> &ConstraintLimits {
        &self.limits
    }

    /// The compiler, waiting for a spawned build.
    fn inner(&self) -> Result<&Inner, ConstraintError> {
        self.source.get().map_err(|_| ConstraintError::Unsupported)
    }

    /// Compiles `spec` (or takes it from the cache).
    pub(crate) fn compile(&self, spec: &ConstraintSpec) -> Result<Compiled, ConstraintError> {
        let kind = spec.kind();
        let (text, grammar) = grammar_of(spec)?;
        let limit = self.limits.max_text_bytes;
        if text.len() > limit {
            return Err(ConstraintError::TooLarge {
                kind,
                bytes: text.len(),
                limit,
            });
        }
        let key = format!("{kind}\0{text}");
        if let Some(parser) = self.cached(&key)? {
            return Ok(Compiled(parser));
        }
        let source = self.source.clone();
        let (done, result) = mpsc::channel();
        let invalid = |message: String| ConstraintError::Invalid { kind, message };
        std::thread::Builder::new()
            .name("gdn-grammar".into())
            .spawn(move || {
                let parser = match source.get() {
                    Ok(inner) => compile_checked(inner, kind, grammar),
                    Err(why) => Err(invalid(why.to_string())),
                };
                let _ = done.send(parser);
            })
            .map_err(|e| invalid(format!("could not start the compiler: {e}")))?;
        let timeout = self.limits.compile_timeout;
        match result.recv_timeout(timeout) {
            Ok(Ok(parser)) => {
                self.remember(key, &parser);
                Ok(Compiled(parser))
            }
            Ok(Err(refused)) => Err(refused),
            Err(RecvTimeoutError::Timeout) => Err(ConstraintError::CompileTimeout {
                kind,
                limit: timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(invalid("the compiler panicked".into())),
        }
    }

    fn cached(&self, key: &str) -> Result<Option<TokenParser>, ConstraintError> {
        let mut cache = self
            .inner()?
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(at) = cache.iter().position(|c| c.key == key) else {
            return Ok(None);
        };
        let mut entry = cache.remove(at).expect("found above");
        let parser = entry.hand_out(self.limits.lexer_copies > 0);
        cache.push_back(entry);
        Ok(Some(parser))
    }

    /// Caches a compile; the request that compiled it keeps the parser as
    /// compiled (its own lexer).
    fn remember(&self, key: String, parser: &TokenParser) {
        let capacity = self.limits.cache_entries;
        let Ok(inner) = self.inner() else {
            return;
        };
        if capacity == 0 {
            return;
        }
        let mut cache = inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|c| c.key != key);
        while cache.len() >= capacity {
            cache.pop_front();
        }
        cache.push_back(Cached::new(key, parser, self.limits.lexer_copies));
    }

    /// Compiled grammars in the cache.
    pub fn cached_grammars(&self) -> usize {
        self.inner()
            .map_or(0, |inner| inner.cache.lock().map(|c| c.len()).unwrap_or(0))
    }
}

/// Compiles `grammar` and takes its first step (a grammar that compiles
/// but cannot be followed is refused here, not on the mask pool).
fn compile_checked(
    inner: &Inner,
    kind: &'static str,
    grammar: TopLevelGrammar,
) -> Result<TokenParser, ConstraintError> {
    let parser = inner
        .factory
        .create_parser(grammar)
        .map_err(|e| ConstraintError::Invalid {
            kind,
            message: e.to_string(),
        })?;
    check_first_step(kind, &parser, inner.factory.tok_env().tok_trie())?;
    Ok(parser)
}

/// The compiler's view of `spec`, and its text (the cache key, and what
/// the size limit measures).
fn grammar_of(spec: &ConstraintSpec) -> Result<(String, TopLevelGrammar), ConstraintError> {
    let kind = spec.kind();
    let invalid = |message: &str| ConstraintError::Invalid {
        kind,
        message: message.into(),
    };
    Ok(match spec {
        ConstraintSpec::JsonSchema(schema) => {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(invalid("a JSON schema must be an object or a boolean"));
            }
            let text = schema.to_string();
            (text, TopLevelGrammar::from_json_schema(schema.clone()))
        }
        ConstraintSpec::JsonObject => {
            let schema = serde_json::json!({"type": "object"});
            (String::new(), TopLevelGrammar::from_json_schema(schema))
        }
        ConstraintSpec::Regex(regex) => {
            let ascii = ascii_perl_classes(regex);
            (regex.clone(), TopLevelGrammar::from_regex(&ascii))
        }
        ConstraintSpec::Choice(choices) => {
            if choices.is_empty() {
                return Err(invalid("at least one choice is needed"));
            }
            // One terminal, so one lexeme: the lexer's automaton takes
            // the alternatives, however many. As alternatives of a rule,
            // each is an item of the parser's first row, and a list longer
            // than llguidance's items per row (2,000) failed on the first
            // token.
            let alternatives: Vec<String> = choices.iter().map(|c| lark_string(c)).collect();
            let lark = format!("start: CHOICE\nCHOICE: {}\n", alternatives.join(" | "));
            (lark.clone(), TopLevelGrammar::from_lark(lark))
        }
        ConstraintSpec::Lark(lark) => (lark.clone(), TopLevelGrammar::from_lark(lark.clone())),
    })
}

/// A Lark string literal: a JSON string, with DEL escaped too (JSON
/// leaves it raw, llguidance's Lark lexer refuses it raw).
fn lark_string(text: &str) -> String {
    serde_json::Value::from(text)
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

impl std::fmt::Debug for StructuredOutputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StructuredOutputs")
            .field("vocab_size", &self.vocab_size())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Two handles are equal when they share one compiler (the engine config
/// compares by identity).
impl PartialEq for StructuredOutputs {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
    }
}

impl Eq for StructuredOutputs {}
