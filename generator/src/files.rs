//! Every file gdn-gen reads goes through here: it is checked to be a
//! regular file before it is opened (a FIFO would block the build forever, a
//! device never end), with gdn-lock's checked open, and its size is bounded
//! before anything is read. Files gdn-gen wrote itself (its caches, the
//! staging tree, the stamp) must not be symbolic links; inputs a person or
//! Nix provides (a toolkit root, --inputs-dir, our sources) may be.

use std::io::Read;
use std::path::Path;

use gdn_lock::{open_regular_file, read_regular_file, DigestWriter, Digests, Links};

use crate::error::{GenError, Result};

/// The largest file copied into a bundle or out of the unit cache: what a
/// bundle may hold (gdn-lock refuses larger artifacts unread).
pub const MAX_COPY_BYTES: u64 = gdn_lock::MAX_ARTIFACT_BYTES;

/// Small bookkeeping files of ours (the stamp, `.complete` markers).
pub const MAX_MARKER_BYTES: u64 = 4 << 10;

/// The text of the file at `path`, refused unread over `limit` bytes.
pub fn read_text(step: &str, path: &Path, links: Links, limit: u64) -> Result<String> {
    let bytes = read_regular_file(path, limit, "this file", links)
        .map_err(|e| GenError::document(step, e))?;
    String::from_utf8(bytes).map_err(|e| {
        GenError::io(
            step,
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

/// The text of a marker file of ours, or `None` if there is none. Anything
/// but a regular file there is an error, not a missing marker.
pub fn read_marker(step: &str, path: &Path) -> Result<Option<String>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(GenError::io(step, path, e)),
        Ok(_) => read_text(step, path, Links::Refuse, MAX_MARKER_BYTES).map(Some),
    }
}

/// Copies `from` to `to` (created or truncated), a bounded buffer at a
/// time, and returns the digests of the bytes copied. `from` is refused
/// unread over [`MAX_COPY_BYTES`].
pub fn copy(step: &str, from: &Path, to: &Path, links: Links) -> Result<Digests> {
    let (file, len) = open_regular_file(from, links).map_err(|e| GenError::document(step, e))?;
    if len > MAX_COPY_BYTES {
        return Err(GenError::document(
            step,
            gdn_lock::Error::TooLarge {
                path: from.to_owned(),
                what: "a bundle artifact",
                limit: MAX_COPY_BYTES,
                actual: len,
            },
        ));
    }
    let mut out = std::fs::File::create(to).map_err(|e| GenError::io(step, to, e))?;
    let mut reader = file.take(MAX_COPY_BYTES + 1);
    let mut hasher = DigestWriter::default();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| GenError::io(step, from, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(|e| GenError::io(step, to, e))?;
    }
    let digests = hasher.finish();
    if digests.size > MAX_COPY_BYTES {
        return Err(GenError::document(
            step,
            gdn_lock::Error::TooLarge {
                path: from.to_owned(),
                what: "a bundle artifact",
                limit: MAX_COPY_BYTES,
                actual: digests.size,
            },
        ));
    }
    Ok(digests)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let ok = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    #[test]
    fn a_fifo_or_a_link_of_ours_is_named_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("stamp");
        mkfifo(&fifo);
        let e = read_marker("read the stamp", &fifo)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("read the stamp") && e.contains("stamp is a FIFO, not a regular file"),
            "{e}"
        );
        let target = dir.path().join("real");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = copy("copy", &link, &dir.path().join("to"), Links::Refuse)
            .unwrap_err()
            .to_string();
        assert!(e.contains("link is a symbolic link"), "{e}");
        // Where links are followed, the file they name is copied.
        let d = copy("copy", &link, &dir.path().join("to"), Links::Follow).unwrap();
        assert_eq!(d, Digests::of_bytes(b"x"));
        assert_eq!(read_marker("m", &dir.path().join("none")).unwrap(), None);
    }
}
