//! `gdn-gen`: builds the reproducible GDN kernel bundle from the pinned inputs.
//!
//! Plan, then execute: every command resolves the artifact table and the lock
//! into a [`plan::Plan`] (inputs, staging, compile units, bundle layout) and then
//! runs it. Progress goes to stderr.

mod cli;
mod dsl;
mod fetch;
mod lockcmd;
mod plan;
mod process;
mod stage;
mod toolkit;
mod workflow;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Plan(args) => workflow::plan(&args),
        cli::Command::Build(args) => workflow::build(&args).map(|_| ()),
        cli::Command::Verify(args) => workflow::verify(&args),
        cli::Command::Lock(args) => lockcmd::lock(&args),
        cli::Command::Check(args) => workflow::check(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gdn-gen: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
