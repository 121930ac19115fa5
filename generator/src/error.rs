//! gdn-gen's errors. Each names the step that failed and the file, input,
//! program or cache entry it was about, and where there is something to do,
//! says what.

use std::fmt;
use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, GenError>;

#[derive(Debug)]
pub enum GenError {
    /// Reading, writing, creating, listing or moving a file or directory.
    Io {
        step: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The table, the lock or a bundle failed one of gdn-lock's checks.
    Document {
        step: String,
        source: gdn_lock::Error,
    },
    /// A program gdn-gen ran could not start or failed.
    Process {
        step: String,
        command: String,
        /// `exit status: 2`, or why it could not start.
        outcome: String,
        /// The last lines of its stderr and stdout.
        tail: String,
    },
    /// A pinned input (wheel) that cannot be used as it is.
    Input {
        filename: String,
        path: Option<PathBuf>,
        problem: String,
        remedy: String,
    },
    /// Bytes gdn-gen built that are not the lock's, after every cached unit
    /// involved was compiled again (so the cache is not the cause).
    BuiltBundleDiffers { detail: String, cache: PathBuf },
    /// The command line, the table or the lock ask for something that
    /// cannot be done; `problem` says what and what to do instead.
    Refused { step: String, problem: String },
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

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenError::Io { step, path, source } => {
                write!(f, "{step}: {}: {source}", path.display())
            }
            GenError::Document { step, source } => write!(f, "{step}: {source}"),
            GenError::Process {
                step,
                command,
                outcome,
                tail,
            } => write!(f, "{step} failed ({outcome}):\n  {command}\n{tail}"),
            GenError::Input {
                filename,
                path,
                problem,
                remedy,
            } => {
                write!(f, "input {filename}")?;
                if let Some(p) = path {
                    write!(f, " ({})", p.display())?;
                }
                write!(f, ": {problem}; {remedy}")
            }
            GenError::BuiltBundleDiffers { detail, cache } => write!(
                f,
                "the built bundle does not match the lock: {detail}\n(no bundle was written; every \
                 unit involved was compiled afresh, so the unit cache is not the cause; the extracted \
                 toolkit and DSL wheels under {0}/toolkit and {0}/dsl-site are reused: delete them to \
                 rule them out; `cargo run --release -p gdn-gen -- verify` lists every difference)",
                cache.display()
            ),
            GenError::Refused { step, problem } => write!(f, "{step}: {problem}"),
        }
    }
}

impl std::error::Error for GenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GenError::Io { source, .. } => Some(source),
            GenError::Document { source, .. } => Some(source),
            _ => None,
        }
    }
}
