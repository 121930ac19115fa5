//! Pinning the inputs, the first half of `gdn-gen lock`'s plan: the table's
//! inputs fetched from their URLs and hashed, our sources hashed, the DSL
//! runtime pinned per wheel set, and a lock with no outputs yet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gdn_lock::{
    ArtifactTable, Digests, DslRuntimePin, HostArtifacts, InputRole, Lock, LockedInput, Sha256Hex,
    VariantStatus, SCHEMA_VERSION, TABLE_FILE,
};

use crate::archive::zip_member_digests;
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::repo::repo_root;
use crate::toolkit;

/// The first half of the lock's plan: the table's inputs fetched from their
/// URLs and hashed, our sources hashed, and a lock with no outputs yet.
pub fn pin_inputs(args: &BuildArgs) -> Result<(PathBuf, ArtifactTable, Lock)> {
    let repo = repo_root(&args.lock).or_else(|_| {
        // First lock: the file does not exist yet; its directory is the repo.
        let parent = args
            .lock
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::canonicalize(parent).map_err(|e| GenError::io("find the repository", parent, e))
    })?;
    let table_path = repo.join(TABLE_FILE);
    let (table, table_sha) = ArtifactTable::load_with_sha256(&table_path)
        .map_err(|e| GenError::document("read the artifact table", e))?;
    let old = Lock::load(&args.lock).ok();
    if args.variant != "cuda-13.0" {
        return Err(GenError::refused(
            "choose the variant",
            format!(
                "recording variant {} needs per-variant device artifacts in the lock (schema 2); \
                 schema 1 records the default variant only",
                args.variant
            ),
        ));
    }
    let mut inputs = vec![];
    for spec in &table.inputs {
        let path = fetch_for_lock(args, &spec.filename, &spec.url)?;
        let d = Digests::of_file(&path).map_err(|e| GenError::document("hash an input", e))?;
        inputs.push(LockedInput {
            name: spec.name.clone(),
            version: spec.version.clone(),
            role: spec.role,
            filename: spec.filename.clone(),
            url: spec.url.clone(),
            sha256: d.sha256,
            size: d.size,
            git_revision: spec.git_revision.clone(),
            python: spec.python.clone(),
        });
    }
    let dsl_runtime = dsl_runtime_pins(&args.cache.join("downloads"), &table, &inputs)?;
    let mut variants = old
        .as_ref()
        .map(|l| l.variants.clone())
        .unwrap_or_else(default_variants);
    // The variant being recorded is the table's nvcc (which may have moved).
    let recorded = variants
        .entry(args.variant.clone())
        .or_insert_with(|| default_variants()["cuda-13.0"].clone());
    recorded.status = "recorded".into();
    recorded.nvcc_version = table.nvcc_version.clone();
    let lock = Lock {
        schema_version: SCHEMA_VERSION,
        table_sha256: table_sha,
        abi_version: table.abi_version,
        nvcc_version: table.nvcc_version.clone(),
        inputs,
        sources: hash_sources(&repo, &table)?,
        device_artifacts: BTreeMap::new(),
        // Recorded after the build; the kind is already known.
        host_artifacts: HostArtifacts {
            host_compiler: String::new(),
            toolkit: toolkit::kind(args),
            artifacts: BTreeMap::new(),
        },
        variants,
        dsl_artifacts: BTreeMap::new(),
        dsl_recorded_with_python: None,
        dsl_runtime,
    };
    Ok((repo, table, lock))
}

/// Our sources and patches, by repository path.
fn hash_sources(repo: &Path, table: &ArtifactTable) -> Result<BTreeMap<String, Sha256Hex>> {
    table
        .sources
        .iter()
        .chain(&table.patches)
        .map(|p| {
            let d = gdn_lock::hash_source(&repo.join(p))
                .map_err(|e| GenError::document("hash our sources", e))?;
            Ok((p.clone(), d.sha256))
        })
        .collect()
}

/// One pin of the DSL runtime library per pinned Python: its bytes as the
/// wheel set for that version carries them, read straight from the wheels
/// (no interpreter needed), so one `lock` run pins every set.
fn dsl_runtime_pins(
    downloads: &Path,
    table: &ArtifactTable,
    inputs: &[LockedInput],
) -> Result<BTreeMap<String, DslRuntimePin>> {
    let mut pins = BTreeMap::new();
    let Some(cfg) = table.dsl.as_ref().filter(|_| table.has_dsl_units()) else {
        return Ok(pins);
    };
    for abi in &cfg.pythons {
        let mut found = vec![];
        for input in inputs
            .iter()
            .filter(|i| i.role == InputRole::DslRuntime && i.used_with_python(abi))
        {
            let wheel = downloads.join(&input.filename);
            if let Some(digests) = zip_member_digests(&wheel, &cfg.runtime_library)? {
                found.push(DslRuntimePin {
                    wheel: input.filename.clone(),
                    digests,
                });
            }
        }
        let [pin] = <[DslRuntimePin; 1]>::try_from(found).map_err(|found| {
            let wheels: Vec<&String> = found.iter().map(|p| &p.wheel).collect();
            GenError::refused(
                "pin the DSL runtime library",
                format!(
                    "{} must be in exactly one dsl-runtime wheel for Python {abi}; found in {wheels:?}",
                    cfg.runtime_library
                ),
            )
        })?;
        eprintln!(
            "gdn-gen: lock: DSL runtime for Python {abi}: {} from {}",
            pin.digests.sha256, pin.wheel
        );
        pins.insert(abi.clone(), pin);
    }
    Ok(pins)
}

