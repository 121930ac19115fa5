//! Reading files that must be regular files: a FIFO, socket or device in
//! their place would block the reader forever or never end, so the type is
//! checked before the file is opened, and the open itself cannot block.
//! gdn-gen reads its own caches through these too.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Whether a symbolic link may stand where a regular file is expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Read the file a link points to (which must be regular): inputs a
    /// person or Nix provides, such as a toolkit merged from links.
    Follow,
    /// A link is refused: files gdn-gen wrote itself (its caches) and the
    /// bundle are never links, so one there was put by someone else.
    Refuse,
}

pub use crate::error::FileKind;

/// `None` for a regular file, else what it is.
fn irregular_kind(meta: &Metadata) -> Option<FileKind> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some(FileKind::Directory);
    }
    if t.is_symlink() {
        return Some(FileKind::SymbolicLink);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some(FileKind::Fifo);
        }
        if t.is_socket() {
            return Some(FileKind::Socket);
        }
        if t.is_block_device() || t.is_char_device() {
            return Some(FileKind::Device);
        }
    }
    Some(FileKind::Other)
}

/// Opens `path` for reading if (and only if) it is a regular file (with
/// [`Links::Follow`], the file a link there points to must be). Returns the
/// file and its size, from the opened file, so a swap after the check is
/// seen: the opened file must be the one that was checked.
pub fn open_regular_file(path: &Path, links: Links) -> Result<(File, u64)> {
    let io = |action, source| Error::Io {
        path: path.to_owned(),
        action,
        source,
    };
    let not_regular = |found| Error::NotRegularFile {
        path: path.to_owned(),
        found,
    };
    let named = match links {
        Links::Follow => std::fs::metadata(path),
        Links::Refuse => std::fs::symlink_metadata(path),
    }
    .map_err(|e| io("stat", e))?;
    if let Some(kind) = irregular_kind(&named) {
        return Err(not_regular(Some(kind)));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: if a FIFO is swapped in after the check, opening it
        // returns at once instead of waiting for a writer. Reads of regular
        // files ignore the flag. O_NOFOLLOW where links are refused: a link
        // swapped in after the check fails the open.
        let nofollow = if links == Links::Refuse {
            O_NOFOLLOW
        } else {
            0
        };
        options.custom_flags(O_NONBLOCK | nofollow);
    }
    let file = options.open(path).map_err(|e| io("open", e))?;
    let opened = file.metadata().map_err(|e| io("stat", e))?;
    if irregular_kind(&opened).is_some() || !same_file(&named, &opened) {
        return Err(not_regular(None));
    }
    Ok((file, opened.len()))
}

/// The whole file, if it is a regular file of at most `limit` bytes
/// (`what` names the limit in the error: `this document`, `a source`).
pub fn read_regular_file(
    path: &Path,
    limit: u64,
    what: &'static str,
    links: Links,
) -> Result<Vec<u8>> {
    let (file, len) = open_regular_file(path, links)?;
    let too_large = |actual| Error::TooLarge {
        path: path.to_owned(),
        what,
        limit,
        actual,
    };
    if len > limit {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| Error::Io {
            path: path.to_owned(),
            action: "read",
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// `O_NONBLOCK` and `O_NOFOLLOW` of Linux on x86_64 and aarch64 (elsewhere
/// the type check before the open is the guard).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const O_NOFOLLOW: i32 = 0o400000;
#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
const O_NOFOLLOW: i32 = 0o100000;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
const O_NONBLOCK: i32 = 0o4000;

#[cfg(unix)]
pub(crate) fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
pub(crate) fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.len() == b.len()
}
