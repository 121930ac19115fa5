//! `gdn-gen lock`: the only way the lock changes. Inputs are fetched from
//! their URLs and hashed, the bundle is built in a fresh unit cache (what an
//! earlier build left behind is not trusted, except an entry of unchanged
//! inputs whose bytes the current lock records: unit_reuse.rs), checked
//! against the lock about to be written, and only then are the lock and the
//! bundle written. Pinning the inputs is the plan's first half (pin.rs).

use std::path::Path;

use gdn_lock::{to_canonical_json, verify_bundle, ArtifactKind, HostPolicy, Lock};

use crate::bundle::{assemble, build_key, install, stamp_path, temp_sibling, Env};
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::plan::{Plan, Purpose, UnitCacheDir};
use crate::unit_reuse::Reuse;

pub fn lock(args: &BuildArgs) -> Result<()> {
    let plan = Plan::resolve(args, Purpose::Lock)?;
    let env = Env::prepare(&plan)?;
    let args = &plan.args;
    let tmp = temp_sibling(&args.out, "lock")?;
    // The plan's unit cache is a fresh one: the lock records only what this
    // run compiled, and what the current lock already records for the same
    // inputs (unit_reuse.rs).
    let unit_cache = plan.unit_cache_dir()?;
    let current = Lock::load(&args.lock).ok();
    let reuse = current.as_ref().map(|lock| Reuse {
        shared_cache: &args.cache,
        lock,
    });
    let manifest = assemble(&plan, &env, tmp.path(), unit_cache.path(), reuse.as_ref())?.manifest;
    let mut lock = plan.lock.clone();
    for (path, art) in &manifest.artifacts {
        match art.kind {
            ArtifactKind::DeviceCubin => lock
                .device_artifacts
                .insert(path.clone(), art.digests.clone()),
            ArtifactKind::DslObject | ArtifactKind::DslHeader => {
                lock.dsl_artifacts.insert(path.clone(), art.digests.clone())
            }
            // Pinned per wheel set from the wheels themselves (pin_inputs);
            // the build's copy must be its set's pin.
            ArtifactKind::DslLibrary => {
                let step = "check the built DSL runtime against its wheel set's pin";
                let abi = manifest
                    .dsl
                    .as_ref()
                    .map(|d| d.python_abi.as_str())
                    .unwrap_or("?");
                let pin = lock
                    .dsl_runtime_for(abi)
                    .map_err(|e| GenError::document(step, e))?;
                pin.digests
                    .expect_eq(
                        &format!("the built {path}"),
                        &art.digests,
                        "the DSL wheels changed since they were hashed; run `gdn-gen lock` again",
                    )
                    .map_err(|e| GenError::document(step, e))?;
                None
            }
            _ => lock
                .host_artifacts
                .artifacts
                .insert(path.clone(), art.digests.clone()),
        };
    }
    lock.host_artifacts.host_compiler = manifest.toolchain.host_compiler.clone();
    lock.host_artifacts.toolkit = manifest.toolchain.toolkit;
    lock.dsl_recorded_with_python = manifest.dsl.as_ref().map(|d| d.python.clone());
    // The new lock must accept its own bundle, as every consumer will check it.
    verify_bundle(tmp.path(), &plan.table, &lock, HostPolicy::Locked).map_err(|e| {
        GenError::document(
            "check the new bundle against the new lock (nothing was written)",
            e,
        )
    })?;
    if let Some(old) = &current {
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
