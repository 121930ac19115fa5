use std::fmt;
use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

/// Every failure names the file or artifact, what was expected and what was
/// found, and says what to run to fix it.
#[derive(Debug)]
pub enum Error {
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    Parse {
        path: PathBuf,
        message: String,
    },
    TooLarge {
        path: PathBuf,
        limit: u64,
        actual: u64,
    },
    SchemaVersion {
        path: PathBuf,
        expected: u32,
        actual: u32,
    },
    Mismatch {
        what: String,
        expected: String,
        actual: String,
        remedy: &'static str,
    },
    Missing {
        what: String,
        remedy: &'static str,
    },
    Unexpected {
        what: String,
        remedy: &'static str,
    },
    UnsafePath {
        path: String,
        reason: &'static str,
    },
    /// A FIFO, socket, device or directory where a regular file must be.
    NotRegularFile {
        path: PathBuf,
    },
}

impl Error {
    pub fn mismatch(
        what: impl Into<String>,
        expected: impl fmt::Display,
        actual: impl fmt::Display,
        remedy: &'static str,
    ) -> Self {
        Error::Mismatch {
            what: what.into(),
            expected: expected.to_string(),
            actual: actual.to_string(),
            remedy,
        }
    }
}

/// Remedies shared by several checks.
pub const REMEDY_REBUILD: &str =
    "rebuild the bundle with `cargo run --release -p gdn-gen -- build`";
/// For a bundle whose bytes are not the locked ones. Said to consumers
/// (build.rs, `gdn-gen check`): re-locking would make the lock follow a
/// bundle nobody has explained, so it is not the advice.
pub const REMEDY_BYTES_DIFFER: &str =
    "the bundle's bytes are not the locked ones: rebuild it with `cargo run --release -p gdn-gen -- build`; \
     if a fresh build differs too, find out why with `cargo run --release -p gdn-gen -- verify` \
     (it lists every difference); do not re-lock to make a bundle pass";
/// For a lock that disagrees with the very table it records the hash of.
pub const REMEDY_LOCK_EDITED: &str =
    "the lock disagrees with the artifact table it was written for (edited by hand?); \
     restore gdn-bundle.lock.json from version control";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                path,
                action,
                source,
            } => {
                write!(f, "cannot {action} {}: {source}", path.display())
            }
            Error::Parse { path, message } => {
                write!(f, "{} is not valid: {message}", path.display())
            }
            Error::TooLarge {
                path,
                limit,
                actual,
            } => write!(
                f,
                "{} is {actual} bytes, over the {limit}-byte limit for this document",
                path.display()
            ),
            Error::SchemaVersion {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{}: schema_version {actual} is not supported (expected {expected}); \
                 use a gdn-gen that matches this checkout",
                path.display()
            ),
            Error::Mismatch {
                what,
                expected,
                actual,
                remedy,
            } => {
                write!(f, "{what}: expected {expected}, found {actual}; {remedy}")
            }
            Error::Missing { what, remedy } => write!(f, "{what} is missing; {remedy}"),
            Error::Unexpected { what, remedy } => {
                write!(f, "{what} is not expected here; {remedy}")
            }
            Error::UnsafePath { path, reason } => {
                write!(f, "refusing artifact path {path:?}: {reason}")
            }
            Error::NotRegularFile { path } => write!(
                f,
                "{} is not a regular file (a FIFO, socket, device or directory, or replaced \
                 while being opened); refusing to read it",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
