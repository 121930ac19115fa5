//! `gdn-gen verify`: rebuild from scratch (a fresh unit cache) into a
//! temporary directory and compare every artifact with the lock.

use gdn_lock::{verify_bundle, Digests, HostPolicy};

use crate::bundle::{assemble, temp_sibling, Env};
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::plan::{Plan, Purpose};
use crate::unit_reuse::built_like;

pub fn verify(args: &BuildArgs) -> Result<()> {
    let plan = Plan::resolve(args, Purpose::Verify)?;
    let env = Env::prepare(&plan)?;
    let lock = &plan.lock;
    let tmp = temp_sibling(&plan.args.out, "verify")?;
    // The plan's unit cache is a fresh one: everything is compiled again
    // (the shared cache is among the things being checked).
    let unit_cache = plan.unit_cache_dir()?;
    let manifest = assemble(&plan, &env, tmp.path(), unit_cache.path(), None)?.manifest;
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
    if let Some(d) = &env.dsl {
        eprintln!(
            "gdn-gen: CuTe DSL objects, headers and runtime against the lock (Python {}; the lock's were recorded with {}):",
            d.identity.python,
            lock.dsl_recorded_with_python.as_deref().unwrap_or("?")
        );
        for (path, locked) in &lock.dsl_artifacts {
            compare(path, locked);
        }
        if let Some(path) = plan.table.dsl_runtime_path() {
            let pin = lock
                .dsl_runtime_for(&d.identity.python_abi)
                .map_err(|e| GenError::document("find the DSL runtime's pin", e))?;
            compare(&path, &pin.digests);
        }
    }
    if built_like(&manifest.toolchain, lock) {
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
        return Err(GenError::refused(
            "compare the rebuilt bundle with the lock",
            format!(
                "{differ} artifact(s) differ from the lock (listed above); if the change is intended \
                 (new sources, inputs or toolchain), record it with `cargo run --release -p gdn-gen -- lock` \
                 and review the diff"
            ),
        ));
    }
    verify_bundle(
        tmp.path(),
        &plan.table,
        lock,
        HostPolicy::AllowForeignHostCompiler,
    )
    .map_err(|e| GenError::document("check the rebuilt bundle", e))?;
    eprintln!("gdn-gen: verify: every device artifact is byte-identical to the lock");
    Ok(())
}
