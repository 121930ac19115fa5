//! gdn-gen's errors. Each names the step that failed and the file, input,
//! program or cache entry it was about, and where there is something to do,
//! says what.

use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, GenError>;

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// Reading, writing, creating, listing or moving a file or directory.
    #[error("{step}: {}: {source}", path.display())]
    Io {
        step: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The table, the lock or a bundle failed one of gdn-lock's checks, or a
    /// file was not the regular file it must be (gdn-lock's checked reads).
    #[error("{step}: {source}")]
    Document {
        step: String,
        source: gdn_lock::Error,
    },
    /// A program gdn-gen ran could not start or failed.
    #[error("{step} failed ({outcome}):\n  {command}\n{tail}")]
    Process {
        step: String,
        command: String,
        /// `exit status: 2`, or why it could not start.
        outcome: String,
        /// The last lines of its stderr and stdout.
        tail: String,
    },
    /// A pinned input (wheel) that cannot be used as it is.
    #[error("input {filename}{}: {problem}; {remedy}", in_parentheses(path))]
    Input {
        filename: String,
        path: Option<PathBuf>,
        problem: String,
        remedy: String,
    },
    /// Bytes gdn-gen built that are not the lock's, after every cached unit
    /// involved was compiled again (so the cache is not the cause).
    #[error(
        "the built bundle does not match the lock: {detail}\n(no bundle was written; every \
         unit involved was compiled afresh, so the unit cache is not the cause; the extracted \
         toolkit and DSL wheels under {cache}/toolkit and {cache}/dsl-site are reused: delete them to \
         rule them out; `cargo run --release -p gdn-gen -- verify` lists every difference)",
        cache = cache.display()
    )]
    BuiltBundleDiffers { detail: String, cache: PathBuf },
    /// The command line, the table or the lock ask for something that
    /// cannot be done; `problem` says what and what to do instead.
    #[error("{step}: {problem}")]
    Refused { step: String, problem: String },
}

fn in_parentheses(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" ({})", p.display()))
        .unwrap_or_default()
}

impl GenError {
    pub fn io(step: impl Into<String>, path: &Path, source: std::io::Error) -> Self {
        GenError::Io {
            step: step.into(),
            path: path.to_owned(),
            source,
        }
    }

    pub fn document(step: impl Into<String>, source: gdn_lock::Error) -> Self {
        GenError::Document {
            step: step.into(),
            source,
        }
    }

    pub fn refused(step: impl Into<String>, problem: impl Into<String>) -> Self {
        GenError::Refused {
            step: step.into(),
            problem: problem.into(),
        }
    }
}
