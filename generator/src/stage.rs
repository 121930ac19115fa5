//! The staging tree every compile runs in: FlashInfer's pinned sources (plus
//! our patches) under `flashinfer/`, our own sources under `src/`. Compiles
//! run with this directory as the working directory and only relative paths,
//! so no absolute path reaches the compiler's outputs.

use std::path::Path;
use std::process::Command;

use gdn_lock::{ArtifactTable, Links};

use crate::archive::extract_zip;
use crate::error::{GenError, Result};
use crate::files;
use crate::process::run;

/// Staged path of one of our sources (by repository path).
pub fn staged_source(repo_path: &str) -> String {
    format!("src/{}", repo_path.rsplit('/').next().unwrap_or(repo_path))
}

pub fn prepare(table: &ArtifactTable, repo: &Path, kernel_wheel: &Path, dir: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let step = "prepare the staging tree";
    std::fs::create_dir_all(dir.join("src")).map_err(|e| GenError::io(step, dir, e))?;
    let members = &table.kernel_source_members;
    let n = extract_zip(kernel_wheel, dir, |name| {
        members.iter().any(|m| name.starts_with(m.as_str()))
    })?;
    if n == 0 {
        return Err(GenError::Input {
            filename: file_name(kernel_wheel),
            path: Some(kernel_wheel.to_owned()),
            problem: format!("has no kernel-source members {members:?}"),
            remedy: "check the table's kernel_source_members".into(),
        });
    }
    for patch in &table.patches {
        apply_patch(&repo.join(patch), dir, patch)?;
    }
    let mut seen = std::collections::BTreeSet::new();
    for src in &table.sources {
        let staged = staged_source(src);
        if !seen.insert(staged.clone()) {
            return Err(GenError::refused(
                step,
                format!("two sources stage to the same name {staged}"),
            ));
        }
        files::copy(step, &repo.join(src), &dir.join(&staged), Links::Follow)?;
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Applies one patch with `patch -p1` inside the staging root; a patch that
/// no longer applies stops the build and names itself.
pub fn apply_patch(patch_file: &Path, stage_dir: &Path, name: &str) -> Result<()> {
    run(
        &format!("apply patch {name} (it no longer applies to the pinned sources; refresh it)"),
        Command::new("patch")
            .args([
                "-p1",
                "--forward",
                "--batch",
                "--no-backup-if-mismatch",
                "-d",
            ])
            .arg(stage_dir)
            .arg("-i")
            .arg(patch_file),
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_that_does_not_apply_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("stage/a")).unwrap();
        std::fs::write(dir.path().join("stage/a/f.txt"), "one\ntwo\n").unwrap();
        let patch = dir.path().join("p.patch");
        std::fs::write(
            &patch,
            "--- a/a/f.txt\n+++ b/a/f.txt\n@@ -1,2 +1,2 @@\n-uno\n+ONE\n two\n",
        )
        .unwrap();
        let err = apply_patch(&patch, &dir.path().join("stage"), "patches/0001-x.patch")
            .unwrap_err()
            .to_string();
        assert!(err.contains("patches/0001-x.patch"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stage/a/f.txt")).unwrap(),
            "one\ntwo\n"
        );
    }

    #[test]
    fn patch_that_applies_changes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("stage/a")).unwrap();
        std::fs::write(dir.path().join("stage/a/f.txt"), "one\ntwo\n").unwrap();
        let patch = dir.path().join("p.patch");
        std::fs::write(
            &patch,
            "--- a/a/f.txt\n+++ b/a/f.txt\n@@ -1,2 +1,2 @@\n-one\n+ONE\n two\n",
        )
        .unwrap();
        apply_patch(&patch, &dir.path().join("stage"), "p").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stage/a/f.txt")).unwrap(),
            "ONE\ntwo\n"
        );
    }
}
