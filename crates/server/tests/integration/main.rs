//! gdn-server: the served app, its startup and shutdown, and the served
//! GPU gates.
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p server --test integration chat_template_goldens::`.

mod common;
mod served;

mod chat_template_goldens;
mod gpu_served;
mod gpu_served_structured;
mod moe_served;
mod prefix_cache_chat;
mod shutdown;
mod startup_errors;
