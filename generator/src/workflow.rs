//! The commands: build, verify, lock, check, plan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gdn_lock::{
    to_canonical_json, verify_bundle, ArtifactKind, ArtifactTable, Digests, HostPolicy, InputRole,
    Lock, LockedInput, Manifest, ManifestArtifact, Sha256Hex, MANIFEST_FILE, SCHEMA_VERSION,
    TABLE_FILE,
};

use crate::cli::{BuildArgs, CheckArgs};
use crate::dsl::{self, DslEnv};
use crate::fetch::ensure_input;
use crate::plan::{compile_all, steps_for, unit_key};
use crate::process::Result;
use crate::stage;
use crate::toolkit::{self, Toolkit};

pub(crate) fn repo_root(lock_path: &Path) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(lock_path).map_err(|e| {
        format!(
            "lock {}: {e}; run from the repository root or pass --lock",
            lock_path.display()
        )
    })?;
    Ok(abs.parent().expect("a file has a parent").to_path_buf())
}

pub(crate) fn load_table(repo: &Path) -> Result<(ArtifactTable, Sha256Hex)> {
    ArtifactTable::load_with_sha256(&repo.join(TABLE_FILE)).map_err(|e| e.to_string())
}

/// Table, lock, and a check that our sources are the ones the lock pins.
fn load_locked(lock_path: &Path) -> Result<(PathBuf, ArtifactTable, Lock)> {
    let repo = repo_root(lock_path)?;
    let (table, lock) = gdn_lock::load_table_and_lock(&repo.join(TABLE_FILE), lock_path)
        .map_err(|e| e.to_string())?;
    let current = hash_sources(&repo, &table)?;
    if current != lock.sources {
        for (path, sha) in &current {
            if lock.sources.get(path) != Some(sha) {
                return Err(format!(
                    "source {path}: the lock pins sha256 {}, the file has {sha}; if the change is intended, \
                     run `cargo run --release -p gdn-gen -- lock` and review the diff",
                    lock.sources.get(path).map(|s| s.as_str()).unwrap_or("(nothing)")
                ));
            }
        }
        return Err("the lock pins sources the table no longer lists; run `gdn-gen lock`".into());
    }
    Ok((repo, table, lock))
}

/// Our sources and patches, by repository path.
pub(crate) fn hash_sources(
    repo: &Path,
    table: &ArtifactTable,
) -> Result<BTreeMap<String, Sha256Hex>> {
    table
        .sources
        .iter()
        .chain(&table.patches)
        .map(|p| {
            let bytes = std::fs::read(repo.join(p)).map_err(|e| format!("read source {p}: {e}"))?;
            Ok((p.clone(), Sha256Hex::of_bytes(&bytes)))
        })
        .collect()
}

fn kernel_source_input(lock: &Lock) -> Result<&LockedInput> {
    lock.inputs
        .iter()
        .find(|i| i.role == InputRole::KernelSource)
        .ok_or_else(|| "the lock has no kernel-source input; run `gdn-gen lock`".to_string())
}

/// Stamp beside the bundle: the content key of the last successful build.
pub(crate) fn stamp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".stamp");
    PathBuf::from(s)
}

pub(crate) fn build_key(
    table: &ArtifactTable,
    lock: &Lock,
    tk: &Toolkit,
    dsl: Option<&DslEnv>,
) -> Sha256Hex {
    let doc = serde_json::json!({ "table": table, "lock": lock, "toolchain": tk.identity, "cxx": tk.host_cxx,
                                  "dsl": dsl.map(DslEnv::key),
                                  "generator": env!("CARGO_PKG_VERSION") });
    Sha256Hex::of_bytes(doc.to_string().as_bytes())
}

