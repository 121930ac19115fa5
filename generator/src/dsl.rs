//! The CuTe DSL compiler: the pinned DSL wheels and the Python kernels of
//! the `dsl-kernel-source` wheels (FlashInfer's, quack-kernels') unpacked
//! into a private site directory (no pip, no venv), and the interpreter that
//! runs `generator/cute_dsl/export_gdn.py` over it.

use std::path::{Path, PathBuf};
use std::process::Command;

use gdn_lock::{ArtifactTable, DslIdentity, InputRole, LockedInput, Sha256Hex};

use crate::archive::extract_zip;
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::fetch::ensure_input;
use crate::files;
use crate::process::{hermetic, run};

/// The interpreter that runs the export, as found by [`probe_python`].
#[derive(Debug, Clone)]
pub struct Python {
    /// Absolute path (`sys.executable`), so the hermetic environment's PATH
    /// cannot swap it (pyenv shims read HOME).
    pub exe: PathBuf,
    /// `3.11.2`
    pub version: String,
    /// `3.11`: which pinned wheel set it uses.
    pub abi: String,
}

/// The interpreter and the unpacked wheels a DSL export runs with.
#[derive(Debug, Clone)]
pub struct DslEnv {
    pub python: PathBuf,
    pub identity: DslIdentity,
    /// The private site directory: every wheel of the set for this Python,
    /// and the kernel-source members of every dsl-kernel-source wheel, unpacked.
    pub site: PathBuf,
    /// The inputs that went into `site`, in lock order.
    pub inputs: Vec<LockedInput>,
}

impl DslEnv {
    /// What the DSL outputs depend on besides the driver and the table.
    pub fn key(&self) -> serde_json::Value {
        serde_json::json!({
            "python": self.identity,
            "inputs": self.inputs.iter().map(|i| i.sha256.as_str()).collect::<Vec<_>>(),
        })
    }
}

/// `major.minor` of a full version (`3.11.7` -> `3.11`).
pub fn python_abi(version: &str) -> Result<String> {
    let mut parts = version.split('.');
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => Ok(format!("{a}.{b}")),
        _ => Err(GenError::refused(
            "read the Python version",
            format!("cannot read a Python version from {version:?}"),
        )),
    }
}

/// Finds the `--python` interpreter and checks the table pins a wheel set
/// for its version. `None` when the table has no DSL units.
pub fn probe_python(args: &BuildArgs, table: &ArtifactTable) -> Result<Option<Python>> {
    let Some(cfg) = table.dsl.as_ref().filter(|_| table.has_dsl_units()) else {
        return Ok(None);
    };
    let step = "find the Python interpreter for the CuTe DSL export (--python)";
    let probe = "import sys; print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])";
    let out = run(step, Command::new(&args.python).args(["-c", probe]))?;
    let mut lines = out.lines();
    let (exe, version) = match (lines.next(), lines.next()) {
        (Some(exe), Some(v)) => (PathBuf::from(exe.trim()), v.trim().to_string()),
        _ => {
            return Err(GenError::refused(
                step,
                format!("{} printed no version: {out:?}", args.python),
            ))
        }
    };
    let abi = python_abi(&version)?;
    if !cfg.pythons.contains(&abi) {
        return Err(GenError::refused(step, format!(
            "Python {version} ({}) has no pinned CuTe DSL wheel set; the table pins {:?}. \
             Pass --python with one of those, or add that version's wheels to generator/artifacts.json and run `gdn-gen lock`",
            exe.display(),
            cfg.pythons
        )));
    }
    Ok(Some(Python { exe, version, abi }))
}

/// Unpacks the DSL inputs of a build (its `dsl-runtime` and
/// `dsl-kernel-source` inputs, in lock order) into a private site directory
/// (once per content key). `None` without a DSL export (no interpreter).
pub fn prepare(
    args: &BuildArgs,
    table: &ArtifactTable,
    python: Option<&Python>,
    inputs: Vec<LockedInput>,
) -> Result<Option<DslEnv>> {
    let (Some(cfg), Some(py)) = (&table.dsl, python) else {
        return Ok(None);
    };
    let step = "prepare the CuTe DSL environment";
    let kernel_sources = inputs
        .iter()
        .filter(|i| i.role == InputRole::DslKernelSource)
        .count();
    // One or more (FlashInfer's and quack-kernels' Python kernels); each is
    // filtered by the whole `dsl.kernel_source_members` list.
    if kernel_sources == 0 {
        return Err(GenError::refused(
            step,
            "the lock has no dsl-kernel-source input; restore gdn-bundle.lock.json",
        ));
    }
    let key = Sha256Hex::of_bytes(
        serde_json::json!({
            "abi": py.abi,
            "inputs": inputs.iter().map(|i| i.sha256.as_str()).collect::<Vec<_>>(),
            "members": cfg.kernel_source_members,
        })
        .to_string()
        .as_bytes(),
    );
    let site = args.cache.join("dsl-site").join(&key.as_str()[..16]);
    // `.complete` holds the file name of the wheel the runtime library came
    // from (the manifest says so); empty or absent: unpack again.
    let complete = site.join(".complete");
    let runtime_wheel = match files::read_marker(step, &complete)? {
        Some(wheel) if !wheel.is_empty() => wheel,
        _ => {
            let wheel = unpack(args, cfg, &inputs, &site, &py.abi)?;
            std::fs::write(&complete, &wheel).map_err(|e| GenError::io(step, &complete, e))?;
            wheel
        }
    };
    let runtime = site.join(&cfg.runtime_library);
    if !runtime.is_file() {
        return Err(GenError::refused(
            step,
            format!(
                "the DSL wheels have no {} (dsl.runtime_library in the table)",
                cfg.runtime_library
            ),
        ));
    }
    Ok(Some(DslEnv {
        python: py.exe.clone(),
        identity: DslIdentity {
            python: py.version.clone(),
            python_abi: py.abi.clone(),
            runtime_wheel,
        },
        site,
        inputs,
    }))
}

