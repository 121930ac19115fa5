//! The HTTP layer against a scripted engine.
//!
//! One test binary for the crate: each module was a test target of its own,
//! and every extra binary is another link of the whole dependency graph.
//! Run one module with its path as the filter, e.g.
//! `cargo test -p http --test integration http_chat_rules::`.

mod common;
mod log_capture;

mod http_chat_rules;
mod http_closing;
mod http_connections;
mod http_finish_reasons;
mod http_ids_and_queue;
mod http_messages;
mod http_responses;
mod http_scripted;
mod http_structured;
mod http_structured_refusals;
mod http_timeline;
