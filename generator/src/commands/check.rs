//! `gdn-gen check`: verify an existing bundle against the lock (no build).

use gdn_lock::{verify_bundle, HostPolicy};

use crate::cli::CheckArgs;
use crate::error::{GenError, Result};
use crate::repo::load_locked;

pub fn check(args: &CheckArgs) -> Result<()> {
    let (_, table, lock) = load_locked(&args.lock)?;
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
