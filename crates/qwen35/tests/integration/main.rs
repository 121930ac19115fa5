//! Qwen3.5 loading, the CPU reference and executor, and the GPU gates
//! (each GPU test skips without a GPU; `GDN_REQUIRE_GPU=1` makes a missing
//! GPU a failure).
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p qwen35 --test integration bf16_golden_floor::`.

mod bf16_golden_floor;
mod cpu_executor;
mod cpu_state_dtype;
mod engine_cpu;
mod engine_cpu_kv_pressure;
mod engine_cpu_prefix_cache;
mod gpu_arena;
mod gpu_engine;
mod gpu_executor;
mod gpu_forward;
mod gpu_moe_forward;
mod gpu_prefix_cache;
mod gpu_sampling;
mod gpu_snapshot_share;
mod gpu_steps;
mod hf_cpu_gate;
mod loading_errors;
mod server_demo_checkpoint;
