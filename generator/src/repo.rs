//! The repository a command works in: the lock's directory, with the
//! artifact table and the lock read and our sources checked against it.

use std::path::{Path, PathBuf};

use gdn_lock::{ArtifactTable, Lock, TABLE_FILE};

use crate::error::{GenError, Result};

/// The repository root: the lock's directory.
pub fn repo_root(lock_path: &Path) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(lock_path).map_err(|e| {
        GenError::refused(
            "find the repository",
            format!(
                "lock {}: {e}; run from the repository root or pass --lock",
                lock_path.display()
            ),
        )
    })?;
    Ok(abs.parent().expect("a file has a parent").to_path_buf())
}

/// Table, lock, and a check that our sources are the ones the lock pins.
pub fn load_locked(lock_path: &Path) -> Result<(PathBuf, ArtifactTable, Lock)> {
    let repo = repo_root(lock_path)?;
    let (table, lock) = gdn_lock::load_table_and_lock(&repo.join(TABLE_FILE), lock_path)
        .map_err(|e| GenError::document("read the table and the lock", e))?;
    gdn_lock::check_sources_match_lock(&repo, &table, &lock)
        .map_err(|e| GenError::document("check our sources against the lock", e))?;
    Ok((repo, table, lock))
}
