//! Reading files that must be regular files: a FIFO, socket or device in
//! their place would block the reader forever or never end, so the type is
//! checked before the file is opened, and the open itself cannot block.

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::error::{Error, Result};

/// Opens `path` for reading if (and only if) it is a regular file, not
/// following a symbolic link in its last component's type check. Returns the
/// file and its size (from the opened file, so a swap after the check is
/// seen: the opened file must be the one that was checked).
pub(crate) fn open_regular_file(path: &Path) -> Result<(File, u64)> {
    let io = |action, source| Error::Io {
        path: path.to_owned(),
        action,
        source,
    };
    let not_regular = || Error::NotRegularFile {
        path: path.to_owned(),
    };
    let named = std::fs::metadata(path).map_err(|e| io("stat", e))?;
    if !named.is_file() {
        return Err(not_regular());
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
        // files ignore the flag.
        options.custom_flags(O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| io("open", e))?;
    let opened = file.metadata().map_err(|e| io("stat", e))?;
    if !opened.is_file() || !same_file(&named, &opened) {
        return Err(not_regular());
    }
    Ok((file, opened.len()))
}

/// The whole file, if it is a regular file of at most `limit` bytes.
pub(crate) fn read_regular_file(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let (file, len) = open_regular_file(path)?;
    if len > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            limit,
            actual: len,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut bytes).map_err(
        |source| Error::Io {
            path: path.to_owned(),
            action: "read",
            source,
        },
    )?;
    if bytes.len() as u64 > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            limit,
            actual: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

/// `O_NONBLOCK` of Linux on x86_64 and aarch64 (elsewhere the type check
/// before the open is the guard).
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
const O_NONBLOCK: i32 = 0o4000;

#[cfg(unix)]
pub(crate) fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
pub(crate) fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.len() == b.len()
}
