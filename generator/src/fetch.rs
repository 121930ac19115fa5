//! Pinned inputs: found in --inputs-dir or the cache, or downloaded; always
//! checked against the lock's sha256 and size before use.

use std::path::{Path, PathBuf};
use std::process::Command;

use gdn_lock::{Digests, LockedInput};

use crate::error::{GenError, Result};
use crate::process::run;

/// Where a verified copy of `input` lives in the cache.
fn cached_path(cache: &Path, filename: &str) -> PathBuf {
    cache.join("downloads").join(filename)
}

/// Why the file at `path` is not `input` (size and sha256 against the lock),
/// or `None` when it is.
fn mismatch(path: &Path, input: &LockedInput) -> Result<Option<String>> {
    let d = Digests::of_file(path).map_err(|e| GenError::document("hash an input", e))?;
    if d.size == input.size && d.sha256 == input.sha256 {
        return Ok(None);
    }
    Ok(Some(format!(
        "does not match the lock: expected sha256 {} ({} bytes), found {} ({} bytes)",
        input.sha256, input.size, d.sha256, d.size
    )))
}

/// Returns a path to a copy of `input` whose hash matches the lock.
pub fn ensure_input(
    input: &LockedInput,
    cache: &Path,
    inputs_dir: Option<&Path>,
    offline: bool,
) -> Result<PathBuf> {
    let refuse = |path: &Path, problem: String, remedy: &str| GenError::Input {
        filename: input.filename.clone(),
        path: Some(path.to_owned()),
        problem,
        remedy: remedy.to_string(),
    };
    if let Some(dir) = inputs_dir {
        let p = dir.join(&input.filename);
        if p.exists() {
            return match mismatch(&p, input)? {
                None => Ok(p),
                Some(why) => Err(refuse(
                    &p,
                    why,
                    "the file is corrupt or not the pinned release; replace it with the one the lock's URL serves",
                )),
            };
        }
    }
    let dest = cached_path(cache, &input.filename);
    if dest.exists() {
        let Some(why) = mismatch(&dest, input)? else {
            return Ok(dest);
        };
        std::fs::remove_file(&dest)
            .map_err(|e| GenError::io("remove a corrupt cached input", &dest, e))?;
        if offline {
            return Err(refuse(
                &dest,
                format!("the cached copy {why}, so it was removed"),
                &format!(
                    "--offline forbids fetching it again from {}: put a good copy in --inputs-dir, \
                     or run once without --offline",
                    input.url
                ),
            ));
        }
        eprintln!(
            "gdn-gen: cached {} {why}; removed it, fetching it again",
            input.filename
        );
    }
    if offline {
        return Err(GenError::Input {
            filename: input.filename.clone(),
            path: None,
            problem: "is not in --inputs-dir or the cache".into(),
            remedy: format!(
                "--offline forbids downloading it from {}: put it in --inputs-dir, or drop --offline",
                input.url
            ),
        });
    }
    download(&input.url, &dest)?;
    if let Some(why) = mismatch(&dest, input)? {
        let _ = std::fs::remove_file(&dest);
        return Err(refuse(
            &dest,
            format!("the download from {} {why}", input.url),
            "the server no longer serves the pinned release; nothing was kept",
        ));
    }
    Ok(dest)
}

/// Downloads `url` to `dest` through a temporary name, so a failed or partial
/// download never sits under the final name.
pub fn download(url: &str, dest: &Path) -> Result<()> {
    let dir = dest.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir).map_err(|e| GenError::io("create the download cache", dir, e))?;
    let part = dest.with_extension("part");
    eprintln!("gdn-gen: downloading {url}");
    run(
        &format!("download {url}"),
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&part)
            .arg(url),
    )?;
    std::fs::rename(&part, dest).map_err(|e| GenError::io("finish a download", &part, e))
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
        let err = ensure_input(&input, &dir.path().join("cache"), Some(dir.path()), true)
            .unwrap_err()
            .to_string();
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
        let err = ensure_input(&locked(b"p"), &dir.path().join("cache"), None, true)
            .unwrap_err()
            .to_string();
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

    #[test]
    fn corrupt_cache_entry_offline_says_so_instead_of_promising_a_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir_all(cache.join("downloads")).unwrap();
        std::fs::write(cache.join("downloads/x.whl"), b"bad").unwrap();
        let input = locked(b"good");
        let err = ensure_input(&input, &cache, None, true)
            .unwrap_err()
            .to_string();
        // What is wrong (the cached copy, with both hashes), where, and what to do.
        assert!(
            err.contains("does not match the lock")
                && err.contains(&cache.join("downloads/x.whl").display().to_string())
                && err.contains(input.sha256.as_str())
                && err.contains(Sha256Hex::of_bytes(b"bad").as_str())
                && err.contains("--offline")
                && err.contains("--inputs-dir"),
            "{err}"
        );
        assert!(
            !err.contains("is not in --inputs-dir or the cache"),
            "{err}"
        );
    }
}
