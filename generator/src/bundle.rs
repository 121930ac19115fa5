//! Executing a plan into a bundle directory: stage, compile (through a unit
//! cache), copy the outputs and write the manifest; and installing a finished
//! bundle in place of the old one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gdn_lock::{
    to_canonical_json, ArtifactKind, ArtifactTable, InputRole, Links, Lock, LockedInput, Manifest,
    ManifestArtifact, Sha256Hex, MANIFEST_FILE, SCHEMA_VERSION,
};

use crate::dsl::{self, DslEnv};
use crate::error::{GenError, Result};
use crate::fetch::ensure_input;
use crate::files;
use crate::plan::Plan;
use crate::stage;
use crate::toolkit::{self, Toolkit};
use crate::unit_key::{unit_keys, KeyInputs};
use crate::unit_reuse::{self, built_like, locked_digests, Reuse};
use crate::units::{compile_all, UnitOutputs};

/// The toolkit and DSL environment a plan runs with.
pub struct Env {
    pub tk: Toolkit,
    pub dsl: Option<DslEnv>,
}

impl Env {
    /// Extracts or finds the toolkit and unpacks the DSL wheels of the plan.
    pub fn prepare(plan: &Plan) -> Result<Env> {
        let wheels: Vec<&gdn_lock::LockedInput> =
            plan.inputs_with(&[InputRole::Toolchain]).collect();
        let dsl_inputs = plan
            .inputs_with(&[InputRole::DslRuntime, InputRole::DslKernelSource])
            .cloned()
            .collect();
        Ok(Env {
            tk: toolkit::resolve(&plan.args, &plan.variant.nvcc_version, &wheels)?,
            dsl: dsl::prepare(&plan.args, &plan.table, plan.python.as_ref(), dsl_inputs)?,
        })
    }
}

/// A bundle written by [`assemble`].
pub struct Assembled {
    pub manifest: Manifest,
    /// For each bundle path that a compiled unit produced: that unit's cache
    /// entry, and whether it was reused rather than compiled by this run.
    pub from_unit: BTreeMap<String, (PathBuf, bool)>,
}

impl Assembled {
    /// Cache entries that were reused and produced bytes other than the
    /// lock's, with one such bundle path each. Host code is only compared
    /// when it was built like the lock's (same host compiler and toolkit).
    pub fn reused_entries_differing_from(&self, lock: &Lock) -> BTreeMap<PathBuf, String> {
        let host_like_lock = built_like(&self.manifest.toolchain, lock);
        let mut out = BTreeMap::new();
        for (path, art) in &self.manifest.artifacts {
            let Some((entry, true)) = self.from_unit.get(path) else {
                continue;
            };
            if locked_digests(lock, path, host_like_lock).is_some_and(|l| l != &art.digests) {
                out.entry(entry.clone()).or_insert_with(|| path.clone());
            }
        }
        out
    }
}

/// Stamp beside the bundle: the content key of the last successful build.
pub fn stamp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".stamp");
    PathBuf::from(s)
}

/// What a bundle built from this plan depends on.
pub fn build_key(plan: &Plan, lock: &Lock, env: &Env) -> Sha256Hex {
    let doc = serde_json::json!({ "table": plan.table, "lock": lock, "toolchain": env.tk.identity,
                                  "cxx": env.tk.host_cxx, "dsl": env.dsl.as_ref().map(DslEnv::key),
                                  "generator": env!("CARGO_PKG_VERSION") });
    Sha256Hex::of_bytes(doc.to_string().as_bytes())
}

/// Compiles everything and assembles a bundle in a fresh directory `dest`.
/// Does not compare with the lock's outputs. Compiled units are taken from
/// and put in `unit_cache` (by content key); with `reuse` (`lock`), the
/// entries the lock vouches for are first copied there (unit_reuse.rs).
pub fn assemble(
    plan: &Plan,
    env: &Env,
    dest: &Path,
    unit_cache: &Path,
    reuse: Option<&Reuse>,
) -> Result<Assembled> {
    let (table, tk) = (&plan.table, &env.tk);
    let ks = plan.kernel_source()?;
    // Bound for the whole build: the staging tree is removed when it drops.
    let (_stage_tmp, stage_dir) = stage_sources(plan, ks)?;
    let keys = staged_unit_keys(plan, env, ks, &stage_dir)?;
    if let Some(reuse) = reuse {
        seed_reused_units(table, &keys, unit_cache, reuse, tk)?;
    }
    let outputs = compile_all(
        table,
        &stage_dir,
        unit_cache,
        tk,
        env.dsl.as_ref(),
        &keys,
        plan.args.jobs,
    )?;
    let to_copy = bundle_files(plan, env, &outputs)?;
    let (artifacts, from_unit) = copy_into_bundle(dest, &to_copy, &outputs)?;
    let manifest = write_manifest(plan, env, dest, artifacts)?;
    Ok(Assembled {
        manifest,
        from_unit,
    })
}

