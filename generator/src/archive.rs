//! Wheels are zip archives: extracting their members (never outside the
//! destination) and hashing one member, both streamed.

use std::path::Path;

use gdn_lock::{open_regular_file, DigestWriter, Digests, Links};

use crate::error::{GenError, Result};

/// A wheel's error: its file name and path, the problem, and the remedy.
fn input_error(zip_path: &Path, problem: String) -> GenError {
    GenError::Input {
        filename: zip_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: Some(zip_path.to_owned()),
        problem,
        remedy: "remove it from the cache so it is fetched again".into(),
    }
}

/// The archive at `zip_path`, opened through the regular-file check (an
/// input under --inputs-dir may be a link, as Nix makes them).
fn open(zip_path: &Path, what: &str) -> Result<zip::ZipArchive<std::fs::File>> {
    let (file, _) = open_regular_file(zip_path, Links::Follow)
        .map_err(|e| input_error(zip_path, format!("{what}: {e}")))?;
    zip::ZipArchive::new(file).map_err(|e| input_error(zip_path, format!("{what}: {e}")))
}

/// Extracts the members of a zip (wheel) accepted by `keep`, refusing any
/// member whose name would land outside `dest`; keeps the executable bit.
pub fn extract_zip(zip_path: &Path, dest: &Path, keep: impl Fn(&str) -> bool) -> Result<usize> {
    let what = "cannot be extracted";
    let err = |e: &dyn std::fmt::Display| input_error(zip_path, format!("{what}: {e}"));
    let mut archive = open(zip_path, what)?;
    let mut count = 0;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| err(&e))?;
        if entry.is_dir() || !keep(entry.name()) {
            continue;
        }
        let rel = entry
            .enclosed_name()
            .ok_or_else(|| err(&format!("member {:?} escapes the archive", entry.name())))?;
        let out = dest.join(rel);
        std::fs::create_dir_all(out.parent().expect("member has a parent")).map_err(|e| err(&e))?;
        let mut file = std::fs::File::create(&out).map_err(|e| err(&e))?;
        std::io::copy(&mut entry, &mut file).map_err(|e| err(&e))?;
        #[cfg(unix)]
        if entry.unix_mode().is_some_and(|m| m & 0o111 != 0) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| err(&e))?;
        }
        count += 1;
    }
    Ok(count)
}

/// The digests of member `name` of the zip at `zip_path`, `None` if it has
/// none.
pub fn zip_member_digests(zip_path: &Path, name: &str) -> Result<Option<Digests>> {
    let what = format!("cannot read its member {name}");
    let err = |e: &dyn std::fmt::Display| input_error(zip_path, format!("{what}: {e}"));
    let mut archive = open(zip_path, &what)?;
    let mut entry = match archive.by_name(name) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(err(&e)),
    };
    let mut hasher = DigestWriter::default();
    std::io::copy(&mut entry, &mut hasher).map_err(|e| err(&e))?;
    Ok(Some(hasher.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zip_members_outside_dest_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let zpath = dir.path().join("evil.zip");
        {
            let mut w = zip::ZipWriter::new(std::fs::File::create(&zpath).unwrap());
            w.start_file("../escape.txt", zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut w, b"x").unwrap();
            w.finish().unwrap();
        }
        let err = extract_zip(&zpath, &dir.path().join("out"), |_| true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("escapes"), "{err}");
        assert!(!dir.path().join("escape.txt").exists());
    }
}
