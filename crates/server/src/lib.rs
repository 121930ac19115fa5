//! gdn-server: the composition root of the OpenAI-compatible server. The
//! command line ([`cli`]), the embedded demo checkpoint ([`demo`]), the
//! executor for `--device` ([`executor`]) and its memory sizing
//! ([`memory`]), composed with gdn-http's serving ([`launch`]).

pub mod cli;
pub mod demo;
pub mod executor;
pub mod fd_limit;
pub mod launch;
pub mod logging;
pub mod memory;

pub use launch::{prepare, run, LaunchError, Prepared};
