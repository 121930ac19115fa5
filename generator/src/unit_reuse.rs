//! `gdn-gen lock` without compiling again what did not change.
//!
//! `lock` compiles into a fresh unit cache so that what an earlier build
//! left behind (a corrupt or stale entry) is never recorded. That made every
//! relock a cold build: an edit of one kernel file cost the three FlashInfer
//! units too (docs/reproducibility.md, "What a relock recompiles", has the
//! figures). A unit is now taken from the shared cache into the fresh one
//! when both hold:
//! - its entry is complete under the unit's current key (unit_key.rs: the
//!   same description, sources it reads, kernel source and toolchain), and
//! - every file it puts in the bundle has, in the current lock, the same
//!   hashes (host objects only when the lock's host compiler and toolkit are
//!   this run's).
//!
//! The second condition is what keeps the lock honest: the entry's bytes are
//! the ones the lock already records, which a from-scratch build reproduces
//! (CI checks that on every run); a corrupt entry matches nothing and is
//! compiled afresh, as is every unit whose inputs changed.

use std::path::Path;

use gdn_lock::{ArtifactTable, Digests, Links, Lock, Sha256Hex, ToolchainIdentity};

use crate::error::{GenError, Result};
use crate::files;
use crate::toolkit::Toolkit;
use crate::units::{entry_dir, UnitOutputs};

/// Whether host code built with `toolchain` is comparable with the lock's
/// (same host compiler and toolkit).
pub fn built_like(toolchain: &ToolchainIdentity, lock: &Lock) -> bool {
    toolchain.host_compiler == lock.host_artifacts.host_compiler
        && toolchain.toolkit == lock.host_artifacts.toolkit
}

/// The lock's hashes of bundle file `path` (device code, DSL outputs, and
/// host code when `host_like_lock`).
pub fn locked_digests<'a>(lock: &'a Lock, path: &str, host_like_lock: bool) -> Option<&'a Digests> {
    lock.device_artifacts
        .get(path)
        .or_else(|| lock.dsl_artifacts.get(path))
        .or_else(|| {
            host_like_lock
                .then(|| lock.host_artifacts.artifacts.get(path))
                .flatten()
        })
}

/// Where `lock` may take units from, and the lock that vouches for them.
pub struct Reuse<'a> {
    pub shared_cache: &'a Path,
    pub lock: &'a Lock,
}

/// Copies the reusable entries (see the module doc) into `fresh_cache`;
/// returns the names of the units taken.
pub fn seed(
    table: &ArtifactTable,
    keys: &[Sha256Hex],
    fresh_cache: &Path,
    reuse: &Reuse,
    tk: &Toolkit,
) -> Result<Vec<String>> {
    let lock = reuse.lock;
    let host_like_lock = built_like(&tk.identity, lock);
    let mut taken = vec![];
    for (unit, key) in table.units.iter().zip(keys) {
        let shared = entry_dir(reuse.shared_cache, unit, key);
        let fresh = entry_dir(fresh_cache, unit, key);
        if !shared.join(".complete").exists() || fresh.exists() {
            continue;
        }
        let entry = UnitOutputs {
            unit: unit.clone(),
            dir: shared.clone(),
            compiled_now: false,
        };
        let vouched = entry.files().iter().all(|(path, file, _)| {
            match (
                locked_digests(lock, path, host_like_lock),
                Digests::of_file_with(file, Links::Refuse),
            ) {
                (Some(l), Ok(d)) => l == &d,
                _ => false,
            }
        });
        if !vouched {
            continue;
        }
        copy_dir(&shared, &fresh)?;
        taken.push(unit.name.clone());
    }
    Ok(taken)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let step = "copy a unit cache entry the lock vouches for";
    std::fs::create_dir_all(to).map_err(|e| GenError::io(step, to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| GenError::io(step, from, e))? {
        let entry = entry.map_err(|e| GenError::io(step, from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|e| GenError::io(step, &src, e))?;
        if kind.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            // Anything but a regular file is refused there, naming it.
            files::copy(step, &src, &dst, Links::Refuse)?;
        }
    }
    Ok(())
}