/// Compiles everything and assembles a bundle in a fresh directory `dest`
/// (which must not exist). Does not compare with the lock's outputs.
/// `unit_cache` holds compiled units by content key: the shared cache for
/// build and lock, an empty directory for verify (which must recompile).
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    args: &BuildArgs,
    repo: &Path,
    table: &ArtifactTable,
    lock: &Lock,
    tk: &Toolkit,
    dsl: Option<&DslEnv>,
    dest: &Path,
    unit_cache: &Path,
) -> Result<()> {
    let ks = kernel_source_input(lock)?;
    let wheel = ensure_input(ks, &args.cache, args.inputs_dir.as_deref(), args.offline)?;
    let sources: Vec<(String, Sha256Hex)> = lock.sources.clone().into_iter().collect();
    let keys: Vec<Sha256Hex> = table
        .units
        .iter()
        .map(|u| unit_key(u, table, &sources, &ks.sha256, tk, dsl))
        .collect();
    // A private staging tree per build: builds sharing a cache never touch
    // each other's sources (paths do not reach the outputs; see plan.rs).
    std::fs::create_dir_all(args.cache.join("stage")).map_err(|e| e.to_string())?;
    let stage_tmp =
        tempfile::tempdir_in(args.cache.join("stage")).map_err(|e| format!("staging dir: {e}"))?;
    let stage_dir = stage_tmp.path().join("src-root");
    stage::prepare(table, repo, &wheel, &stage_dir)?;
    let outputs = compile_all(table, &stage_dir, unit_cache, tk, dsl, &keys, args.jobs)?;

    let mut files: Vec<(String, PathBuf, ArtifactKind)> = vec![];
    for o in &outputs {
        if o.unit.dsl.is_some() {
            let target = &o.unit.targets[0];
            for v in o.unit.dsl_variants() {
                let cubin = o.unit.dsl_cubin_path(v, target);
                files.push((cubin, o.dsl_file(v, "cubin"), ArtifactKind::DeviceCubin));
                let obj = gdn_lock::Unit::dsl_object_path(v);
                files.push((obj, o.dsl_file(v, "o"), ArtifactKind::DslObject));
                let header = gdn_lock::Unit::dsl_header_path(v);
                files.push((header, o.dsl_file(v, "h"), ArtifactKind::DslHeader));
            }
            continue;
        }
        for t in &o.unit.targets {
            files.push((o.unit.cubin_path(t), o.cubin(t), ArtifactKind::DeviceCubin));
        }
        if o.unit.output == gdn_lock::UnitOutput::HostObject {
            files.push((o.unit.object_path(), o.object(), ArtifactKind::HostObject));
        }
    }
    let header_name = table
        .abi_header
        .rsplit('/')
        .next()
        .unwrap_or(&table.abi_header);
    files.push((
        format!("include/{header_name}"),
        repo.join(&table.abi_header),
        ArtifactKind::Header,
    ));
    for lib in &table.toolkit_libraries {
        files.push((
            format!("lib/{lib}"),
            tk.library(lib)?,
            ArtifactKind::HostLibrary,
        ));
    }

    if let (Some(cfg), Some(env), true) = (&table.dsl, dsl, table.has_dsl_units()) {
        files.push((
            format!("lib/{}", gdn_lock::file_name(&cfg.runtime_library)),
            env.site.join(&cfg.runtime_library),
            ArtifactKind::DslLibrary,
        ));
    }
    let mut artifacts = BTreeMap::new();
    for (rel, src, kind) in &files {
        let to = dest.join(rel);
        std::fs::create_dir_all(to.parent().expect("artifact paths have a parent"))
            .map_err(|e| e.to_string())?;
        let bytes = std::fs::read(src).map_err(|e| format!("read {}: {e}", src.display()))?;
        write_file(&to, &bytes)?;
        artifacts.insert(
            rel.clone(),
            ManifestArtifact {
                kind: *kind,
                digests: Digests::of_bytes(&bytes),
            },
        );
    }
    let mut inputs = BTreeMap::new();
    for i in &lock.inputs {
        let used = match i.role {
            InputRole::KernelSource => true,
            InputRole::Toolchain => tk.identity.toolkit == "pypi-wheels",
            InputRole::DslKernelSource | InputRole::DslRuntime => false,
        };
        if used {
            inputs.insert(i.filename.clone(), i.sha256.clone());
        }
    }
    for i in dsl.map(|d| d.inputs.as_slice()).unwrap_or(&[]) {
        inputs.insert(i.filename.clone(), i.sha256.clone());
    }
    inputs.extend(lock.sources.clone());
    let manifest = Manifest {
        schema_version: SCHEMA_VERSION,
        abi_version: table.abi_version,
        geometry: table.geometry.clone(),
        toolchain: tk.identity.clone(),
        inputs,
        artifacts,
        dsl: dsl.map(|d| d.identity.clone()),
    };
    write_file(
        &dest.join(MANIFEST_FILE),
        to_canonical_json(&manifest).as_bytes(),
    )
}

