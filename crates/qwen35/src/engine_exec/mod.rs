//! The two executors of the serving engine (`engine::Executor`): the f32
//! CPU reference forward ([`CpuExecutor`]: machines without a GPU, CI, the
//! demo) and the bf16 GPU runtime ([`GpuExecutor`]). The engine decides
//! slots, pages and rows; an executor checks them, runs them and samples
//! where a row asks: the CPU one with `engine::sampler`, the GPU one on the
//! device with `gdn_kernels::DeviceSampler` (the same definition; the CPU
//! sampler is its oracle in the GPU tests).

mod checks;
mod cpu;
mod gpu;
mod gpu_memory;

pub use cpu::{CpuExecutor, CpuSizing};
pub use gpu::{ArenaPool, CacheRoom, GpuExecutor, GpuSizing, PagePool};
