//! Verification of a bundle directory against the table and the lock. Used by
//! the kernels crate's build.rs (fail closed) and by `gdn-gen check`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::bundle_files::{check_relative_path, hash_source, list_files, read_inside};
use crate::digest::{Digests, Sha256Hex};
use crate::error::{Error, Result, REMEDY_BYTES_DIFFER, REMEDY_LOCK_EDITED, REMEDY_REBUILD};
use crate::lock::Lock;
use crate::manifest::{ArtifactKind, Manifest, ManifestArtifact};
use crate::table::{file_name, ArtifactTable, UnitOutput};
use crate::MANIFEST_FILE;

/// A bundle whose every file was read once, hashed and matched. `files`
/// holds those very bytes: consumers write or link these, never re-read the
/// directory (which could have changed since).
#[derive(Debug)]
pub struct VerifiedBundle {
    pub root: PathBuf,
    pub manifest: Manifest,
    pub files: BTreeMap<String, Vec<u8>>,
    /// Whether the host code was built by the same host compiler and toolkit
    /// as the lock's and therefore checked byte for byte against it.
    pub host_matches_lock: bool,
}

/// How strict to be about host code (device code is always pinned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostPolicy {
    /// Host objects and libraries must be the lock's bytes (same host
    /// compiler and toolkit as the machine that recorded the lock).
    #[default]
    Locked,
    /// Host objects built by another host compiler are accepted if they embed
    /// the locked cubins; a toolkit library must still match the lock when the
    /// toolkit kind is the lock's. For builders that compiled the bundle
    /// themselves from the pinned sources (gdn-gen, Nix).
    AllowForeignHostCompiler,
}

