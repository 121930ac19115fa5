//! Verification of a bundle directory against the table and the lock. Used by
//! the kernels crate's build.rs (fail closed) and by `gdn-gen check`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod contents;
mod pins;

use crate::bundle_files::hash_source;
use crate::digest::Sha256Hex;
use crate::error::{Error, Result, REMEDY_BYTES_DIFFER, REMEDY_LOCK_EDITED, REMEDY_REBUILD};
use crate::lock::Lock;
use crate::manifest::Manifest;
use crate::table::ArtifactTable;
use contents::{
    check_device_code, check_dsl_outputs, check_dsl_runtime, check_header_and_libraries,
    check_host_objects_embed_cubins, check_identity, check_inputs, check_listing, load_manifest,
    read_artifacts, FileDigests,
};
use pins::HostPins;

/// A bundle whose every file was read once, hashed and matched. `files`
/// holds those very bytes: consumers write or link these, never re-read the
/// directory (which could have changed since).
#[derive(Debug)]
pub struct VerifiedBundle {
    pub root: PathBuf,
    pub manifest: Manifest,
    pub files: BTreeMap<String, Vec<u8>>,
    /// Whether the host code was built by the same host compiler and toolkit
    /// as the lock's and therefore checked byte for byte against it.
    pub host_matches_lock: bool,
}

/// How strict to be about host code (device code is always pinned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostPolicy {
    /// Host objects and libraries must be the lock's bytes (same host
    /// compiler and toolkit as the machine that recorded the lock).
    #[default]
    Locked,
    /// Host objects built by another host compiler are accepted if they embed
    /// the locked cubins; a toolkit library must still match the lock when the
    /// toolkit kind is the lock's. For builders that compiled the bundle
    /// themselves from the pinned sources (gdn-gen, Nix).
    AllowForeignHostCompiler,
}

/// Checks the lock was written for this table and agrees with it.
pub fn check_lock_matches_table(
    table: &ArtifactTable,
    table_sha256: &Sha256Hex,
    lock: &Lock,
) -> Result<()> {
    if &lock.table_sha256 != table_sha256 {
        return Err(Error::mismatch(
            "generator/artifacts.json (table_sha256 recorded in the lock)",
            &lock.table_sha256,
            table_sha256,
            "the artifact table changed since the lock was written; \
             run `cargo run --release -p gdn-gen -- lock` and review the diff",
        ));
    }
    // The table's hash matched, so a disagreement means the lock was edited.
    if table.abi_version != lock.abi_version {
        return Err(Error::mismatch(
            "lock abi_version",
            table.abi_version,
            lock.abi_version,
            REMEDY_LOCK_EDITED,
        ));
    }
    if table.nvcc_version != lock.nvcc_version {
        return Err(Error::mismatch(
            "lock nvcc_version",
            &table.nvcc_version,
            &lock.nvcc_version,
            REMEDY_LOCK_EDITED,
        ));
    }
    Ok(())
}

/// What to do when one of our sources differs from the lock's hash.
const REMEDY_SOURCE: &str = "bundles are built from the locked sources only: restore the file \
     (`git checkout -- <file>`), or, if the edit is intended, record it with \
     `cargo run --release -p gdn-gen -- lock` (which also rebuilds the bundle) and review the diff";

/// Checks that our sources and patches in the repository at `repo` (the
/// table's `sources` and `patches`) are the files the lock pins: an edit
/// after the bundle was built means the bundle no longer comes from the
/// working tree.
pub fn check_sources_match_lock(repo: &Path, table: &ArtifactTable, lock: &Lock) -> Result<()> {
    let listed: BTreeSet<&String> = table.sources.iter().chain(&table.patches).collect();
    if let Some(extra) = lock.sources.keys().find(|p| !listed.contains(p)) {
        return Err(Error::Unexpected {
            what: format!("lock entry for source {extra} (the table lists no such source)"),
            remedy: REMEDY_LOCK_EDITED,
        });
    }
    for path in listed {
        let pinned = lock.sources.get(path).ok_or_else(|| Error::Missing {
            what: format!("lock entry for source {path}"),
            remedy: REMEDY_LOCK_EDITED,
        })?;
        let actual = hash_source(&repo.join(path))
            .map_err(|e| Error::Missing {
                what: format!("source {path} ({e})"),
                remedy: REMEDY_SOURCE,
            })?
            .sha256;
        if &actual != pinned {
            return Err(Error::mismatch(
                format!("source {path} (sha256 pinned by the lock)"),
                pinned,
                actual,
                REMEDY_SOURCE,
            ));
        }
    }
    Ok(())
}

