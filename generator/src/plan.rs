//! The plan: what one command will do, decided once before anything is
//! compiled. `plan` prints it; `build`, `verify` and `lock` execute it. The
//! inputs a build uses, the variant and its nvcc, the interpreter of the DSL
//! export and where compiled units are cached are all settled here.

use std::path::{Path, PathBuf};

use gdn_lock::{ArtifactTable, InputRole, Lock, LockedInput};

use crate::cli::BuildArgs;
use crate::dsl::{self, Python};
use crate::error::{GenError, Result};
use crate::pin::pin_inputs;
use crate::repo::load_locked;
use crate::toolkit;
use crate::units::{steps_for, Program};

/// What the plan is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Build the bundle (or show what a build would do).
    Build,
    /// Rebuild from scratch and compare with the lock.
    Verify,
    /// Pin the inputs, build from scratch, record the outputs.
    Lock,
}

/// Where compiled units come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitCache {
    /// `<cache>/units`, reused across builds (entries that turn out to differ
    /// from the lock are evicted and compiled again).
    Shared,
    /// An empty directory: everything is compiled again. For `verify` and
    /// `lock`, which must not trust what an earlier build left behind.
    Fresh,
}

/// Where [`Plan::unit_cache_dir`] put the unit cache.
pub enum UnitCacheDir {
    Shared(PathBuf),
    Fresh(tempfile::TempDir),
}

impl UnitCacheDir {
    pub fn path(&self) -> &Path {
        match self {
            UnitCacheDir::Shared(p) => p,
            UnitCacheDir::Fresh(t) => t.path(),
        }
    }
}

/// The toolchain variant (a key of the lock's `variants`).
#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    /// The nvcc the toolkit must be (`V13.0.88`, or a `V12.8.x` pattern).
    pub nvcc_version: String,
    /// Whether the lock records this variant's bytes.
    pub recorded: bool,
}

pub struct Plan {
    /// The command's arguments, with the cache made absolute (compiles run
    /// in the staging directory).
    pub args: BuildArgs,
    pub repo: PathBuf,
    pub table: ArtifactTable,
    /// The lock this command builds against; for `lock`, the one being
    /// written (inputs pinned, outputs not yet recorded).
    pub lock: Lock,
    pub variant: Variant,
    /// The interpreter of the CuTe DSL export (`None` without DSL units).
    pub python: Option<Python>,
    /// Exactly the inputs this build uses, in lock order.
    pub inputs: Vec<LockedInput>,
    pub unit_cache: UnitCache,
}

impl Plan {
    /// Reads the table and the lock (for `lock`: pins the table's inputs
    /// first, which downloads them), checks our sources against the lock,
    /// and settles the variant, the interpreter and the inputs.
    pub fn resolve(args: &BuildArgs, purpose: Purpose) -> Result<Plan> {
        let args = absolute_cache(args)?;
        let (repo, table, lock) = match purpose {
            Purpose::Lock => pin_inputs(&args)?,
            Purpose::Build | Purpose::Verify => load_locked(&args.lock)?,
        };
        let variant = variant_of(&args, &lock)?;
        if purpose != Purpose::Build && !variant.recorded {
            return Err(GenError::refused(
                "choose the variant",
                format!(
                    "variant {} is unrecorded: there are no locked bytes to {} against; \
                     schema 1 records the default variant only",
                    variant.name,
                    if purpose == Purpose::Verify {
                        "verify"
                    } else {
                        "record"
                    }
                ),
            ));
        }
        let python = dsl::probe_python(&args, &table)?;
        let inputs = lock
            .used_inputs(
                toolkit::kind(&args),
                python.as_ref().map(|p| p.abi.as_str()),
            )
            .into_iter()
            .cloned()
            .collect();
        Ok(Plan {
            unit_cache: match purpose {
                Purpose::Build => UnitCache::Shared,
                Purpose::Verify | Purpose::Lock => UnitCache::Fresh,
            },
            args,
            repo,
            table,
            lock,
            variant,
            python,
            inputs,
        })
    }

    /// The directory compiled units are cached under (`units/` inside it):
    /// the shared cache, or a fresh one that lives as long as the value.
    pub fn unit_cache_dir(&self) -> Result<UnitCacheDir> {
        match self.unit_cache {
            UnitCache::Shared => Ok(UnitCacheDir::Shared(self.args.cache.clone())),
            UnitCache::Fresh => tempfile::tempdir_in(&self.args.cache)
                .map(UnitCacheDir::Fresh)
                .map_err(|e| GenError::io("create a fresh unit cache", &self.args.cache, e)),
        }
    }

