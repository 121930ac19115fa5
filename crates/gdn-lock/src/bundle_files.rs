//! Reading a bundle's files and our sources for verification: every file
//! checked to be a regular file (and, in a bundle, reached through no
//! symbolic link), its size compared before anything is read, its hashes
//! taken as it is read.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Component, Path};

use crate::digest::{DigestWriter, Digests};
use crate::error::{Error, Result, REMEDY_REBUILD};
use crate::fsread::{open_regular_file, read_regular_file, Links};

/// Rejects absolute paths, `..`, `.`, empty components and backslashes, so a
/// manifest cannot name a file outside the bundle.
pub fn check_relative_path(path: &str) -> Result<()> {
    let unsafe_path = |reason| {
        Err(Error::UnsafePath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return unsafe_path("empty path");
    }
    if path.starts_with('/') {
        return unsafe_path("absolute path");
    }
    if path.contains('\\') || path.contains('\0') {
        return unsafe_path("backslash or NUL in path");
    }
    if path.split('/').any(|c| c.is_empty()) {
        return unsafe_path("empty path component");
    }
    for c in Path::new(path).components() {
        match c {
            Component::Normal(_) => {}
            Component::ParentDir => return unsafe_path("path escapes the bundle with `..`"),
            Component::RootDir | Component::Prefix(_) => return unsafe_path("absolute path"),
            Component::CurDir => return unsafe_path("`.` component"),
        }
    }
    Ok(())
}

/// The largest file a bundle may hold. Bundle files are read whole (their
/// verified bytes are what consumers link), so a file over this is refused
/// before it is read, even one the manifest vouches for. Far above the
/// largest real artifact (docs/reproducibility.md gives the sizes).
pub const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// The largest source of ours that is hashed (the lock pins no size for
/// them, so a huge file would otherwise be hashed to its end).
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// Opens the file at `root/rel`, after checking that no component on the
/// way is a symbolic link (a link could point out of the bundle), and that
/// the opened file is the regular file the path names. Returns the file and
/// its size.
fn open_inside(root: &Path, rel: &str) -> Result<(std::fs::File, u64)> {
    check_relative_path(rel)?;
    let mut cur = root.to_path_buf();
    for part in rel.split('/') {
        cur.push(part);
        let meta = std::fs::symlink_metadata(&cur).map_err(|source| Error::Io {
            path: cur.clone(),
            action: "stat",
            source,
        })?;
        if meta.file_type().is_symlink() {
            return Err(Error::UnsafePath {
                path: rel.to_owned(),
                reason: "a component is a symbolic link; bundles hold only regular files",
            });
        }
    }
    // The type is checked before opening: a FIFO would block the open.
    open_regular_file(&cur, Links::Refuse)
}

/// The bytes of bundle file `rel` and their digests, read once. Its size
/// is compared with `expected_size` (the manifest's, already compared with
/// the lock's where the lock pins one) before anything is read or
/// allocated, so a huge or sparse file costs nothing; the hashes are taken
/// as the bytes come in.
pub(crate) fn read_inside(
    root: &Path,
    rel: &str,
    expected_size: u64,
) -> Result<(Vec<u8>, Digests)> {
    let (file, len) = open_inside(root, rel)?;
    if len != expected_size {
        return Err(Error::mismatch(
            format!("artifact {rel} size"),
            expected_size,
            len,
            REMEDY_REBUILD,
        ));
    }
    if len > MAX_ARTIFACT_BYTES {
        return Err(Error::TooLarge {
            path: root.join(rel),
            what: "a bundle artifact",
            limit: MAX_ARTIFACT_BYTES,
            actual: len,
        });
    }
    let io = |source| Error::Io {
        path: root.join(rel),
        action: "read",
        source,
    };
    let mut bytes = Vec::with_capacity(len as usize);
    let mut hasher = DigestWriter::default();
    let mut reader = file.take(len + 1);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes.extend_from_slice(&buf[..n]);
    }
    if bytes.len() as u64 != len {
        return Err(Error::ChangedWhileRead {
            path: root.join(rel),
            expected: len,
            actual: bytes.len() as u64,
        });
    }
    Ok((bytes, hasher.finish()))
}

/// Lists every file under `root` (bundle-relative, `/`-separated).
pub(crate) fn list_files(root: &Path) -> Result<BTreeSet<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
        let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.to_owned(),
            action: "list",
            source,
        })?;
        for entry in rd {
            let entry = entry.map_err(|source| Error::Io {
                path: dir.to_owned(),
                action: "list",
                source,
            })?;
            let path = entry.path();
            let ft = entry.file_type().map_err(|source| Error::Io {
                path: path.clone(),
                action: "stat",
                source,
            })?;
            let rel = path
                .strip_prefix(root)
                .expect("walk stays under root")
                .to_string_lossy()
                .replace('\\', "/");
            if ft.is_symlink() {
                return Err(Error::UnsafePath {
                    path: rel,
                    reason: "a symbolic link in the bundle; bundles hold only regular files",
                });
            } else if ft.is_dir() {
                walk(root, &path, out)?;
            } else {
                out.insert(rel);
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

/// The digests of one of our sources, refused unread over [`MAX_SOURCE_BYTES`].
pub fn hash_source(path: &Path) -> Result<Digests> {
    let bytes = read_regular_file(path, MAX_SOURCE_BYTES, "a source", Links::Follow)?;
    Ok(Digests::of_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::check_relative_path;

    #[test]
    fn only_plain_relative_paths_are_accepted() {
        for ok in [
            "manifest.json",
            "cubin/a.sm_90a.cubin",
            "lib/libcudart_static.a",
        ] {
            assert!(check_relative_path(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("../x", "escapes"),
            ("cubin/../../x", "escapes"),
            ("./x", "`.`"),
            ("cubin//x", "empty path component"),
            ("cubin\\x", "backslash"),
        ] {
            let err = check_relative_path(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
