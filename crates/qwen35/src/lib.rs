//! Qwen3.5 dense models: config, checkpoint loading, tokenizer, the f32 CPU
//! reference forward, and the bf16 GPU runtime (`gpu`), which runs on the
//! semantic ops of `gdn_kernels`.

pub mod config;
pub mod cpu;
mod error;
pub mod gate;
pub mod gpu;
pub mod tokenizer;
pub mod weights;

pub use config::{Config, LayerType};
pub use cpu::{CpuModel, CpuState};
pub use error::{Error, Result};
pub use tokenizer::TextTokenizer;
pub use weights::Weights;
