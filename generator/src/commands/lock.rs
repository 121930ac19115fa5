//! `gdn-gen lock`: the only way the lock changes. Inputs are fetched from
//! their URLs and hashed, the bundle is built from scratch (a fresh unit
//! cache: what an earlier build left behind is not trusted), checked against
//! the lock about to be written, and only then are the lock and the bundle
//! written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gdn_lock::{
    to_canonical_json, verify_bundle, ArtifactKind, ArtifactTable, Digests, HostArtifacts,
    HostPolicy, Lock, LockedInput, Sha256Hex, VariantStatus, SCHEMA_VERSION, TABLE_FILE,
};

use crate::bundle::{assemble, build_key, install, stamp_path, temp_sibling, Env};
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::plan::{repo_root, Plan, Purpose, UnitCacheDir};

pub fn lock(args: &BuildArgs) -> Result<()> {
    let plan = Plan::resolve(args, Purpose::Lock)?;
    let env = Env::prepare(&plan)?;
    let args = &plan.args;
    let tmp = temp_sibling(&args.out, "lock")?;
    // The plan's unit cache is a fresh one: the lock records only what this
    // run compiled.
    let unit_cache = plan.unit_cache_dir()?;
    let manifest = assemble(&plan, &env, tmp.path(), unit_cache.path())?.manifest;
    let mut lock = plan.lock.clone();
    for (path, art) in &manifest.artifacts {
        match art.kind {
            ArtifactKind::DeviceCubin => lock
                .device_artifacts
                .insert(path.clone(), art.digests.clone()),
            ArtifactKind::DslObject | ArtifactKind::DslHeader | ArtifactKind::DslLibrary => {
                lock.dsl_artifacts.insert(path.clone(), art.digests.clone())
            }
            _ => lock
                .host_artifacts
                .artifacts
                .insert(path.clone(), art.digests.clone()),
        };
    }
    lock.host_artifacts.host_compiler = manifest.toolchain.host_compiler.clone();
    lock.host_artifacts.toolkit = manifest.toolchain.toolkit.clone();
    lock.dsl_recorded_with_python = manifest.dsl.as_ref().map(|d| d.python.clone());
    // The new lock must accept its own bundle, as every consumer will check it.
    verify_bundle(tmp.path(), &plan.table, &lock, HostPolicy::Locked).map_err(|e| {
        GenError::document(
            "check the new bundle against the new lock (nothing was written)",
            e,
        )
    })?;
    if let Ok(old) = Lock::load(&args.lock) {
        for (path, d) in &lock.device_artifacts {
            if old.device_artifacts.get(path) != Some(d) {
                eprintln!("gdn-gen: lock: {path} changes to {}", d.sha256);
            }
        }
    }
    let text = to_canonical_json(&lock);
    let tmp_lock = args.lock.with_extension("json.tmp");
    std::fs::write(&tmp_lock, &text).map_err(|e| GenError::io("write the lock", &tmp_lock, e))?;
    std::fs::rename(&tmp_lock, &args.lock)
        .map_err(|e| GenError::io("write the lock", &args.lock, e))?;
    install(tmp, &args.out)?;
    if let UnitCacheDir::Fresh(fresh) = &unit_cache {
        adopt_fresh_units(fresh.path(), &args.cache);
    }
    let stamp = stamp_path(&args.out);
    std::fs::write(&stamp, build_key(&plan, &lock, &env).as_str())
        .map_err(|e| GenError::io("write the stamp", &stamp, e))?;
    eprintln!(
        "gdn-gen: wrote {} ({} device artifacts)",
        args.lock.display(),
        lock.device_artifacts.len()
    );
    Ok(())
}

/// The units compiled afresh for the lock replace the shared cache's entries
/// of the same keys, so the next `build` reuses what the lock recorded. Best
/// effort: a unit left out is compiled again by the next build.
fn adopt_fresh_units(fresh: &Path, cache: &Path) {
    let (from, to) = (fresh.join("units"), cache.join("units"));
    let _ = std::fs::create_dir_all(&to);
    for entry in std::fs::read_dir(&from).into_iter().flatten().flatten() {
        let dest = to.join(entry.file_name());
        let _ = std::fs::remove_dir_all(&dest);
        let _ = std::fs::rename(entry.path(), &dest);
    }
}

/// The first half of the lock's plan: the table's inputs fetched from their
/// URLs and hashed, our sources hashed, and a lock with no outputs yet.
pub(crate) fn pin_inputs(args: &BuildArgs) -> Result<(PathBuf, ArtifactTable, Lock)> {
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
        host_artifacts: HostArtifacts {
            host_compiler: String::new(),
            toolkit: String::new(),
            artifacts: BTreeMap::new(),
        },
        variants,
        dsl_artifacts: BTreeMap::new(),
        dsl_recorded_with_python: None,
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
            let d = Digests::of_file(&repo.join(p))
                .map_err(|e| GenError::document("hash our sources", e))?;
            Ok((p.clone(), d.sha256))
        })
        .collect()
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
