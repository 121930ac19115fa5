//! `gdn-gen lock`: the only way the lock changes. Inputs are fetched from
//! their URLs and hashed, the bundle is built, and its outputs are recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gdn_lock::{
    to_canonical_json, ArtifactKind, Digests, HostArtifacts, Lock, LockedInput, Manifest,
    Sha256Hex, VariantStatus, MANIFEST_FILE, SCHEMA_VERSION,
};

use crate::cli::BuildArgs;
use crate::process::Result;
use crate::toolkit;
use crate::workflow::{
    absolute_cache, assemble, build_key, hash_sources, install, load_table, repo_root, stamp_path,
    temp_sibling,
};

pub fn lock(args: &BuildArgs) -> Result<()> {
    let args = &absolute_cache(args)?;
    let repo = repo_root(&args.lock).or_else(|_| {
        // First lock: the file does not exist yet; its directory is the repo.
        let parent = args
            .lock
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::canonicalize(parent).map_err(|e| e.to_string())
    })?;
    let (table, table_sha) = load_table(&repo)?;
    let old = Lock::load(&args.lock).ok();
    let mut inputs = vec![];
    for spec in &table.inputs {
        // Resolve by downloading the file and hashing it.
        let probe = LockedInput {
            name: spec.name.clone(),
            version: spec.version.clone(),
            role: spec.role,
            filename: spec.filename.clone(),
            url: spec.url.clone(),
            sha256: Sha256Hex::of_bytes(b""),
            size: 0,
            git_revision: spec.git_revision.clone(),
            python: spec.python.clone(),
        };
        let path = fetch_for_lock(args, &probe)?;
        let d = Digests::of_file(&path).map_err(|e| e.to_string())?;
        inputs.push(LockedInput {
            sha256: d.sha256,
            size: d.size,
            ..probe
        });
    }
    let mut lock = Lock {
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
        variants: old
            .as_ref()
            .map(|l| l.variants.clone())
            .unwrap_or_else(default_variants),
        dsl_artifacts: BTreeMap::new(),
        dsl_recorded_with_python: None,
    };
    if args.variant != "cuda-13.0" {
        return Err(format!(
            "recording variant {} needs per-variant device artifacts in the lock (schema 2); \
             schema 1 records the default variant only",
            args.variant
        ));
    }
    let tk = toolkit::resolve(args, &table.nvcc_version, &lock)?;
    let dsl = crate::dsl::resolve(args, &table, &lock)?;
    let tmp = temp_sibling(&args.out, "lock")?;
    assemble(
        args,
        &repo,
        &table,
        &lock,
        &tk,
        dsl.as_ref(),
        tmp.path(),
        &args.cache,
    )?;
    let manifest = Manifest::load(&tmp.path().join(MANIFEST_FILE)).map_err(|e| e.to_string())?;
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
    if let Some(old) = &old {
        for (path, d) in &lock.device_artifacts {
            if old.device_artifacts.get(path) != Some(d) {
                eprintln!("gdn-gen: lock: {path} changes to {}", d.sha256);
            }
        }
    }
    let text = to_canonical_json(&lock);
    let tmp_lock = args.lock.with_extension("json.tmp");
    std::fs::write(&tmp_lock, &text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp_lock, &args.lock).map_err(|e| e.to_string())?;
    install(tmp, &args.out)?;
    std::fs::write(
        stamp_path(&args.out),
        build_key(&table, &lock, &tk, dsl.as_ref()).as_str(),
    )
    .map_err(|e| e.to_string())?;
    eprintln!(
        "gdn-gen: wrote {} ({} device artifacts)",
        args.lock.display(),
        lock.device_artifacts.len()
    );
    Ok(())
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
fn fetch_for_lock(args: &BuildArgs, input: &LockedInput) -> Result<PathBuf> {
    if args.offline {
        return Err(format!(
            "`gdn-gen lock` pins what {} serves and needs the network; drop --offline",
            input.url
        ));
    }
    let dest = args.cache.join("downloads").join(&input.filename);
    crate::fetch::download(&input.url, &dest)?;
    Ok(dest)
}