fn expect_same<T: PartialEq + std::fmt::Debug>(what: &str, expected: &T, actual: &T) -> Result<()> {
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

/// Checks the lock was written for this table and agrees with it.
pub fn check_lock_matches_table(
    table: &ArtifactTable,
    table_sha256: &Sha256Hex,
    lock: &Lock,
) -> Result<()> {
    if &lock.table_sha256 != table_sha256 {
        return Err(Error::mismatch(
            "generator/artifacts.json (table_sha256 recorded in the lock)",
            &lock.table_sha256,
            table_sha256,
            "the artifact table changed since the lock was written; \
             run `cargo run --release -p gdn-gen -- lock` and review the diff",
        ));
    }
    // The table's hash matched, so a disagreement means the lock was edited.
    if table.abi_version != lock.abi_version {
        return Err(Error::mismatch(
            "lock abi_version",
            table.abi_version,
            lock.abi_version,
            REMEDY_LOCK_EDITED,
        ));
    }
    if table.nvcc_version != lock.nvcc_version {
        return Err(Error::mismatch(
            "lock nvcc_version",
            &table.nvcc_version,
            &lock.nvcc_version,
            REMEDY_LOCK_EDITED,
        ));
    }
    Ok(())
}

/// What to do when one of our sources differs from the lock's hash.
const REMEDY_SOURCE: &str = "bundles are built from the locked sources only: restore the file \
     (`git checkout -- <file>`), or, if the edit is intended, record it with \
     `cargo run --release -p gdn-gen -- lock` (which also rebuilds the bundle) and review the diff";

/// Checks that our sources and patches in the repository at `repo` (the
/// table's `sources` and `patches`) are the files the lock pins: an edit
/// after the bundle was built means the bundle no longer comes from the
/// working tree.
pub fn check_sources_match_lock(repo: &Path, table: &ArtifactTable, lock: &Lock) -> Result<()> {
    let listed: BTreeSet<&String> = table.sources.iter().chain(&table.patches).collect();
    if let Some(extra) = lock.sources.keys().find(|p| !listed.contains(p)) {
        return Err(Error::Unexpected {
            what: format!("lock entry for source {extra} (the table lists no such source)"),
            remedy: REMEDY_LOCK_EDITED,
        });
    }
    for path in listed {
        let pinned = lock.sources.get(path).ok_or_else(|| Error::Missing {
            what: format!("lock entry for source {path}"),
            remedy: REMEDY_LOCK_EDITED,
        })?;
        let actual = hash_source(&repo.join(path))
            .map_err(|e| Error::Missing {
                what: format!("source {path} ({e})"),
                remedy: REMEDY_SOURCE,
            })?
            .sha256;
        if &actual != pinned {
            return Err(Error::mismatch(
                format!("source {path} (sha256 pinned by the lock)"),
                pinned,
                actual,
                REMEDY_SOURCE,
            ));
        }
    }
    Ok(())
}

/// Verifies every file of the bundle at `root` against the table and lock.
pub fn verify_bundle(
    root: &Path,
    table: &ArtifactTable,
    lock: &Lock,
    policy: HostPolicy,
) -> Result<VerifiedBundle> {
    let manifest_path = root.join(MANIFEST_FILE);
    if std::fs::symlink_metadata(&manifest_path)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
    {
        return Err(Error::UnsafePath {
            path: MANIFEST_FILE.into(),
            reason: "the manifest is a symbolic link",
        });
    }
    let manifest = Manifest::load(&manifest_path)?;

    // 1. Identity of the bundle as a whole.
    expect_same(
        "manifest abi_version",
        &table.abi_version,
        &manifest.abi_version,
    )?;
    expect_same("manifest geometry", &table.geometry, &manifest.geometry)?;
    expect_same(
        "manifest toolchain.nvcc_version",
        &lock.nvcc_version,
        &manifest.toolchain.nvcc_version,
    )?;

    // 2. Inputs: kernel sources always, toolchain wheels when they were used.
    //    DSL inputs: those of the Python version the manifest says ran the export.
    let dsl_python = match (table.has_dsl_units(), &manifest.dsl) {
        (true, None) => {
            return Err(Error::Missing {
                what: "the manifest's `dsl` section (the Python that ran the DSL export)".into(),
                remedy: REMEDY_REBUILD,
            })
        }
        (true, Some(d)) => Some(d.python_abi.as_str()),
        (false, _) => None,
    };
    let mut expected_inputs = BTreeMap::new();
    for input in lock.used_inputs(manifest.toolchain.toolkit, dsl_python) {
        expected_inputs.insert(input.filename.clone(), input.sha256.clone());
    }
    for (path, sha) in &lock.sources {
        expected_inputs.insert(path.clone(), sha.clone());
    }
    if expected_inputs != manifest.inputs {
        for (name, sha) in &expected_inputs {
            match manifest.inputs.get(name) {
                None => {
                    return Err(Error::Missing {
                        what: format!("input {name} in the manifest"),
                        remedy: REMEDY_REBUILD,
                    })
                }
                Some(actual) if actual != sha => {
                    return Err(Error::mismatch(
                        format!("input {name} sha256"),
                        sha,
                        actual,
                        REMEDY_REBUILD,
                    ))
                }
                Some(_) => {}
            }
        }
        let extra = manifest
            .inputs
            .keys()
            .find(|k| !expected_inputs.contains_key(*k));
        return Err(Error::Unexpected {
            what: format!(
                "manifest input {}",
                extra.map(String::as_str).unwrap_or("?")
            ),
            remedy: REMEDY_REBUILD,
        });
    }

    // 3. Every file on disk is in the manifest, and every manifest entry matches its file.
    let on_disk = list_files(root)?;
    for file in &on_disk {
        if file != MANIFEST_FILE && !manifest.artifacts.contains_key(file) {
            return Err(Error::Unexpected {
                what: format!("file {file} (not listed in the manifest)"),
                remedy: REMEDY_REBUILD,
            });
        }
    }
    // Unsafe names are reported as such before anything else.
    for path in manifest.artifacts.keys() {
        check_relative_path(path)?;
    }
    // The manifest lists exactly what the table produces: nothing else can
    // ride along into a consumer's link line.
    let expected: BTreeSet<String> = expected_artifacts(table);
    let listed: BTreeSet<String> = manifest.artifacts.keys().cloned().collect();
    if let Some(extra) = listed.difference(&expected).next() {
        return Err(Error::Unexpected {
            what: format!("artifact {extra} (not produced by the artifact table)"),
            remedy: REMEDY_REBUILD,
        });
    }
    if let Some(missing) = expected.difference(&listed).next() {
        return Err(Error::Missing {
            what: format!("artifact {missing} in the manifest"),
            remedy: REMEDY_REBUILD,
        });
    }
    // Sizes come first: the lock's against the manifest's, then the
    // manifest's against the file's, so nothing is read that is not the
    // expected size.
    let host = HostPins::of(lock, &manifest);
    let mut files = BTreeMap::new();
    let mut actual = BTreeMap::new();
    for (path, art) in &manifest.artifacts {
        if let Some((what, locked)) = lock_pin(lock, &manifest, host, path, art.kind) {
            if locked.size != art.digests.size {
                return Err(Error::mismatch(
                    format!("{what} size"),
                    locked.size,
                    format!("{} (the manifest's)", art.digests.size),
                    REMEDY_BYTES_DIFFER,
                ));
            }
        }
        let (bytes, digests) = read_inside(root, path, art.digests.size)?;
        art.digests
            .expect_eq(&format!("artifact {path}"), &digests, REMEDY_REBUILD)?;
        actual.insert(path.clone(), digests);
        files.insert(path.clone(), bytes);
    }

    // 4. Device code: exactly the locked cubins, byte for byte.
    let table_device: BTreeSet<String> = table.device_artifact_paths().into_iter().collect();
    let lock_device: BTreeSet<String> = lock.device_artifacts.keys().cloned().collect();
    if table_device != lock_device {
        return Err(Error::mismatch(
            "device artifacts of the lock",
            format!("{table_device:?} (from the table)"),
            format!("{lock_device:?}"),
            REMEDY_LOCK_EDITED,
        ));
    }
    for (path, art) in &manifest.artifacts {
        if art.kind == ArtifactKind::DeviceCubin && !lock.device_artifacts.contains_key(path) {
            return Err(Error::Unexpected {
                what: format!("device artifact {path}"),
                remedy: REMEDY_REBUILD,
            });
        }
    }
    for (path, locked) in &lock.device_artifacts {
        entry(&manifest, path, ArtifactKind::DeviceCubin)?;
        locked.expect_eq(
            &format!("device artifact {path} (against the lock)"),
            &actual[path],
            REMEDY_BYTES_DIFFER,
        )?;
    }

    // 5. Host objects embed exactly the locked cubins (uncompressed fatbin), so
    //    the device code a consumer links is the pinned one whatever host
    //    compiler built the object.
    for unit in table
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
    {
        let obj_path = unit.object_path();
        entry(&manifest, &obj_path, ArtifactKind::HostObject)?;
        let obj = &files[&obj_path];
        for target in &unit.targets {
            let cubin = &files[&unit.cubin_path(target)];
            if find(obj, cubin).is_none() {
                return Err(Error::mismatch(
                    format!("host object {obj_path}"),
                    format!("to embed {} verbatim", unit.cubin_path(target)),
                    "no such byte sequence (other device code, or a compressed fatbin)",
                    REMEDY_REBUILD,
                ));
            }
        }
    }

    // 5b. CuTe DSL outputs: objects and headers are the lock's bytes (the
    //     DSL, not the host compiler, made them), and each object embeds its
    //     locked cubin verbatim.
    let table_dsl: BTreeSet<String> = table.dsl_artifact_paths().into_iter().collect();
    let lock_dsl: BTreeSet<String> = lock.dsl_artifacts.keys().cloned().collect();
    if table_dsl != lock_dsl {
        return Err(Error::mismatch(
            "DSL artifacts of the lock",
            format!("{table_dsl:?} (from the table)"),
            format!("{lock_dsl:?}"),
            REMEDY_LOCK_EDITED,
        ));
    }
    for (path, locked) in &lock.dsl_artifacts {
        let kind = if path.starts_with("obj/") {
            ArtifactKind::DslObject
        } else {
            ArtifactKind::DslHeader
        };
        entry(&manifest, path, kind)?;
        locked.expect_eq(
            &format!("DSL artifact {path} (against the lock)"),
            &actual[path],
            REMEDY_BYTES_DIFFER,
        )?;
    }
    for unit in table.units.iter().filter(|u| u.dsl.is_some()) {
        for (obj_path, cubin_path) in unit.dsl_objects() {
            if find(&files[&obj_path], &files[&cubin_path]).is_none() {
                return Err(Error::mismatch(
                    format!("DSL object {obj_path}"),
                    format!("to embed {cubin_path} verbatim"),
                    "no such byte sequence",
                    REMEDY_REBUILD,
                ));
            }
        }
    }

    // 5c. The DSL runtime library is the lock's pin for the wheel set the
    //     manifest names: one pin per pinned Python, copied from the wheel the
    //     pin names.
    if let (Some(path), Some(dsl)) = (table.dsl_runtime_path(), &manifest.dsl) {
        check_dsl_runtime(table, lock, &manifest, dsl, &path, &actual)?;
    }

    // 6. The ABI header is our pinned source, copied verbatim.
    let header_rel = format!("include/{}", file_name(&table.abi_header));
    let header = entry(&manifest, &header_rel, ArtifactKind::Header)?;
    let pinned = lock
        .sources
        .get(&table.abi_header)
        .ok_or_else(|| Error::Missing {
            what: format!("lock entry for source {}", table.abi_header),
            remedy: REMEDY_LOCK_EDITED,
        })?;
    expect_same(
        &format!("sha256 of {header_rel}"),
        pinned,
        &header.digests.sha256,
    )?;

    for lib in &table.toolkit_libraries {
        entry(&manifest, &format!("lib/{lib}"), ArtifactKind::HostLibrary)?;
    }

    // 7. Host code. Byte-identical to the lock when built by the lock's host
    //    compiler and toolkit. Otherwise only under AllowForeignHostCompiler,
    //    and even then a toolkit library from the lock's toolkit (the pinned
    //    wheels) must be the lock's bytes.
    //
    //    Under the opt-in, a library from an external toolkit
    //    (`--toolkit-root`) is accepted as the manifest lists it: no lock
    //    pins that toolkit's bytes. Refusing that combination would refuse
    //    every Nix build (nixpkgs' toolkit and compiler), and would not make
    //    the opt-in safe: it already links host objects whose code nothing
    //    pins into the same binary. The opt-in trusts the host code of
    //    whoever built the bundle; device code stays pinned. A toolkit kind
    //    gdn-gen never writes is refused when the manifest is read
    //    (ToolkitKind), so only those two kinds reach this point.
    for (path, locked) in &lock.host_artifacts.artifacts {
        let kind = manifest.artifacts.get(path).map(|a| a.kind);
        if host.matches_lock || kind.is_some_and(|k| host.pinned(k)) {
            let got = actual.get(path).ok_or_else(|| Error::Missing {
                what: format!("host artifact {path}"),
                remedy: REMEDY_REBUILD,
            })?;
            locked.expect_eq(
                &format!("host artifact {path} (against the lock)"),
                got,
                REMEDY_BYTES_DIFFER,
            )?;
        }
    }
    if !host.matches_lock && policy == HostPolicy::Locked {
        return Err(Error::mismatch(
            "host compiler / toolkit of the bundle's host objects",
            format!("{:?} / {} (the lock's)", lock.host_artifacts.host_compiler, lock.host_artifacts.toolkit),
            format!("{:?} / {}", manifest.toolchain.host_compiler, manifest.toolchain.toolkit),
            "host objects are only reproducible per host compiler; use a bundle built by the lock's compiler, \
             or accept this one explicitly (GDN_ALLOW_FOREIGN_HOST_OBJECTS=1 for build.rs, \
             --allow-foreign-host-compiler for gdn-gen check): its device code is still the locked cubins",
        ));
    }

    Ok(VerifiedBundle {
        root: root.to_path_buf(),
        manifest,
        files,
        host_matches_lock: host.matches_lock,
    })
}

fn check_dsl_runtime(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
    dsl: &crate::manifest::DslIdentity,
    path: &str,
    actual: &BTreeMap<String, Digests>,
) -> Result<()> {
    let pythons: BTreeSet<&String> = table.dsl.iter().flat_map(|d| &d.pythons).collect();
    let pinned: BTreeSet<&String> = lock.dsl_runtime.keys().collect();
    if pythons != pinned {
        return Err(Error::mismatch(
            "wheel sets with a DSL runtime pin in the lock",
            format!("{pythons:?} (dsl.pythons of the table)"),
            format!("{pinned:?}"),
            REMEDY_LOCK_EDITED,
        ));
    }
    let pin = lock.dsl_runtime_for(&dsl.python_abi)?;
    expect_same(
        &format!("wheel {path} was copied from (manifest dsl.runtime_wheel)"),
        &pin.wheel,
        &dsl.runtime_wheel,
    )?;
    entry(manifest, path, ArtifactKind::DslLibrary)?;
    pin.digests.expect_eq(
        &dsl_runtime_what(path, &dsl.python_abi),
        &actual[path],
        REMEDY_BYTES_DIFFER,
    )
}

/// Which host code of a bundle the lock pins.
#[derive(Clone, Copy)]
struct HostPins {
    /// Same host compiler and toolkit as the lock's: every host artifact.
    matches_lock: bool,
    /// Same toolkit as the lock's: its libraries, whatever the compiler.
    same_toolkit: bool,
}

impl HostPins {
    fn of(lock: &Lock, manifest: &Manifest) -> HostPins {
        let same_toolkit = manifest.toolchain.toolkit == lock.host_artifacts.toolkit;
        HostPins {
            matches_lock: same_toolkit
                && manifest.toolchain.host_compiler == lock.host_artifacts.host_compiler,
            same_toolkit,
        }
    }

    /// Whether the lock's bytes bind a host artifact of `kind`.
    fn pinned(self, kind: ArtifactKind) -> bool {
        self.matches_lock || (self.same_toolkit && kind == ArtifactKind::HostLibrary)
    }
}

/// The lock's digests of bundle file `path` where the lock pins them for
/// this bundle, with the name the comparison gives it.
fn lock_pin<'l>(
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

fn dsl_runtime_what(path: &str, python_abi: &str) -> String {
    format!("DSL runtime {path} (against the lock's pin for the Python {python_abi} wheel set)")
}

/// Every bundle-relative path the table produces (the manifest aside).
fn expected_artifacts(table: &ArtifactTable) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = table.device_artifact_paths().into_iter().collect();
    for unit in table
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
    {
        out.insert(unit.object_path());
    }
    out.insert(format!("include/{}", file_name(&table.abi_header)));
    for lib in &table.toolkit_libraries {
        out.insert(format!("lib/{lib}"));
    }
    out.extend(table.dsl_artifact_paths());
    out.extend(table.dsl_runtime_path());
    out
}

/// The manifest entry for `rel`, which must exist and be of `kind`.
fn entry<'m>(
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

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}
