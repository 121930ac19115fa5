//! The kernels' GPU gates (each skips without a GPU; `GDN_REQUIRE_GPU=1`
//! makes a missing GPU a failure).
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p gdn-kernels --test integration gpu_deltanet_decode::`.

mod gpu_deltanet_decode;
mod gpu_dsl_prefill;
mod gpu_model_ops;
mod gpu_moe_ops;
mod gpu_prefill;
mod gpu_skinny_linear;
mod gpu_swiglu_gemm;