/// Files in a bundle are written with fixed permissions (umask-independent).
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| format!("write {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A temporary sibling of `out`, so the final rename stays on one filesystem.
pub(crate) fn temp_sibling(out: &Path, tag: &str) -> Result<tempfile::TempDir> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    tempfile::Builder::new()
        .prefix(&format!(
            ".{}.{tag}-",
            out.file_name().and_then(|s| s.to_str()).unwrap_or("bundle")
        ))
        .tempdir_in(&parent)
        .map_err(|e| format!("temp dir beside {}: {e}", out.display()))
}

/// Replaces `out` with the complete bundle in `new` by two renames (old aside,
/// new in). `out` never holds a partial bundle: it is the old one, the new
/// one, or, between the two renames, absent. If the second rename fails the
/// old bundle is put back.
pub(crate) fn install(new: tempfile::TempDir, out: &Path) -> Result<()> {
    let new = new.keep();
    if out.exists() {
        let old = temp_sibling(out, "old")?.keep();
        std::fs::remove_dir(&old).ok();
        std::fs::rename(out, &old).map_err(|e| format!("move old bundle aside: {e}"))?;
        if let Err(e) = std::fs::rename(&new, out) {
            let restored = std::fs::rename(&old, out).is_ok();
            std::fs::remove_dir_all(&new).ok();
            return Err(format!(
                "install bundle at {}: {e}; {}",
                out.display(),
                if restored {
                    "the previous bundle was restored".to_string()
                } else {
                    format!("the previous bundle is at {}", old.display())
                }
            ));
        }
        std::fs::remove_dir_all(&old).ok();
    } else {
        std::fs::rename(&new, out)
            .map_err(|e| format!("install bundle at {}: {e}", out.display()))?;
    }
    Ok(())
}

/// Compiles run in the staging directory, so every path handed to them must be absolute.
pub(crate) fn absolute_cache(args: &BuildArgs) -> Result<BuildArgs> {
    std::fs::create_dir_all(&args.cache)
        .map_err(|e| format!("create {}: {e}", args.cache.display()))?;
    let cache = std::fs::canonicalize(&args.cache).map_err(|e| e.to_string())?;
    Ok(BuildArgs {
        cache,
        ..args.clone()
    })
}

/// The nvcc version a variant must use and whether the lock records its bytes.
fn variant_of(args: &BuildArgs, lock: &Lock) -> Result<(String, bool)> {
    let v = lock.variants.get(&args.variant).ok_or_else(|| {
        let known: Vec<&str> = lock.variants.keys().map(String::as_str).collect();
        format!(
            "unknown --variant {:?}; the lock knows {known:?}",
            args.variant
        )
    })?;
    match v.status.as_str() {
        "recorded" if v.nvcc_version == lock.nvcc_version => Ok((lock.nvcc_version.clone(), true)),
        "unrecorded" if args.toolkit_root.is_some() => Ok((v.nvcc_version.clone(), false)),
        "unrecorded" => Err(format!(
            "variant {} is unrecorded and has no pinned toolkit wheels; pass --toolkit-root <CUDA {} toolkit>",
            args.variant, v.nvcc_version
        )),
        other => Err(format!(
            "variant {} has status {other:?} with nvcc {}: schema 1 records device bytes for the default variant only",
            args.variant, v.nvcc_version
        )),
    }
}

const UNRECORDED_BANNER: &str = "\
################################################################
## WARNING: this variant is UNRECORDED in gdn-bundle.lock.json.
## Its device code has never been pinned: the bundle is built but
## NOT compared with the lock, and the kernels crate will refuse it.
## Do not ship it. docs/nix.md says how a maintainer records it.
################################################################";

