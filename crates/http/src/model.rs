//! What the server reads from a Hugging Face model directory besides the
//! weights (the executor loads those): tokenizer, chat template, special
//! tokens, generation defaults, EOS ids, vocabulary size.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;
use tokenizers::Tokenizer;

use crate::openai::validate::SamplingDefaults;
use crate::startup::Startup;
use crate::text::split_encode;
use crate::text::template::{ChatTemplate, TemplateParseError};

/// Why a model directory's text side cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: not valid JSON: {error}", path.display())]
    InvalidJson {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--chat-template {}: {error}", path.display())]
    ChatTemplateOverride {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("tokenizer_config.json: chat_template list has no 'default' template")]
    NoDefaultChatTemplate,
    #[error("{}: no config.json", dir.display())]
    NoConfig { dir: PathBuf },
    #[error("config.json: no vocab_size")]
    NoVocabSize,
    #[error("{}: {error}", path.display())]
    Tokenizer {
        path: PathBuf,
        error: tokenizers::Error,
    },
    #[error(transparent)]
    ChatTemplate(#[from] TemplateParseError),
}

/// The tokenizer failed on a text.
#[derive(Debug, thiserror::Error)]
#[error("tokenization failed: {0}")]
pub struct EncodeError(tokenizers::Error);

pub struct ModelFiles {
    pub dir: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    /// `None`: the checkpoint has none and no `--chat-template` was given
    /// (a base model): completions are served, chat requests get a 400.
    pub template: Option<ChatTemplate>,
    pub defaults: SamplingDefaults,
    pub eos_token_ids: Vec<u32>,
    /// Rows of the model's embedding (valid token ids are below it).
    pub vocab_size: usize,
    /// The tokenizer may encode long texts in parallel pieces
    /// ([`split_encode::cuts_are_safe`]).
    pub parallel_encode: bool,
    /// config.json's first `architectures` entry (Hugging Face's class
    /// name, e.g. `Qwen3_5MoeForConditionalGeneration`), shown by
    /// `/v1/models`.
    pub architecture: Option<String>,
}

fn read_json(path: &Path) -> Result<Option<Json>, ModelError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| ModelError::InvalidJson {
                    path: path.to_path_buf(),
                    error,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(ModelError::Read {
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// `eos_token_id` is an int or a list of ints in HF configs.
fn ids(v: Option<&Json>) -> Vec<u32> {
    match v {
        Some(Json::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Json::Array(a)) => a
            .iter()
            .filter_map(|n| n.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// tokenizer_config.json writes special tokens as strings or as
/// `{"content": ..}` objects.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The template source: an override file, else `chat_template.jinja`
/// (transformers' current layout), else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates: "default");
/// `None` when there is none (a base model).
fn template_source(
    dir: &Path,
    tokenizer_config: Option<&Json>,
    override_path: Option<&Path>,
) -> Result<Option<String>, ModelError> {
    if let Some(path) = override_path {
        return std::fs::read_to_string(path).map(Some).map_err(|error| {
            ModelError::ChatTemplateOverride {
                path: path.to_path_buf(),
                error,
            }
        });
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|error| ModelError::Read { path: jinja, error });
    }
    match tokenizer_config.and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(|t| Some(t.to_string()))
            .ok_or(ModelError::NoDefaultChatTemplate),
        _ => Ok(None),
    }
}

fn read_config(dir: &Path) -> Result<Json, ModelError> {
    read_json(&dir.join("config.json"))?.ok_or_else(|| ModelError::NoConfig {
        dir: dir.to_path_buf(),
    })
}

/// EOS ids named by generation_config.json, then config.json (its
/// text_config too), without duplicates; empty when none names one (then
/// [`ModelFiles::load`] asks the tokenizer for tokenizer_config's
/// `eos_token`).
pub fn configured_eos_ids(dir: &Path) -> Result<Vec<u32>, ModelError> {
    let config = read_config(dir)?;
    let text_config = config.get("text_config").unwrap_or(&config);
    let generation_config = read_json(&dir.join("generation_config.json"))?;
    let mut eos_token_ids = ids(generation_config
        .as_ref()
        .and_then(|g| g.get("eos_token_id")));
    for id in ids(text_config.get("eos_token_id"))
        .into_iter()
        .chain(ids(config.get("eos_token_id")))
    {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
    Ok(eos_token_ids)
}

impl ModelFiles {
    pub fn load(
        dir: &Path,
        chat_template_override: Option<&Path>,
    ) -> Result<ModelFiles, ModelError> {
        Self::load_timed(dir, chat_template_override, &Startup::new())
    }

    /// [`ModelFiles::load`], recording the tokenizer's and the template's
    /// load times in `startup`.
    pub fn load_timed(
        dir: &Path,
        chat_template_override: Option<&Path>,
        startup: &Startup,
    ) -> Result<ModelFiles, ModelError> {
        let config = read_config(dir)?;
        // Qwen3.5 checkpoints nest the language model's config.
        let text_config = config.get("text_config").unwrap_or(&config);
        let vocab_size = text_config
            .get("vocab_size")
            .or_else(|| config.get("vocab_size"))
            .and_then(Json::as_u64)
            .ok_or(ModelError::NoVocabSize)? as usize;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = startup
            .time("tokenizer", || Tokenizer::from_file(&tokenizer_path))
            .map_err(|error| ModelError::Tokenizer {
                path: tokenizer_path.clone(),
                error,
            })?;
        let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
        let generation_config = read_json(&dir.join("generation_config.json"))?;

        let mut eos_token_ids = configured_eos_ids(dir)?;
        if eos_token_ids.is_empty() {
            if let Some(id) = tokenizer_config
                .as_ref()
                .and_then(|c| c.get("eos_token"))
                .and_then(token_text)
                .and_then(|t| tokenizer.token_to_id(&t))
            {
                eos_token_ids.push(id);
            }
        }

        let special_tokens: Vec<(String, String)> =
            ["bos_token", "eos_token", "pad_token", "unk_token"]
                .iter()
                .filter_map(|key| {
                    let text = tokenizer_config.as_ref()?.get(*key).and_then(token_text)?;
                    Some((key.to_string(), text))
                })
                .collect();
        let template = startup.time("chat_template", || {
            match template_source(dir, tokenizer_config.as_ref(), chat_template_override)? {
                Some(source) => {
                    Ok::<_, ModelError>(Some(ChatTemplate::new(source, special_tokens)?))
                }
                None => Ok(None),
            }
        })?;
        if template.is_none() {
            log::warn!(
                "{}: no chat template (chat_template.jinja or tokenizer_config.json's chat_template): serving completions only; chat requests get a 400 until one is given with --chat-template",
                dir.display()
            );
        }

        let g = generation_config.as_ref();
        let f = |k: &str| g.and_then(|g| g.get(k)).and_then(Json::as_f64);
        let defaults = SamplingDefaults {
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: g.and_then(|g| g.get("top_k")).and_then(Json::as_i64),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            max_tokens: g
                .and_then(|g| g.get("max_new_tokens"))
                .and_then(Json::as_u64)
                .map(|m| m as usize),
        };
        let parallel_encode = split_encode::cuts_are_safe(&tokenizer);
        let architecture = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Json::as_str)
            .map(str::to_owned);
        Ok(ModelFiles {
            dir: dir.to_path_buf(),
            tokenizer: Arc::new(tokenizer),
            template,
            defaults,
            eos_token_ids,
            vocab_size,
            parallel_encode,
            architecture,
        })
    }

    /// Prompt text -> ids. Chat renders already contain their special
    /// tokens as text (parsed here, no BOS added), as transformers does.
    /// Long texts are cut into pieces tokenized in parallel when the
    /// tokenizer's pipeline makes that exact (`text::split_encode`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EncodeError> {
        split_encode::encode(
            &self.tokenizer,
            self.parallel_encode,
            text,
            add_special_tokens,
        )
        .map_err(EncodeError)
    }
}