    /// The inputs of the given roles, among those this build uses.
    pub fn inputs_with(&self, roles: &[InputRole]) -> impl Iterator<Item = &LockedInput> {
        let roles = roles.to_vec();
        self.inputs.iter().filter(move |i| roles.contains(&i.role))
    }

    /// The single kernel-source input.
    pub fn kernel_source(&self) -> Result<&LockedInput> {
        self.inputs_with(&[InputRole::KernelSource])
            .next()
            .ok_or_else(|| {
                GenError::refused(
                    "find the kernel source",
                    "the lock has no kernel-source input; restore gdn-bundle.lock.json",
                )
            })
    }

    /// What `gdn-gen plan` shows.
    pub fn print(&self) -> Result<()> {
        println!(
            "variant: {} (nvcc {}, {})",
            self.variant.name,
            self.variant.nvcc_version,
            if self.variant.recorded {
                "recorded in the lock"
            } else {
                "UNRECORDED: built, not compared with the lock"
            }
        );
        println!("inputs:");
        for i in &self.lock.inputs {
            let used = self.inputs.iter().any(|u| u.filename == i.filename);
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
            self.table.kernel_source_members,
            self.kernel_source()?.filename,
            self.table.patches.len(),
            self.table.sources.len()
        );
        if let (Some(cfg), Some(py)) = (&self.table.dsl, &self.python) {
            println!(
                "CuTe DSL: Python {} ({}) with the {} wheel set, and {:?} of the dsl-kernel-source wheels, unpacked into a private site dir",
                py.version,
                py.exe.display(),
                py.abi,
                cfg.kernel_source_members
            );
        }
        println!(
            "compile (cwd = stage dir; unit cache: {}; DSL exports first, their headers go to the stage dir for the nvcc units):",
            match self.unit_cache {
                UnitCache::Shared => format!("{}", self.args.cache.join("units").display()),
                UnitCache::Fresh => "a fresh one".to_string(),
            }
        );
        for unit in &self.table.units {
            for step in steps_for(
                unit,
                "<c++>",
                Path::new("<dsl-site>"),
                Path::new("<unit-cache>"),
            ) {
                let program = match step.program {
                    Program::Nvcc => "nvcc",
                    Program::Python => "<python>",
                };
                println!("  {program} {}", step.args.join(" "));
            }
        }
        println!(
            "bundle: {} device artifact(s) pinned by the lock, manifest.json",
            self.lock.device_artifacts.len()
        );
        Ok(())
    }
}

/// Compiles run in the staging directory, so every path handed to them must be absolute.
fn absolute_cache(args: &BuildArgs) -> Result<BuildArgs> {
    std::fs::create_dir_all(&args.cache)
        .map_err(|e| GenError::io("create the cache", &args.cache, e))?;
    let cache = std::fs::canonicalize(&args.cache)
        .map_err(|e| GenError::io("find the cache", &args.cache, e))?;
    Ok(BuildArgs {
        cache,
        ..args.clone()
    })
}

/// The nvcc version a variant must use and whether the lock records its bytes.
fn variant_of(args: &BuildArgs, lock: &Lock) -> Result<Variant> {
    let step = "choose the variant";
    let v = lock.variants.get(&args.variant).ok_or_else(|| {
        let known: Vec<&str> = lock.variants.keys().map(String::as_str).collect();
        GenError::refused(
            step,
            format!(
                "unknown --variant {:?}; the lock knows {known:?}",
                args.variant
            ),
        )
    })?;
    let variant = |nvcc: &str, recorded| Variant {
        name: args.variant.clone(),
        nvcc_version: nvcc.to_string(),
        recorded,
    };
    match v.status.as_str() {
        "recorded" if v.nvcc_version == lock.nvcc_version => Ok(variant(&lock.nvcc_version, true)),
        "unrecorded" if args.toolkit_root.is_some() => Ok(variant(&v.nvcc_version, false)),
        "unrecorded" => Err(GenError::refused(step, format!(
            "variant {} is unrecorded and has no pinned toolkit wheels; pass --toolkit-root <CUDA {} toolkit>",
            args.variant, v.nvcc_version
        ))),
        other => Err(GenError::refused(step, format!(
            "variant {} has status {other:?} with nvcc {}: schema 1 records device bytes for the default variant only",
            args.variant, v.nvcc_version
        ))),
    }
}
