//! One module per command. Each resolves a [`crate::plan::Plan`] (except
//! `check`, which builds nothing) and executes it.

pub mod build;
pub mod check;
pub mod lock;
pub mod verify;

use crate::cli::BuildArgs;
use crate::error::Result;
use crate::plan::{Plan, Purpose};

/// `gdn-gen plan`: the build's plan, printed.
pub fn plan(args: &BuildArgs) -> Result<()> {
    Plan::resolve(args, Purpose::Build)?.print()
}
