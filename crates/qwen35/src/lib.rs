//! Qwen3.5 dense models: config, checkpoint loading, tokenizer, the f32 CPU
//! reference forward, and the bf16 GPU runtime (`gpu`), which runs on the
//! semantic ops of `gdn_kernels`; `engine_exec` drives either as an
//! executor of the serving engine.

pub mod config;
pub mod cpu;
pub mod engine_exec;
mod error;
/// The accuracy gate of the GPU tests, only with the `testing` feature
/// (dev-dependencies enable it): shipped binaries do not carry it.
#[cfg(feature = "testing")]
pub mod gate;
pub mod gpu;
pub mod timing;
pub mod tokenizer;
pub mod weights;

pub use config::{Config, LayerType};
pub use cpu::{CpuModel, CpuState};
pub use error::{Error, Result};
pub use timing::PhaseTimes;
pub use tokenizer::TextTokenizer;
pub use weights::Weights;

/// Which logits a row of a step wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowLogits {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// After the row's last token (a row that samples).
    Last,
    /// After every token of the row (teacher-forced evaluation).
    All,
}
