//! `tokenizer.json` through the `tokenizers` crate, and EOS ids from
//! `generation_config.json` (an int or a list).

use std::path::Path;

use crate::error::{LoadError, RunError};

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub eos_token_ids: Vec<u32>,
}

impl TextTokenizer {
    pub fn from_dir(dir: &Path) -> Result<TextTokenizer, LoadError> {
        let path = dir.join("tokenizer.json");
        let inner =
            tokenizers::Tokenizer::from_file(&path).map_err(|source| LoadError::Tokenizer {
                path: path.clone(),
                source,
            })?;
        let gen = dir.join("generation_config.json");
        let eos_token_ids = if gen.exists() {
            let text = std::fs::read_to_string(&gen).map_err(|e| LoadError::io(&gen, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| LoadError::Json {
                    what: gen.display().to_string(),
                    source,
                })?;
            match &v["eos_token_id"] {
                serde_json::Value::Number(n) => {
                    n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
                }
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|x| x as u32))
                    .collect(),
                _ => vec![],
            }
        } else {
            vec![]
        };
        Ok(TextTokenizer {
            inner,
            eos_token_ids,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, RunError> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(RunError::Tokenizer)?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, RunError> {
        self.inner.decode(ids, false).map_err(RunError::Tokenizer)
    }
}
