//! What the gdn-server tests share.

use std::path::{Path, PathBuf};

/// The embedded demo checkpoint's source directory.
pub fn demo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("demo")
}
