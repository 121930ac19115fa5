//! Qwen3.5 models (dense and MoE): config, checkpoint loading, tokenizer,
//! the f32 CPU reference forward, and the bf16 GPU runtime (`gpu`, dense
//! and MoE layers: the routed experts run on `ModelOps::moe_experts`), which
//! runs on the semantic ops of `gdn_kernels`; `engine_exec` drives either as
//! an executor of the serving engine. Loading fails with a [`LoadError`],
//! running with a [`RunError`]; a kernel's own error stays their cause.

pub mod config;
pub mod cpu;
pub mod engine_exec;
mod error;
pub mod experts;
pub mod gpu;
mod row_logits;
pub mod state_dtype;
pub mod timing;
pub mod tokenizer;
pub mod weights;

pub use config::{Architecture, Config, LayerType, MoeConfig};
pub use cpu::{CpuModel, CpuState, RouterHook, Routes};
pub use error::{DeviceError, LoadError, RunError};
pub use row_logits::RowLogits;
pub use state_dtype::{StateDtype, StateDtypeRequest, UnknownStateDtype};
pub use timing::PhaseTimes;
pub use tokenizer::TextTokenizer;
pub use weights::Weights;
