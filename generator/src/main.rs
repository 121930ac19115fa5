//! `gdn-gen`: builds the reproducible GDN kernel bundle from the pinned inputs.
//!
//! Plan, then execute: `build`, `verify` and `lock` resolve the artifact table
//! and the lock into one [`plan::Plan`] (variant, interpreter, the inputs
//! used, the unit cache), which `plan` prints, and execute it (`bundle`:
//! stage, compile through the unit cache, assemble, install). Progress goes
//! to stderr; errors are [`error::GenError`]s naming the step and the file.

mod archive;
mod bundle;
mod cli;
mod commands;
mod dsl;
mod error;
mod fetch;
mod files;
mod pin;
mod plan;
mod process;
mod repo;
mod stage;
mod toolkit;
mod unit_key;
mod unit_reuse;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Plan(args) => commands::plan(&args),
        cli::Command::Build(args) => commands::build::build(&args).map(|_| ()),
        cli::Command::Verify(args) => commands::verify::verify(&args),
        cli::Command::Lock(args) => commands::lock::lock(&args),
        cli::Command::Check(args) => commands::check::check(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gdn-gen: error: {e}");
            ExitCode::FAILURE
        }
    }
}
