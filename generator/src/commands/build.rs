//! `gdn-gen build`: the bundle from the locked inputs, checked against the
//! lock before it replaces the old one; a no-op when nothing changed.

use std::path::PathBuf;

use gdn_lock::{verify_bundle, HostPolicy, VerifiedBundle};

use crate::bundle::{assemble, build_key, install, stamp_path, temp_sibling, Env};
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::files;
use crate::plan::{Plan, Purpose};

const UNRECORDED_BANNER: &str = "\
################################################################
## WARNING: this variant is UNRECORDED in gdn-bundle.lock.json.
## Its device code has never been pinned: the bundle is built but
## NOT compared with the lock, and the kernels crate will refuse it.
## Do not ship it. docs/nix.md says how a maintainer records it.
################################################################";

pub fn build(args: &BuildArgs) -> Result<PathBuf> {
    let plan = Plan::resolve(args, Purpose::Build)?;
    let env = Env::prepare(&plan)?;
    let out = &plan.args.out;
    let unit_cache = plan.unit_cache_dir()?;
    let units = unit_cache.path();
    if !plan.variant.recorded {
        eprintln!("{UNRECORDED_BANNER}");
        let tmp = temp_sibling(out, "new")?;
        assemble(&plan, &env, tmp.path(), units, None)?;
        install(tmp, out)?;
        eprintln!(
            "{UNRECORDED_BANNER}\ngdn-gen: unrecorded {} bundle written to {}",
            plan.variant.name,
            out.display()
        );
        return Ok(out.clone());
    }
    let key = build_key(&plan, &plan.lock, &env);
    let stamp = stamp_path(out);
    if files::read_marker("read the stamp", &stamp)?.as_deref() == Some(key.as_str())
        && check(&plan, out).is_ok()
    {
        eprintln!("gdn-gen: bundle at {} is up to date", out.display());
        return Ok(out.clone());
    }
    let _ = std::fs::remove_file(&stamp);
    let mut tmp = temp_sibling(out, "new")?;
    let assembled = assemble(&plan, &env, tmp.path(), units, None)?;
    let verified = match check(&plan, tmp.path()) {
        Ok(v) => v,
        Err(first) => {
            // Reused unit cache entries whose bytes differ from the lock are
            // the suspects: evict them and compile those units once more.
            let suspects = assembled.reused_entries_differing_from(&plan.lock);
            if suspects.is_empty() {
                return Err(GenError::BuiltBundleDiffers {
                    detail: first.to_string(),
                    cache: plan.args.cache.clone(),
                });
            }
            for (entry, artifact) in &suspects {
                eprintln!(
                    "gdn-gen: the unit cache entry {} gave {artifact}, whose bytes differ from the lock; \
                     evicted, compiling that unit again",
                    entry.display()
                );
                std::fs::remove_dir_all(entry)
                    .map_err(|e| GenError::io("evict a unit cache entry", entry, e))?;
            }
            drop(tmp);
            tmp = temp_sibling(out, "new")?;
            assemble(&plan, &env, tmp.path(), units, None)?;
            check(&plan, tmp.path()).map_err(|e| GenError::BuiltBundleDiffers {
                detail: e.to_string(),
                cache: plan.args.cache.clone(),
            })?
        }
    };
    install(tmp, out)?;
    std::fs::write(&stamp, key.as_str()).map_err(|e| GenError::io("write the stamp", &stamp, e))?;
    eprintln!(
        "gdn-gen: bundle written to {} ({} artifacts; device code matches the lock; host objects {})",
        out.display(),
        verified.manifest.artifacts.len(),
        if verified.host_matches_lock { "match the lock byte for byte" } else { "built by another host compiler than the lock's, checked to embed the locked cubins" }
    );
    Ok(out.clone())
}

/// A bundle built here against the lock (host code from this machine's
/// compiler is accepted: it was built from the pinned sources).
fn check(
    plan: &Plan,
    dir: &std::path::Path,
) -> std::result::Result<VerifiedBundle, gdn_lock::Error> {
    verify_bundle(
        dir,
        &plan.table,
        &plan.lock,
        HostPolicy::AllowForeignHostCompiler,
    )
}