/// Verifies every file of the bundle at `root` against the table and lock.
pub fn verify_bundle(
    root: &Path,
    table: &ArtifactTable,
    lock: &Lock,
    policy: HostPolicy,
) -> Result<VerifiedBundle> {
    let manifest = load_manifest(root)?;
    check_identity(table, lock, &manifest)?;
    check_inputs(table, lock, &manifest)?;
    check_listing(root, table, &manifest)?;
    let host = HostPins::of(lock, &manifest);
    let (files, actual) = read_artifacts(root, lock, &manifest, host)?;
    check_device_code(table, lock, &manifest, &actual)?;
    check_host_objects_embed_cubins(table, &manifest, &files)?;
    check_dsl_outputs(table, lock, &manifest, &files, &actual)?;
    check_dsl_runtime(table, lock, &manifest, &actual)?;
    check_header_and_libraries(table, lock, &manifest)?;
    check_host_code(lock, &manifest, host, &actual, policy)?;
    Ok(VerifiedBundle {
        root: root.to_path_buf(),
        manifest,
        files,
        host_matches_lock: host.matches_lock,
    })
}

/// 7. Host code. Byte-identical to the lock when built by the lock's host
///    compiler and toolkit. Otherwise only under AllowForeignHostCompiler,
///    and even then a toolkit library from the lock's toolkit (the pinned
///    wheels) must be the lock's bytes.
///
///    Under the opt-in, a library from an external toolkit
///    (`--toolkit-root`) is accepted as the manifest lists it: no lock
///    pins that toolkit's bytes. Refusing that combination would refuse
///    every Nix build (nixpkgs' toolkit and compiler), and would not make
///    the opt-in safe: it already links host objects whose code nothing
///    pins into the same binary. The opt-in trusts the host code of
///    whoever built the bundle; device code stays pinned. A toolkit kind
///    gdn-gen never writes is refused when the manifest is read
///    (ToolkitKind), so only those two kinds reach this point.
fn check_host_code(
    lock: &Lock,
    manifest: &Manifest,
    host: HostPins,
    actual: &FileDigests,
    policy: HostPolicy,
) -> Result<()> {
    for (path, locked) in &lock.host_artifacts.artifacts {
        let kind = manifest.artifacts.get(path).map(|a| a.kind);
        if host.matches_lock || kind.is_some_and(|k| host.pinned(k)) {
            let got = actual.get(path).ok_or_else(|| Error::Missing {
                what: format!("host artifact {path}"),
                remedy: REMEDY_REBUILD,
            })?;
            locked.expect_eq(
                &format!("host artifact {path} (against the lock)"),
                got,
                REMEDY_BYTES_DIFFER,
            )?;
        }
    }
    if !host.matches_lock && policy == HostPolicy::Locked {
        return Err(Error::mismatch(
            "host compiler / toolkit of the bundle's host objects",
            format!("{:?} / {} (the lock's)", lock.host_artifacts.host_compiler, lock.host_artifacts.toolkit),
            format!("{:?} / {}", manifest.toolchain.host_compiler, manifest.toolchain.toolkit),
            "host objects are only reproducible per host compiler; use a bundle built by the lock's compiler, \
             or accept this one explicitly (GDN_ALLOW_FOREIGN_HOST_OBJECTS=1 for build.rs, \
             --allow-foreign-host-compiler for gdn-gen check): its device code is still the locked cubins",
        ));
    }
    Ok(())
}
