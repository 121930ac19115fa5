//! Memory-mapped safetensors checkpoints: one file or a sharded index.
//! Names are normalised to the text layout (`model.language_model.X` →
//! `model.X`); vision (`model.visual.*`) and multi-token-prediction (`mtp.*`)
//! tensors are ignored. Every access checks presence, shape and dtype.
//! Headers are parsed once at open; [`Weights::raw`] gives a tensor's bytes
//! as stored (the GPU upload copies bf16 straight from them).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::LoadError;

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

pub struct Weights {
    shards: Vec<Mmap>,
    /// normalised name -> where its bytes are
    names: HashMap<String, Entry>,
}

/// A tensor's place in its shard, from the header (validated at open).
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the shard file.
    bytes: std::ops::Range<usize>,
}

/// A tensor's bytes as stored in the checkpoint (little-endian).
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub dtype: Dtype,
    pub bytes: &'a [u8],
}

impl RawTensor<'_> {
    /// Elements (the dtypes [`Weights::raw`] accepts have whole-byte sizes).
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.bitsize().div_ceil(8)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

fn normalise(name: &str) -> Option<String> {
    if name.starts_with("model.visual.")
        || name.starts_with("mtp.")
        || name.starts_with("model.mtp.")
    {
        return None;
    }
    Some(match name.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => name.to_string(),
    })
}

impl Weights {
    /// Opens `dir/model.safetensors.index.json` or else `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Weights, LoadError> {
        let files: Vec<PathBuf> = if dir.join(INDEX_FILE).exists() {
            let p = dir.join(INDEX_FILE);
            let text = std::fs::read_to_string(&p).map_err(|e| LoadError::io(&p, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| LoadError::Json {
                    what: p.display().to_string(),
                    source,
                })?;
            let content = |message: String| LoadError::JsonContent {
                path: p.clone(),
                message,
            };
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| content("no weight_map object".into()))?;
            let set: std::collections::BTreeSet<&str> =
                map.values().filter_map(|f| f.as_str()).collect();
            // Shards must be plain file names inside the model directory.
            if let Some(bad) = set.iter().find(|f| {
                f.is_empty() || f.contains('/') || f.contains('\\') || **f == "." || **f == ".."
            }) {
                return Err(content(format!(
                    "shard name {bad:?} is not a plain file name"
                )));
            }
            set.into_iter().map(|f| dir.join(f)).collect()
        } else {
            vec![dir.join(SINGLE_FILE)]
        };
        let mut shards = vec![];
        let mut names = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let file = std::fs::File::open(f).map_err(|e| LoadError::io(f, e))?;
            // SAFETY: the checkpoint is opened read-only and must not be
            // modified while loaded (the usual contract of mmapped weights).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(f, e))?;
            // Checks offsets against each other and the file size.
            let (header, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|source| LoadError::Safetensors {
                    path: f.clone(),
                    source,
                })?;
            let data_start = 8 + header;
            for (name, info) in metadata.tensors() {
                if let Some(n) = normalise(&name) {
                    let (lo, hi) = info.data_offsets;
                    names.insert(
                        n,
                        Entry {
                            shard: i,
                            dtype: info.dtype,
                            shape: info.shape.clone(),
                            bytes: data_start + lo..data_start + hi,
                        },
                    );
                }
            }
            shards.push(mmap);
        }
        Ok(Weights { shards, names })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// The first (sorted) name that starts with `prefix` and is not one of
    /// `except`: how a layer's expert layout is told apart.
    pub fn first_with_prefix(&self, prefix: &str, except: &[&str]) -> Option<&str> {
        self.names
            .keys()
            .filter(|n| n.starts_with(prefix) && !except.contains(&n.as_str()))
            .min()
            .map(String::as_str)
    }

    /// The bytes of tensor `name` as stored, checked against `shape` and
    /// for a float dtype (bf16, f16 or f32).
    pub fn raw(&self, name: &str, shape: &[usize]) -> Result<RawTensor<'_>, LoadError> {
        let entry = self
            .names
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                tensor: name.to_string(),
            })?;
        if entry.shape != shape {
            return Err(LoadError::WrongShape {
                tensor: name.to_string(),
                expected: shape.to_vec(),
                actual: entry.shape.clone(),
            });
        }
        if !matches!(entry.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(LoadError::WrongDtype {
                tensor: name.to_string(),
                actual: format!("{:?}", entry.dtype),
            });
        }
        Ok(RawTensor {
            dtype: entry.dtype,
            bytes: &self.shards[entry.shard][entry.bytes.clone()],
        })
    }

    /// The tensor `name` as f32, checked against `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let raw = self.raw(name, shape)?;
        let bytes = raw.bytes;
        let out = match raw.dtype {
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            // F32, the one dtype left that `raw` accepts.
            _ => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        Ok(out)
    }

    /// Normalised names, sorted (for diagnostics).
    pub fn names(&self) -> Vec<String> {
        let sorted: BTreeMap<&String, ()> = self.names.keys().map(|k| (k, ())).collect();
        sorted.into_keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::normalise;

    #[test]
    fn names_are_normalised_to_the_text_layout() {
        assert_eq!(
            normalise("model.language_model.layers.0.mlp.up_proj.weight").unwrap(),
            "model.layers.0.mlp.up_proj.weight"
        );
        assert_eq!(normalise("model.norm.weight").unwrap(), "model.norm.weight");
        assert_eq!(normalise("lm_head.weight").unwrap(), "lm_head.weight");
        assert!(normalise("model.visual.blocks.0.attn.qkv.weight").is_none());
        assert!(normalise("mtp.layers.0.mlp.up_proj.weight").is_none());
    }
}
