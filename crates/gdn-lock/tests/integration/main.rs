//! The lock and manifest documents, and tampered bundles.
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p gdn-lock --test integration documents::`.

mod documents;
mod tamper;
