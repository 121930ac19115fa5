//! What the lock and the manifest pin for one bundle file, and the
//! comparisons every step of `verify_bundle` makes with them.

use crate::digest::Digests;
use crate::error::{Error, Result, REMEDY_REBUILD};
use crate::lock::Lock;
use crate::manifest::{ArtifactKind, Manifest, ManifestArtifact};

pub(super) fn expect_same<T: PartialEq + std::fmt::Debug>(
    what: &str,
    expected: &T,
    actual: &T,
) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::mismatch(
            what,
            format!("{expected:?}"),
            format!("{actual:?}"),
            REMEDY_REBUILD,
        ))
    }
}

/// Which host code of a bundle the lock pins.
#[derive(Clone, Copy)]
pub(super) struct HostPins {
    /// Same host compiler and toolkit as the lock's: every host artifact.
    pub(super) matches_lock: bool,
    /// Same toolkit as the lock's: its libraries, whatever the compiler.
    same_toolkit: bool,
}

impl HostPins {
    pub(super) fn of(lock: &Lock, manifest: &Manifest) -> HostPins {
        let same_toolkit = manifest.toolchain.toolkit == lock.host_artifacts.toolkit;
        HostPins {
            matches_lock: same_toolkit
                && manifest.toolchain.host_compiler == lock.host_artifacts.host_compiler,
            same_toolkit,
        }
    }

    /// Whether the lock's bytes bind a host artifact of `kind`.
    pub(super) fn pinned(self, kind: ArtifactKind) -> bool {
        self.matches_lock || (self.same_toolkit && kind == ArtifactKind::HostLibrary)
    }
}

/// The lock's digests of bundle file `path` where the lock pins them for
/// this bundle, with the name the comparison gives it.
pub(super) fn lock_pin<'l>(
    lock: &'l Lock,
    manifest: &Manifest,
    host: HostPins,
    path: &str,
    kind: ArtifactKind,
) -> Option<(String, &'l Digests)> {
    if let Some(d) = lock.device_artifacts.get(path) {
        return Some((format!("device artifact {path} (against the lock)"), d));
    }
    if let Some(d) = lock.dsl_artifacts.get(path) {
        return Some((format!("DSL artifact {path} (against the lock)"), d));
    }
    if kind == ArtifactKind::DslLibrary {
        let abi = &manifest.dsl.as_ref()?.python_abi;
        let pin = lock.dsl_runtime_for(abi).ok()?;
        return Some((dsl_runtime_what(path, abi), &pin.digests));
    }
    let d = lock.host_artifacts.artifacts.get(path)?;
    host.pinned(kind)
        .then(|| (format!("host artifact {path} (against the lock)"), d))
}

pub(super) fn dsl_runtime_what(path: &str, python_abi: &str) -> String {
    format!("DSL runtime {path} (against the lock's pin for the Python {python_abi} wheel set)")
}

/// The manifest entry for `rel`, which must exist and be of `kind`.
pub(super) fn entry<'m>(
    manifest: &'m Manifest,
    rel: &str,
    kind: ArtifactKind,
) -> Result<&'m ManifestArtifact> {
    let art = manifest.artifacts.get(rel).ok_or_else(|| Error::Missing {
        what: format!("{kind:?} artifact {rel} in the manifest"),
        remedy: REMEDY_REBUILD,
    })?;
    expect_same(&format!("kind of {rel}"), &kind, &art.kind)?;
    Ok(art)
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}