pub fn build(args: &BuildArgs) -> Result<PathBuf> {
    let args = &absolute_cache(args)?;
    let (repo, table, lock) = load_locked(&args.lock)?;
    let (expected_nvcc, recorded) = variant_of(args, &lock)?;
    let tk = toolkit::resolve(args, &expected_nvcc, &lock)?;
    let dsl = dsl::resolve(args, &table, &lock)?;
    let dsl = dsl.as_ref();
    if !recorded {
        eprintln!("{UNRECORDED_BANNER}");
        let tmp = temp_sibling(&args.out, "new")?;
        assemble(
            args,
            &repo,
            &table,
            &lock,
            &tk,
            dsl,
            tmp.path(),
            &args.cache,
        )?;
        install(tmp, &args.out)?;
        eprintln!(
            "{UNRECORDED_BANNER}\ngdn-gen: unrecorded {} bundle written to {}",
            args.variant,
            args.out.display()
        );
        return Ok(args.out.clone());
    }
    let key = build_key(&table, &lock, &tk, dsl);
    let stamp = stamp_path(&args.out);
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(key.as_str())
        && verify_bundle(
            &args.out,
            &table,
            &lock,
            HostPolicy::AllowForeignHostCompiler,
        )
        .is_ok()
    {
        eprintln!("gdn-gen: bundle at {} is up to date", args.out.display());
        return Ok(args.out.clone());
    }
    let _ = std::fs::remove_file(&stamp);
    let tmp = temp_sibling(&args.out, "new")?;
    assemble(
        args,
        &repo,
        &table,
        &lock,
        &tk,
        dsl,
        tmp.path(),
        &args.cache,
    )?;
    let verified = verify_bundle(tmp.path(), &table, &lock, HostPolicy::AllowForeignHostCompiler).map_err(|e| {
        format!("the built bundle does not match the lock: {e}\n(no bundle was written; `gdn-gen verify` lists every difference)")
    })?;
    install(tmp, &args.out)?;
    std::fs::write(&stamp, key.as_str()).map_err(|e| e.to_string())?;
    eprintln!(
        "gdn-gen: bundle written to {} ({} artifacts; device code matches the lock; host objects {})",
        args.out.display(),
        verified.manifest.artifacts.len(),
        if verified.host_matches_lock { "match the lock byte for byte" } else { "built by another host compiler than the lock's, checked to embed the locked cubins" }
    );
    Ok(args.out.clone())
}

pub fn verify(args: &BuildArgs) -> Result<()> {
    let args = &absolute_cache(args)?;
    let (repo, table, lock) = load_locked(&args.lock)?;
    let (expected_nvcc, recorded) = variant_of(args, &lock)?;
    if !recorded {
        return Err(format!(
            "variant {} is unrecorded: there are no locked bytes to verify against",
            args.variant
        ));
    }
    let tk = toolkit::resolve(args, &expected_nvcc, &lock)?;
    let dsl = dsl::resolve(args, &table, &lock)?;
    let tmp = temp_sibling(&args.out, "verify")?;
    // Recompile everything: the unit cache is the thing being checked.
    let fresh =
        tempfile::tempdir_in(&args.cache).map_err(|e| format!("temporary unit cache: {e}"))?;
    assemble(
        args,
        &repo,
        &table,
        &lock,
        &tk,
        dsl.as_ref(),
        tmp.path(),
        fresh.path(),
    )?;
    let manifest = Manifest::load(&tmp.path().join(MANIFEST_FILE)).map_err(|e| e.to_string())?;
    let mut differ = 0;
    let mut compare = |path: &str, locked: &Digests| match manifest.artifacts.get(path) {
        Some(a) if &a.digests == locked => eprintln!("  same     {path}  {}", locked.sha256),
        Some(a) => {
            differ += 1;
            eprintln!(
                "  DIFFERS  {path}\n           lock  {} ({} bytes)\n           built {} ({} bytes)",
                locked.sha256, locked.size, a.digests.sha256, a.digests.size
            );
        }
        None => {
            differ += 1;
            eprintln!("  MISSING  {path}  (lock {})", locked.sha256);
        }
    };
    eprintln!("gdn-gen: device artifacts against the lock:");
    for (path, locked) in &lock.device_artifacts {
        compare(path, locked);
    }
    if let Some(d) = &dsl {
        eprintln!(
            "gdn-gen: CuTe DSL objects, headers and runtime against the lock (Python {}; the lock's were recorded with {}):",
            d.identity.python,
            lock.dsl_recorded_with_python.as_deref().unwrap_or("?")
        );
        for (path, locked) in &lock.dsl_artifacts {
            compare(path, locked);
        }
        if let Some(path) = table.dsl_runtime_path() {
            let pin = lock
                .dsl_runtime_for(&d.identity.python_abi)
                .map_err(|e| e.to_string())?;
            compare(&path, &pin.digests);
        }
    }
    let host_same = manifest.toolchain.host_compiler == lock.host_artifacts.host_compiler
        && manifest.toolchain.toolkit == lock.host_artifacts.toolkit;
    if host_same {
        eprintln!("gdn-gen: host artifacts (same host compiler and toolkit as the lock):");
        for (path, locked) in &lock.host_artifacts.artifacts {
            compare(path, locked);
        }
    } else {
        eprintln!(
            "gdn-gen: host artifacts not compared: built with {:?} / {}, the lock's are from {:?} / {}",
            manifest.toolchain.host_compiler, manifest.toolchain.toolkit, lock.host_artifacts.host_compiler, lock.host_artifacts.toolkit
        );
    }
    if differ > 0 {
        return Err(format!(
            "{differ} artifact(s) differ from the lock; if the change is intended, record it with \
             `cargo run --release -p gdn-gen -- lock` and review the diff"
        ));
    }
    verify_bundle(
        tmp.path(),
        &table,
        &lock,
        HostPolicy::AllowForeignHostCompiler,
    )
    .map_err(|e| e.to_string())?;
    eprintln!("gdn-gen: verify: every device artifact is byte-identical to the lock");
    Ok(())
}

