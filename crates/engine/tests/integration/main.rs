//! The engine against its contract-checking fake executor.
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p engine --test integration engine_admission_and_ends::`.

mod common;

mod engine_admission_and_ends;
mod engine_arena;
mod engine_basic;
mod engine_constraint_failures;
mod engine_constraints;
mod engine_kv_pressure;
mod engine_lifecycle;
mod engine_prefix_cache;
mod engine_random;
mod engine_scheduling;
mod engine_timeline;
