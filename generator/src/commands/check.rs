//! `gdn-gen check`: verify an existing bundle against the lock (no build).

use gdn_lock::{verify_bundle, HostPolicy, TABLE_FILE};

use crate::cli::CheckArgs;
use crate::error::{GenError, Result};
use crate::plan::repo_root;

pub fn check(args: &CheckArgs) -> Result<()> {
    let repo = repo_root(&args.lock)?;
    let (table, lock) = gdn_lock::load_table_and_lock(&repo.join(TABLE_FILE), &args.lock)
        .map_err(|e| GenError::document("read the table and the lock", e))?;
    gdn_lock::check_sources_match_lock(&repo, &table, &lock)
        .map_err(|e| GenError::document("check our sources against the lock", e))?;
    let policy = if args.allow_foreign_host_compiler {
        HostPolicy::AllowForeignHostCompiler
    } else {
        HostPolicy::Locked
    };
    let bundle = std::path::absolute(&args.bundle)
        .map_err(|e| GenError::io("find the bundle", &args.bundle, e))?;
    let v = verify_bundle(&bundle, &table, &lock, policy)
        .map_err(|e| GenError::document(format!("check the bundle at {}", bundle.display()), e))?;
    eprintln!(
        "gdn-gen: {} matches the lock ({} artifacts; host objects {})",
        bundle.display(),
        v.manifest.artifacts.len(),
        if v.host_matches_lock {
            "identical to the lock's"
        } else {
            "from another host compiler, checked to embed the locked cubins"
        }
    );
    Ok(())
}