pub fn check(args: &CheckArgs) -> Result<()> {
    let (_, table, lock) = load_locked(&args.lock)?;
    let policy = if args.allow_foreign_host_compiler {
        HostPolicy::AllowForeignHostCompiler
    } else {
        HostPolicy::Locked
    };
    let v = verify_bundle(&args.bundle, &table, &lock, policy).map_err(|e| e.to_string())?;
    eprintln!(
        "gdn-gen: {} matches the lock ({} artifacts; host objects {})",
        args.bundle.display(),
        v.manifest.artifacts.len(),
        if v.host_matches_lock {
            "identical to the lock's"
        } else {
            "from another host compiler, checked to embed the locked cubins"
        }
    );
    Ok(())
}

pub fn plan(args: &BuildArgs) -> Result<()> {
    let (_, table, lock) = load_locked(&args.lock)?;
    let ks = kernel_source_input(&lock)?;
    println!("inputs:");
    for i in &lock.inputs {
        let used = i.role == InputRole::KernelSource || args.toolkit_root.is_none();
        println!(
            "  {} {} {} {}",
            if used { "fetch" } else { "skip " },
            i.filename,
            i.sha256,
            i.size
        );
    }
    println!(
        "stage: extract {:?} from {}; apply {} patch(es); copy {} source(s)",
        table.kernel_source_members,
        ks.filename,
        table.patches.len(),
        table.sources.len()
    );
    if let Some(cfg) = table.dsl.as_ref().filter(|_| table.has_dsl_units()) {
        println!(
            "CuTe DSL: unpack the dsl-runtime wheels for the interpreter's Python ({:?} pinned) and {:?} of the dsl-kernel-source into a private site dir",
            cfg.pythons, cfg.kernel_source_members
        );
    }
    println!("compile (cwd = stage dir; DSL exports first, their headers go to the stage dir for the nvcc units):");
    for unit in &table.units {
        for step in steps_for(
            unit,
            "<c++>",
            Path::new("<dsl-site>"),
            Path::new("<unit-cache>"),
        ) {
            let program = match step.program {
                crate::plan::Program::Nvcc => "nvcc",
                crate::plan::Program::Python => "<python>",
            };
            println!("  {program} {}", step.args.join(" "));
        }
    }
    println!(
        "bundle: {} device artifact(s) pinned by the lock, manifest.json",
        lock.device_artifacts.len()
    );
    Ok(())
}
