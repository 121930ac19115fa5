use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Builds, verifies and locks the reproducible GDN kernel bundle.
#[derive(Parser, Debug)]
#[command(name = "gdn-gen", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the steps a build would run, without running them.
    Plan(BuildArgs),
    /// Build the bundle from the locked inputs (a no-op when nothing changed).
    Build(BuildArgs),
    /// Rebuild from scratch into a temporary directory and compare with the lock.
    Verify(BuildArgs),
    /// Resolve the table's inputs, build, and rewrite the lock. The only way the lock changes.
    Lock(BuildArgs),
    /// Verify an existing bundle directory against the lock (no build).
    Check(CheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BuildArgs {
    /// The lock file; the repository root is its directory.
    #[arg(long, default_value = gdn_lock::LOCK_FILE)]
    pub lock: PathBuf,
    /// Where the bundle is written (replaced by renames, never left partial).
    #[arg(long, default_value = "target/gdn-bundle")]
    pub out: PathBuf,
    /// Content-addressed cache of downloads, the extracted toolkit and compiled units.
    #[arg(long, default_value = "target/gdn-cache")]
    pub cache: PathBuf,
    /// Use this CUDA toolkit (its bin/nvcc must be the pinned version) instead of the pinned PyPI wheels.
    #[arg(long)]
    pub toolkit_root: Option<PathBuf>,
    /// A directory holding pre-fetched inputs under their file names (checked by sha256 like downloads).
    #[arg(long)]
    pub inputs_dir: Option<PathBuf>,
    /// Never download: inputs must be in --inputs-dir or the cache.
    #[arg(long)]
    pub offline: bool,
    /// Maximum compile jobs at once (also bounded by memory); default: 2.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Toolchain variant, a key of the lock's `variants`. An `unrecorded`
    /// variant builds with a warning and is not compared with the lock.
    #[arg(long, default_value = "cuda-13.0")]
    pub variant: String,
    /// Host C++ compiler nvcc uses (`-ccbin`); default: $CXX or g++.
    #[arg(long)]
    pub host_cxx: Option<String>,
    /// Python interpreter that runs the CuTe DSL export; its major.minor picks
    /// the pinned wheel set (the table's `dsl.pythons`), and its version is
    /// recorded in the manifest.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The bundle directory to verify.
    #[arg(long, default_value = "target/gdn-bundle")]
    pub bundle: PathBuf,
    #[arg(long, default_value = gdn_lock::LOCK_FILE)]
    pub lock: PathBuf,
    /// Accept host objects built by another host compiler than the lock's
    /// (their device code is still checked to be the locked cubins).
    #[arg(long)]
    pub allow_foreign_host_compiler: bool,
}
