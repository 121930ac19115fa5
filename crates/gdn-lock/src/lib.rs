//! The contract between the GDN bundle generator, the lock file and every
//! consumer of the bundle (the kernels crate's build.rs, `gdn-gen check`, Nix).
//!
//! Three documents, three owners:
//! - [`ArtifactTable`] (`generator/artifacts.json`, edited by hand): what to build,
//!   with which compiler, sources, flags and targets.
//! - [`Lock`] (`gdn-bundle.lock.json`, written only by `gdn-gen lock`): the pinned
//!   inputs with their hashes and the hashes of the device code they produce.
//! - [`Manifest`] (`manifest.json` inside a bundle, written by `gdn-gen build`):
//!   what a particular bundle holds.
//!
//! This crate does no network or process I/O; it reads files only to hash and
//! verify them (and lends gdn-gen its checked reads: [`open_regular_file`]).

mod bundle_files;
mod digest;
mod error;
mod fsread;
mod json;
mod lock;
mod manifest;
mod table;
mod verify;

pub use bundle_files::{check_relative_path, hash_source, MAX_ARTIFACT_BYTES, MAX_SOURCE_BYTES};
pub use digest::{DigestWriter, Digests, InvalidSha256, Sha256Hex};
pub use error::{Error, Result};
pub use fsread::{open_regular_file, read_regular_file, FileKind, Links};
pub use lock::{DslRuntimePin, HostArtifacts, Lock, LockedInput, VariantStatus};
pub use manifest::{
    ArtifactKind, DslIdentity, Manifest, ManifestArtifact, ToolchainIdentity, ToolkitKind,
};
pub use table::{
    file_name, ArtifactTable, Compiler, DslConfig, DslUnit, Geometry, InputRole, InputSpec,
    Specialization, TableRule, Unit, UnitOutput,
};
pub use verify::{
    check_lock_matches_table, check_sources_match_lock, verify_bundle, HostPolicy, VerifiedBundle,
};

/// Schema version of all three documents. A reader refuses any other value.
pub const SCHEMA_VERSION: u32 = 1;

/// Name of the manifest file at the root of a bundle.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Name of the lock file at the repository root.
pub const LOCK_FILE: &str = "gdn-bundle.lock.json";

/// Path of the artifact table relative to the repository root.
pub const TABLE_FILE: &str = "generator/artifacts.json";

/// Documents larger than this are refused before parsing (a corrupt or hostile
/// file should not make us allocate without bound).
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// Reads a document of ours: the schema version is checked first, so a
/// document from a newer generator is reported as such, not as a parse error.
pub(crate) fn read_versioned<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    parse_versioned(path, &read_capped(path)?)
}

/// [`read_versioned`] on bytes already read from `path`.
pub(crate) fn parse_versioned<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    bytes: &[u8],
) -> Result<T> {
    #[derive(serde::Deserialize)]
    struct Versioned {
        schema_version: u32,
    }
    let v: Versioned = parse(path, bytes)?;
    if v.schema_version != SCHEMA_VERSION {
        return Err(Error::SchemaVersion {
            path: path.to_owned(),
            expected: SCHEMA_VERSION,
            actual: v.schema_version,
        });
    }
    parse(path, bytes)
}

/// The file's bytes, refused before reading if it is not a regular file (a
/// FIFO or device would block or never end) or over [`MAX_DOCUMENT_BYTES`]
/// (a corrupt or hostile file should not make us allocate without bound).
pub(crate) fn read_capped(path: &std::path::Path) -> Result<Vec<u8>> {
    fsread::read_regular_file(path, MAX_DOCUMENT_BYTES, "this document", Links::Follow)
}

/// Parses one of our documents. Any object naming a key twice is refused
/// first: serde would keep one of the values silently, and a reviewer
/// reading the file may see the other.
fn parse<T: serde::de::DeserializeOwned>(path: &std::path::Path, bytes: &[u8]) -> Result<T> {
    let invalid = |e: serde_json::Error| Error::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    };
    json::reject_duplicate_keys(bytes).map_err(invalid)?;
    serde_json::from_slice(bytes).map_err(invalid)
}

/// The artifact table and the lock, checked to belong together (the lock was
/// written for this very table). What gdn-gen and build.rs both start from.
pub fn load_table_and_lock(
    table_path: &std::path::Path,
    lock_path: &std::path::Path,
) -> Result<(ArtifactTable, Lock)> {
    let (table, table_sha256) = ArtifactTable::load_with_sha256(table_path)?;
    let lock = Lock::load(lock_path)?;
    check_lock_matches_table(&table, &table_sha256, &lock)?;
    Ok((table, lock))
}

/// Serializes a document the one canonical way (pretty, trailing newline), so
/// that the same content always gives the same bytes.
pub fn to_canonical_json<T: serde::Serialize>(doc: &T) -> String {
    let mut s = serde_json::to_string_pretty(doc).expect("documents always serialize");
    s.push('\n');
    s
}