/// Stages the sources of the kernel-source wheel `ks` and ours in a private
/// staging tree per build: builds sharing a cache never touch each other's
/// sources (paths do not reach the outputs; see units.rs). Returns the tree
/// (removed when dropped) and its source root.
fn stage_sources(plan: &Plan, ks: &LockedInput) -> Result<(tempfile::TempDir, PathBuf)> {
    let args = &plan.args;
    let wheel = ensure_input(ks, &args.cache, args.inputs_dir.as_deref(), args.offline)?;
    let stage_root = args.cache.join("stage");
    std::fs::create_dir_all(&stage_root)
        .map_err(|e| GenError::io("create the staging area", &stage_root, e))?;
    let stage_tmp = tempfile::tempdir_in(&stage_root)
        .map_err(|e| GenError::io("create a staging tree", &stage_root, e))?;
    let stage_dir = stage_tmp.path().join("src-root");
    stage::prepare(&plan.table, &plan.repo, &wheel, &stage_dir)?;
    Ok((stage_tmp, stage_dir))
}

/// Each unit's cache key, by what it reads, as staged (see unit_key.rs).
fn staged_unit_keys(
    plan: &Plan,
    env: &Env,
    ks: &LockedInput,
    stage_dir: &Path,
) -> Result<Vec<Sha256Hex>> {
    let tk = &env.tk;
    let key_inputs = KeyInputs {
        table: &plan.table,
        sources: &plan.lock.sources,
        kernel_source: &ks.sha256,
        toolchain: serde_json::json!({ "identity": tk.identity, "host_cxx": tk.host_cxx }),
        dsl: env.dsl.as_ref().map(DslEnv::key),
    };
    unit_keys(&key_inputs, |path| {
        let staged = stage_dir.join(stage::staged_source(path));
        files::read_text(
            "read a staged source",
            &staged,
            Links::Refuse,
            gdn_lock::MAX_SOURCE_BYTES,
        )
    })
}

/// Copies into `unit_cache` the entries the lock vouches for, and says which.
fn seed_reused_units(
    table: &ArtifactTable,
    keys: &[Sha256Hex],
    unit_cache: &Path,
    reuse: &Reuse,
    tk: &Toolkit,
) -> Result<()> {
    let taken = unit_reuse::seed(table, keys, unit_cache, reuse, tk)?;
    if !taken.is_empty() {
        eprintln!(
            "gdn-gen: reusing {} unit(s) whose inputs are unchanged and whose outputs the lock records: {}",
            taken.len(),
            taken.join(", ")
        );
    }
    Ok(())
}

/// One file of the bundle.
struct BundleFile {
    /// Its bundle path.
    rel: String,
    /// The file to copy.
    src: PathBuf,
    kind: ArtifactKind,
    /// The compiled unit that produced it (an index into the outputs).
    unit: Option<usize>,
}

/// Every file of the bundle: the units' outputs, the ABI header, the
/// toolkit libraries and the DSL runtime.
fn bundle_files(plan: &Plan, env: &Env, outputs: &[UnitOutputs]) -> Result<Vec<BundleFile>> {
    let (table, tk, dsl) = (&plan.table, &env.tk, env.dsl.as_ref());
    let mut copies = vec![];
    for (i, o) in outputs.iter().enumerate() {
        copies.extend(o.files().into_iter().map(|(rel, src, kind)| BundleFile {
            rel,
            src,
            kind,
            unit: Some(i),
        }));
    }
    copies.push(BundleFile {
        rel: format!("include/{}", gdn_lock::file_name(&table.abi_header)),
        src: plan.repo.join(&table.abi_header),
        kind: ArtifactKind::Header,
        unit: None,
    });
    for lib in &table.toolkit_libraries {
        copies.push(BundleFile {
            rel: format!("lib/{lib}"),
            src: tk.library(lib)?,
            kind: ArtifactKind::HostLibrary,
            unit: None,
        });
    }
    if let (Some(cfg), Some(dsl), true) = (&table.dsl, dsl, table.has_dsl_units()) {
        copies.push(BundleFile {
            rel: format!("lib/{}", gdn_lock::file_name(&cfg.runtime_library)),
            src: dsl.site.join(&cfg.runtime_library),
            kind: ArtifactKind::DslLibrary,
            unit: None,
        });
    }
    Ok(copies)
}

/// [`Assembled::from_unit`]: for each bundle path a compiled unit produced,
/// that unit's cache entry and whether it was reused.
type UnitEntries = BTreeMap<String, (PathBuf, bool)>;

