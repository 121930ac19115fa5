use std::fmt;
use std::path::PathBuf;

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

/// What was found where a regular file was expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    SymbolicLink,
    Fifo,
    Socket,
    Device,
    Other,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::SymbolicLink => "a symbolic link",
            FileKind::Fifo => "a FIFO",
            FileKind::Socket => "a socket",
            FileKind::Device => "a device",
            FileKind::Other => "neither a file nor a directory",
        })
    }
}

/// A structural rule of the table that serde cannot express, broken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableRule {
    #[error("unit name {0:?} appears twice")]
    DuplicateUnit(String),
    #[error("unit {0:?} has no targets")]
    NoTargets(String),
    #[error("unit name {0:?} must be [A-Za-z0-9_]")]
    UnitName(String),
    #[error("host-object unit {0:?} may have at most one target")]
    HostObjectTargets(String),
    #[error(
        "unit {0:?}: `compiler: cute-dsl`, `output: dsl-objects` and a `dsl` section go together"
    )]
    DslTogether(String),
    #[error("DSL unit {0:?} needs exactly one target")]
    DslTargets(String),
    #[error("DSL unit {0:?} needs the table's `dsl` section")]
    DslSection(String),
    #[error("DSL unit {0:?} has no variants")]
    DslNoVariants(String),
    #[error("DSL unit {unit:?}: variant {variant:?} must be [a-z0-9_] and unique in the table")]
    DslVariant { unit: String, variant: String },
    #[error("unit {unit:?}: target {target:?} is not of the form sm_XY")]
    Target { unit: String, target: String },
    #[error("exactly one input must have role kernel-source")]
    KernelSourceCount,
    #[error("with a `dsl` section, at least one input must have role dsl-kernel-source")]
    NoDslKernelSource,
    #[error("input {input} is for Python {python}, which is not among dsl.pythons {pythons:?}")]
    InputPython {
        input: String,
        python: String,
        pythons: Vec<String>,
    },
}
