use std::fmt;
use std::path::PathBuf;

use crate::fsread::FileKind;
use crate::table::TableRule;

pub type Result<T> = std::result::Result<T, Error>;

/// Every failure names the file or artifact, what was expected and what was
/// found, and says what to run to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{} is not valid: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// The artifact table breaks a rule serde cannot express.
    #[error("{} is not valid: {rule}", path.display())]
    InvalidTable { path: PathBuf, rule: TableRule },
    #[error("{} is {actual} bytes, over the {limit}-byte limit for {what}", path.display())]
    TooLarge {
        path: PathBuf,
        /// `this document`, `a bundle artifact`, `a source`.
        what: &'static str,
        limit: u64,
        actual: u64,
    },
    #[error(
        "{}: schema_version {actual} is not supported (expected {expected}); \
         use a gdn-gen that matches this checkout",
        path.display()
    )]
    SchemaVersion {
        path: PathBuf,
        expected: u32,
        actual: u32,
    },
    #[error("{what}: expected {expected}, found {actual}; {remedy}")]
    Mismatch {
        what: String,
        expected: String,
        actual: String,
        remedy: &'static str,
    },
    #[error("{what} is missing; {remedy}")]
    Missing { what: String, remedy: &'static str },
    #[error("{what} is not expected here; {remedy}")]
    Unexpected { what: String, remedy: &'static str },
    #[error("refusing artifact path {path:?}: {reason}")]
    UnsafePath { path: String, reason: &'static str },
    /// A FIFO, socket, device, directory or (where links are refused) a
    /// symbolic link where a regular file must be; `None`: the file was
    /// replaced between the check and the open.
    #[error("{} is {}, not a regular file; refusing to read it", path.display(), found_kind(found))]
    NotRegularFile {
        path: PathBuf,
        found: Option<FileKind>,
    },
    /// A file that changed size while it was being read.
    #[error(
        "{} changed while it was being read ({expected} bytes when opened, {actual} read); {REMEDY_REBUILD}",
        path.display()
    )]
    ChangedWhileRead {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
}

fn found_kind(found: &Option<FileKind>) -> String {
    match found {
        Some(kind) => kind.to_string(),
        None => "something else than when it was checked (replaced while being opened)".into(),
    }
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