/// Copies `to_copy` into the bundle at `dest` with fixed permissions: their
/// manifest entries, and for each bundle path a unit produced, that unit's
/// cache entry and whether it was reused. Links are followed only into a
/// toolkit root (Nix merges its toolkit from links).
fn copy_into_bundle(
    dest: &Path,
    to_copy: &[BundleFile],
    outputs: &[UnitOutputs],
) -> Result<(BTreeMap<String, ManifestArtifact>, UnitEntries)> {
    let step = "assemble the bundle";
    let mut artifacts = BTreeMap::new();
    let mut from_unit = BTreeMap::new();
    for BundleFile {
        rel,
        src,
        kind,
        unit,
    } in to_copy
    {
        let to = dest.join(rel);
        let parent = to.parent().expect("artifact paths have a parent");
        std::fs::create_dir_all(parent).map_err(|e| GenError::io(step, parent, e))?;
        let links = match kind {
            ArtifactKind::HostLibrary | ArtifactKind::Header => Links::Follow,
            _ => Links::Refuse,
        };
        let digests = files::copy(step, src, &to, links)?;
        fixed_permissions(&to)?;
        artifacts.insert(
            rel.clone(),
            ManifestArtifact {
                kind: *kind,
                digests,
            },
        );
        if let Some(i) = unit {
            from_unit.insert(
                rel.clone(),
                (outputs[*i].dir.clone(), !outputs[*i].compiled_now),
            );
        }
    }
    Ok((artifacts, from_unit))
}

/// Writes the manifest of the bundle at `dest`, listing `artifacts`.
fn write_manifest(
    plan: &Plan,
    env: &Env,
    dest: &Path,
    artifacts: BTreeMap<String, ManifestArtifact>,
) -> Result<Manifest> {
    let table = &plan.table;
    // The inputs are the plan's: decided once, in Lock::used_inputs.
    let mut inputs: BTreeMap<String, Sha256Hex> = plan
        .inputs
        .iter()
        .map(|i| (i.filename.clone(), i.sha256.clone()))
        .collect();
    inputs.extend(plan.lock.sources.clone());
    let manifest = Manifest {
        schema_version: SCHEMA_VERSION,
        abi_version: table.abi_version,
        geometry: table.geometry.clone(),
        toolchain: env.tk.identity.clone(),
        inputs,
        artifacts,
        dsl: env.dsl.as_ref().map(|d| d.identity.clone()),
    };
    let manifest_path = dest.join(MANIFEST_FILE);
    std::fs::write(&manifest_path, to_canonical_json(&manifest))
        .map_err(|e| GenError::io("write the bundle", &manifest_path, e))?;
    fixed_permissions(&manifest_path)?;
    Ok(manifest)
}

/// Files in a bundle have fixed permissions (umask-independent).
fn fixed_permissions(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| GenError::io("write the bundle", path, e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// A temporary sibling of `out`, so the final rename stays on one filesystem.
pub fn temp_sibling(out: &Path, tag: &str) -> Result<tempfile::TempDir> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let step = "create a directory beside the bundle";
    std::fs::create_dir_all(&parent).map_err(|e| GenError::io(step, &parent, e))?;
    tempfile::Builder::new()
        .prefix(&format!(
            ".{}.{tag}-",
            out.file_name().and_then(|s| s.to_str()).unwrap_or("bundle")
        ))
        .tempdir_in(&parent)
        .map_err(|e| GenError::io(step, &parent, e))
}

/// Replaces `out` with the complete bundle in `new` by two renames (old aside,
/// new in). `out` never holds a partial bundle: it is the old one, the new
/// one, or, between the two renames, absent. If the second rename fails the
/// old bundle is put back.
pub fn install(new: tempfile::TempDir, out: &Path) -> Result<()> {
    let new = new.keep();
    let step = "install the bundle";
    if out.exists() {
        let old = temp_sibling(out, "old")?.keep();
        std::fs::remove_dir(&old).ok();
        std::fs::rename(out, &old)
            .map_err(|e| GenError::io("move the old bundle aside", out, e))?;
        if let Err(e) = std::fs::rename(&new, out) {
            let restored = std::fs::rename(&old, out).is_ok();
            std::fs::remove_dir_all(&new).ok();
            return Err(GenError::refused(
                step,
                format!(
                    "{}: {e}; {}",
                    out.display(),
                    if restored {
                        "the previous bundle was restored".to_string()
                    } else {
                        format!("the previous bundle is at {}", old.display())
                    }
                ),
            ));
        }
        std::fs::remove_dir_all(&old).ok();
    } else {
        std::fs::rename(&new, out).map_err(|e| GenError::io(step, out, e))?;
    }
    Ok(())
}
