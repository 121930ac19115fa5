//! Steps 1 to 6 of `verify_bundle`, in the order it runs them: the bundle's
//! identity and inputs, its files against the manifest, and the pinned
//! device code, DSL outputs and ABI header. Host code (step 7) depends on the
//! caller's policy and is checked by the parent module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::pins::{dsl_runtime_what, entry, expect_same, find, lock_pin, HostPins};
use crate::bundle_files::{check_relative_path, list_files, read_inside};
use crate::digest::Digests;
use crate::error::{Error, Result, REMEDY_BYTES_DIFFER, REMEDY_LOCK_EDITED, REMEDY_REBUILD};
use crate::lock::Lock;
use crate::manifest::{ArtifactKind, DslIdentity, Manifest};
use crate::table::{file_name, ArtifactTable, UnitOutput};
use crate::MANIFEST_FILE;

/// Every listed file's bytes, by bundle path: read once, then checked and
/// handed to the consumer.
pub(super) type FileBytes = BTreeMap<String, Vec<u8>>;
/// The digests of every listed file as read, by bundle path.
pub(super) type FileDigests = BTreeMap<String, Digests>;

/// The bundle's manifest, refused if it is a symbolic link.
pub(super) fn load_manifest(root: &Path) -> Result<Manifest> {
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
    Manifest::load(&manifest_path)
}

/// 1. Identity of the bundle as a whole.
pub(super) fn check_identity(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
) -> Result<()> {
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
    )
}

/// 2. Inputs: kernel sources always, toolchain wheels when they were used.
///    DSL inputs: those of the Python version the manifest says ran the export.
pub(super) fn check_inputs(table: &ArtifactTable, lock: &Lock, manifest: &Manifest) -> Result<()> {
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
    if expected_inputs == manifest.inputs {
        return Ok(());
    }
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
    Err(Error::Unexpected {
        what: format!(
            "manifest input {}",
            extra.map(String::as_str).unwrap_or("?")
        ),
        remedy: REMEDY_REBUILD,
    })
}

/// 3. Every file on disk is in the manifest, and every manifest entry matches
///    its file. This half: what is listed; [`read_artifacts`] reads the files.
pub(super) fn check_listing(root: &Path, table: &ArtifactTable, manifest: &Manifest) -> Result<()> {
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
    Ok(())
}

/// The bytes and the digests of every file the manifest lists (step 3's
/// second half). Sizes come first: the lock's against the manifest's, then
/// the manifest's against the file's, so nothing is read that is not the
/// expected size.
pub(super) fn read_artifacts(
    root: &Path,
    lock: &Lock,
    manifest: &Manifest,
    host: HostPins,
) -> Result<(FileBytes, FileDigests)> {
    let mut files = BTreeMap::new();
    let mut actual = BTreeMap::new();
    for (path, art) in &manifest.artifacts {
        if let Some((what, locked)) = lock_pin(lock, manifest, host, path, art.kind) {
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
    Ok((files, actual))
}

/// 4. Device code: exactly the locked cubins, byte for byte.
pub(super) fn check_device_code(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
    actual: &FileDigests,
) -> Result<()> {
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
        entry(manifest, path, ArtifactKind::DeviceCubin)?;
        locked.expect_eq(
            &format!("device artifact {path} (against the lock)"),
            &actual[path],
            REMEDY_BYTES_DIFFER,
        )?;
    }
    Ok(())
}

/// 5. Host objects embed exactly the locked cubins (uncompressed fatbin), so
///    the device code a consumer links is the pinned one whatever host
///    compiler built the object.
pub(super) fn check_host_objects_embed_cubins(
    table: &ArtifactTable,
    manifest: &Manifest,
    files: &FileBytes,
) -> Result<()> {
    for unit in table
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
    {
        let obj_path = unit.object_path();
        entry(manifest, &obj_path, ArtifactKind::HostObject)?;
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
    Ok(())
}

/// 5b. CuTe DSL outputs: objects and headers are the lock's bytes (the
///     DSL, not the host compiler, made them), and each object embeds its
///     locked cubin verbatim.
pub(super) fn check_dsl_outputs(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
    files: &FileBytes,
    actual: &FileDigests,
) -> Result<()> {
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
        entry(manifest, path, kind)?;
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
    Ok(())
}

/// 5c. The DSL runtime library is the lock's pin for the wheel set the
///     manifest names: one pin per pinned Python, copied from the wheel the
///     pin names. Nothing to check where the table has no DSL runtime or the
///     manifest no `dsl` section.
pub(super) fn check_dsl_runtime(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
    actual: &FileDigests,
) -> Result<()> {
    if let (Some(path), Some(dsl)) = (table.dsl_runtime_path(), &manifest.dsl) {
        check_dsl_runtime_pin(table, lock, manifest, dsl, &path, actual)?;
    }
    Ok(())
}

fn check_dsl_runtime_pin(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
    dsl: &DslIdentity,
    path: &str,
    actual: &FileDigests,
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

/// 6. The ABI header is our pinned source, copied verbatim; the toolkit
///    libraries are listed as such.
pub(super) fn check_header_and_libraries(
    table: &ArtifactTable,
    lock: &Lock,
    manifest: &Manifest,
) -> Result<()> {
    let header_rel = format!("include/{}", file_name(&table.abi_header));
    let header = entry(manifest, &header_rel, ArtifactKind::Header)?;
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
        entry(manifest, &format!("lib/{lib}"), ArtifactKind::HostLibrary)?;
    }
    Ok(())
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