/// Unpacks the wheel set into a fresh `site`; returns the file name of the
/// one wheel that holds the runtime library.
fn unpack(
    args: &BuildArgs,
    cfg: &gdn_lock::DslConfig,
    inputs: &[LockedInput],
    site: &Path,
    abi: &str,
) -> Result<String> {
    let _ = std::fs::remove_dir_all(site);
    let mut runtime_wheels = vec![];
    for input in inputs {
        let wheel = ensure_input(input, &args.cache, args.inputs_dir.as_deref(), args.offline)?;
        eprintln!("gdn-gen: unpacking {} for Python {abi}", input.filename);
        let has_runtime = std::cell::Cell::new(false);
        let n = if input.role == InputRole::DslKernelSource {
            let members = &cfg.kernel_source_members;
            extract_zip(&wheel, site, |name| {
                members.iter().any(|m| name.starts_with(m.as_str()))
            })?
        } else {
            extract_zip(&wheel, site, |name| {
                has_runtime.set(has_runtime.get() || name == cfg.runtime_library);
                true
            })?
        };
        if n == 0 {
            return Err(GenError::Input {
                filename: input.filename.clone(),
                path: Some(wheel),
                problem: "nothing was unpacked from it".into(),
                remedy: "check the table's dsl.kernel_source_members".into(),
            });
        }
        if has_runtime.get() {
            runtime_wheels.push(input.filename.clone());
        }
    }
    match <[String; 1]>::try_from(runtime_wheels) {
        Ok([wheel]) => Ok(wheel),
        Err(found) => Err(GenError::refused(
            "prepare the CuTe DSL environment",
            format!(
                "{} must come from exactly one wheel of the Python {abi} set; found in {found:?}",
                cfg.runtime_library
            ),
        )),
    }
}

/// The driver's command line for one unit, relative to the staging dir.
pub fn export_args(
    unit: &gdn_lock::Unit,
    driver: &str,
    site: &Path,
    out_dir: &Path,
) -> Vec<String> {
    let d = unit.dsl.as_ref().expect("a DSL unit");
    let mut args = vec![
        "-B".to_string(),
        "-s".to_string(),
        driver.to_string(),
        "--out".to_string(),
        out_dir.display().to_string(),
        "--kernel".to_string(),
        d.kernel.clone(),
        "--site-dir".to_string(),
        site.display().to_string(),
        "--flashinfer-root".to_string(),
        site.display().to_string(),
    ];
    if let Some(n) = d.sm_count {
        args.extend(["--sm-count".to_string(), n.to_string()]);
    }
    args
}

/// After an export: exactly `<variant>.{h,o,cubin}` for the table's variants
/// (and the driver's own manifest); anything else means the driver and the
/// table disagree.
pub fn check_outputs(unit: &gdn_lock::Unit, out_dir: &Path) -> Result<()> {
    let d = unit.dsl.as_ref().expect("a DSL unit");
    let mut expected: std::collections::BTreeSet<String> = d
        .variants
        .iter()
        .flat_map(|v| ["h", "o", "cubin"].map(|e| format!("{v}.{e}")))
        .collect();
    expected.insert(format!("{}.manifest.json", d.kernel));
    let found: std::collections::BTreeSet<String> = std::fs::read_dir(out_dir)
        .map_err(|e| GenError::io("list the DSL export's outputs", out_dir, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if found != expected {
        let missing: Vec<_> = expected.difference(&found).collect();
        let extra: Vec<_> = found.difference(&expected).collect();
        return Err(GenError::refused(
            format!("export DSL unit {}", unit.name),
            format!(
                "the export does not match the table's variants (missing {missing:?}, unexpected {extra:?}); \
                 update `dsl.variants` in generator/artifacts.json or the driver"
            ),
        ));
    }
    Ok(())
}

/// The hermetic command for a DSL step: cleared environment, nothing of the
/// caller's Python settings (PYTHONPATH, user site) reaches the export; the
/// driver then re-runs itself in a private HOME/TMPDIR/cwd.
pub fn command(env: &DslEnv, tmp: &Path) -> Command {
    let mut cmd = Command::new(&env.python);
    hermetic(&mut cmd, tmp);
    // The DSL wheels' native libraries (manylinux) need libstdc++; where the
    // system loader cannot find it (a Nix build sandbox), the caller names
    // its directory explicitly. Library search paths do not reach the output.
    if let Some(dirs) = std::env::var_os(DSL_LIBRARY_PATH_ENV) {
        cmd.env("LD_LIBRARY_PATH", dirs);
    }
    cmd
}

/// Environment variable with the library directories the DSL export may
/// load from (becomes `LD_LIBRARY_PATH` of the export only).
pub const DSL_LIBRARY_PATH_ENV: &str = "GDN_DSL_LIBRARY_PATH";
