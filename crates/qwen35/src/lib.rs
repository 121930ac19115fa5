//! Qwen3.5 dense models: config, checkpoint loading, tokenizer, and the f32
//! CPU reference forward. The GPU runtime (which calls `gdn_kernels` for
//! multi-token DeltaNet steps) builds on these types.

pub mod config;
pub mod cpu;
mod error;
pub mod gate;
pub mod tokenizer;
pub mod weights;

pub use config::{Config, LayerType};
pub use cpu::{CpuModel, CpuState};
pub use error::{Error, Result};
pub use tokenizer::TextTokenizer;
pub use weights::Weights;