fn default_variants() -> BTreeMap<String, VariantStatus> {
    BTreeMap::from([
        (
            "cuda-13.0".to_string(),
            VariantStatus {
                status: "recorded".into(),
                nvcc_version: "V13.0.88".into(),
                note: "device_artifacts are this variant's bytes".into(),
            },
        ),
        (
            "cuda-12.8".to_string(),
            VariantStatus {
                status: "unrecorded".into(),
                nvcc_version: "V12.8.x".into(),
                note: "no CUDA 12.8 nvcc was reachable when the lock was written; see docs/nix.md"
                    .into(),
            },
        ),
    ])
}

/// For `lock`: the hash is not known yet, so the file is fetched from its URL
/// (never taken from a local copy, which could be stale or foreign) and then
/// hashed. It replaces the cache's copy, where the build that follows finds it.
fn fetch_for_lock(args: &BuildArgs, filename: &str, url: &str) -> Result<PathBuf> {
    if args.offline {
        return Err(GenError::refused(
            "pin the inputs",
            format!("`gdn-gen lock` pins what {url} serves and needs the network; drop --offline"),
        ));
    }
    let dest = args.cache.join("downloads").join(filename);
    crate::fetch::download(url, &dest)?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn wheel(dir: &Path, name: &str, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(std::fs::File::create(dir.join(name)).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (member, bytes) in members {
            zip.start_file(*member, opts).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }

    fn input(filename: &str, python: Option<&str>) -> LockedInput {
        LockedInput {
            name: filename.into(),
            version: "1".into(),
            role: InputRole::DslRuntime,
            filename: filename.into(),
            url: String::new(),
            sha256: Sha256Hex::of_bytes(b""),
            size: 0,
            git_revision: None,
            python: python.map(Into::into),
        }
    }

    /// The repository's table: its DSL units and the runtime library's path.
    fn table() -> ArtifactTable {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        ArtifactTable::load(&repo.join(TABLE_FILE)).unwrap()
    }

    #[test]
    fn one_runtime_pin_per_wheel_set_from_the_wheel_that_holds_it() {
        let t = table();
        let lib = &t.dsl.as_ref().unwrap().runtime_library;
        assert_eq!(t.dsl.as_ref().unwrap().pythons, ["3.11", "3.12"]);
        let dir = tempfile::tempdir().unwrap();
        wheel(dir.path(), "any.whl", &[("pkg/x.py", b"x")]);
        wheel(
            dir.path(),
            "cu13-311.whl",
            &[(lib.as_str(), b"runtime 311")],
        );
        wheel(
            dir.path(),
            "cu13-312.whl",
            &[(lib.as_str(), b"runtime 312")],
        );
        let inputs = [
            input("any.whl", None),
            input("cu13-311.whl", Some("3.11")),
            input("cu13-312.whl", Some("3.12")),
        ];
        let pins = dsl_runtime_pins(dir.path(), &t, &inputs).unwrap();
        assert_eq!(pins.len(), 2);
        assert_eq!(pins["3.11"].wheel, "cu13-311.whl");
        assert_eq!(pins["3.11"].digests, Digests::of_bytes(b"runtime 311"));
        assert_eq!(pins["3.12"].wheel, "cu13-312.whl");
        assert_eq!(pins["3.12"].digests, Digests::of_bytes(b"runtime 312"));
    }

    #[test]
    fn a_wheel_set_without_the_runtime_or_with_two_copies_is_refused() {
        let t = table();
        let lib = t.dsl.as_ref().unwrap().runtime_library.clone();
        let dir = tempfile::tempdir().unwrap();
        wheel(dir.path(), "cu13-311.whl", &[(lib.as_str(), b"a")]);
        wheel(dir.path(), "other-311.whl", &[(lib.as_str(), b"b")]);
        wheel(dir.path(), "cu13-312.whl", &[("nothing/here", b"")]);
        let two = [
            input("cu13-311.whl", Some("3.11")),
            input("other-311.whl", Some("3.11")),
        ];
        let e = dsl_runtime_pins(dir.path(), &t, &two)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3.11") && e.contains("other-311.whl"), "{e}");
        let none = [
            input("cu13-311.whl", Some("3.11")),
            input("cu13-312.whl", Some("3.12")),
        ];
        let e = dsl_runtime_pins(dir.path(), &t, &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Python 3.12") && e.contains("[]"), "{e}");
    }
}
