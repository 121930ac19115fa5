//! Pinned inputs: found in --inputs-dir or the cache, or downloaded; always
//! checked against the lock's sha256 and size before use.

use std::path::{Path, PathBuf};
use std::process::Command;

use gdn_lock::{Digests, LockedInput};

use crate::process::{run, Result};

/// Where a verified copy of `input` lives in the cache.
fn cached_path(cache: &Path, filename: &str) -> PathBuf {
    cache.join("downloads").join(filename)
}

fn check(path: &Path, input: &LockedInput) -> Result<()> {
    let d = Digests::of_file(path).map_err(|e| e.to_string())?;
    if d.size != input.size || d.sha256 != input.sha256 {
        return Err(format!(
            "input {} ({}): expected sha256 {} ({} bytes), found {} ({} bytes); \
             the file is corrupt or not the pinned release",
            input.filename,
            path.display(),
            input.sha256,
            input.size,
            d.sha256,
            d.size
        ));
    }
    Ok(())
}

/// Returns a path to a copy of `input` whose hash matches the lock.
pub fn ensure_input(
    input: &LockedInput,
    cache: &Path,
    inputs_dir: Option<&Path>,
    offline: bool,
) -> Result<PathBuf> {
    if let Some(dir) = inputs_dir {
        let p = dir.join(&input.filename);
        if p.exists() {
            check(&p, input)?;
            return Ok(p);
        }
    }
    let dest = cached_path(cache, &input.filename);
    if dest.exists() {
        if check(&dest, input).is_ok() {
            return Ok(dest);
        }
        eprintln!(
            "gdn-gen: cached {} does not match the lock; fetching again",
            input.filename
        );
        std::fs::remove_file(&dest).map_err(|e| format!("remove {}: {e}", dest.display()))?;
    }
    if offline {
        return Err(format!(
            "input {} is not in --inputs-dir or the cache and --offline forbids downloading it from {}",
            input.filename, input.url
        ));
    }
    download(&input.url, &dest)?;
    check(&dest, input).inspect_err(|_| {
        let _ = std::fs::remove_file(&dest);
    })?;
    Ok(dest)
}

/// Downloads `url` to `dest` through a temporary name, so a failed or partial
/// download never sits under the final name.
pub fn download(url: &str, dest: &Path) -> Result<()> {
    let dir = dest.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let part = dest.with_extension("part");
    eprintln!("gdn-gen: downloading {url}");
    run(
        "download",
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&part)
            .arg(url),
    )?;
    std::fs::rename(&part, dest).map_err(|e| format!("rename {}: {e}", part.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdn_lock::{InputRole, Sha256Hex};

    fn locked(bytes: &[u8]) -> LockedInput {
        LockedInput {
            name: "x".into(),
            version: "1".into(),
            role: InputRole::KernelSource,
            filename: "x.whl".into(),
            url: "http://127.0.0.1:9/x.whl".into(),
            sha256: Sha256Hex::of_bytes(bytes),
            size: bytes.len() as u64,
            git_revision: None,
            python: None,
        }
    }

    #[test]
    fn inputs_dir_copy_with_the_pinned_hash_is_used() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.whl"), b"payload").unwrap();
        let p = ensure_input(
            &locked(b"payload"),
            &dir.path().join("cache"),
            Some(dir.path()),
            true,
        )
        .unwrap();
        assert_eq!(p, dir.path().join("x.whl"));
    }

    #[test]
    fn tampered_input_is_refused_with_both_hashes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.whl"), b"payloaX").unwrap();
        let input = locked(b"payload");
        let err =
            ensure_input(&input, &dir.path().join("cache"), Some(dir.path()), true).unwrap_err();
        assert!(err.contains("x.whl"), "{err}");
        assert!(err.contains(input.sha256.as_str()), "{err}");
        assert!(
            err.contains(Sha256Hex::of_bytes(b"payloaX").as_str()),
            "{err}"
        );
    }

    #[test]
    fn offline_without_a_copy_fails_and_names_the_url() {
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_input(&locked(b"p"), &dir.path().join("cache"), None, true).unwrap_err();
        assert!(
            err.contains("--offline") && err.contains("http://127.0.0.1:9/x.whl"),
            "{err}"
        );
    }

    #[test]
    fn corrupt_cache_entry_is_not_used_offline() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir_all(cache.join("downloads")).unwrap();
        std::fs::write(cache.join("downloads/x.whl"), b"bad").unwrap();
        assert!(ensure_input(&locked(b"good"), &cache, None, true).is_err());
        assert!(
            !cache.join("downloads/x.whl").exists(),
            "the corrupt copy must be removed"
        );
    }
}
