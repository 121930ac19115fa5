//! The CUDA toolkit: the pinned PyPI wheels extracted into the cache, or an
//! existing toolkit root (Nix, NVIDIA's installer) of the same nvcc version.

use std::path::PathBuf;
use std::process::Command;

use gdn_lock::{LockedInput, Sha256Hex, ToolchainIdentity, ToolkitKind};

use crate::archive::extract_zip;
use crate::cli::BuildArgs;
use crate::error::{GenError, Result};
use crate::fetch::ensure_input;
use crate::process::run;

pub struct Toolkit {
    pub root: PathBuf,
    pub host_cxx: String,
    pub identity: ToolchainIdentity,
}

impl Toolkit {
    pub fn nvcc(&self) -> PathBuf {
        self.root.join("bin/nvcc")
    }

    /// Finds a library such as `libcudart_static.a` under lib/ or lib64/.
    pub fn library(&self, name: &str) -> Result<PathBuf> {
        ["lib", "lib64", "lib/x64"]
            .iter()
            .map(|d| self.root.join(d).join(name))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                GenError::refused(
                    "find a toolkit library",
                    format!(
                        "{name} not found under {}/lib or lib64",
                        self.root.display()
                    ),
                )
            })
    }
}

/// Which toolkit a build with `args` uses: `--toolkit-root`, or the pinned wheels.
pub fn kind(args: &BuildArgs) -> ToolkitKind {
    match args.toolkit_root {
        Some(_) => ToolkitKind::ExternalRoot,
        None => ToolkitKind::PypiWheels,
    }
}

/// The toolkit: `--toolkit-root` or the pinned `wheels` (the plan's
/// toolchain inputs), with the nvcc `expected_nvcc` (the exact version,
/// `V13.0.88`, or for an unrecorded variant a release pattern ending in
/// `.x`, `V12.8.x`).
pub fn resolve(args: &BuildArgs, expected_nvcc: &str, wheels: &[&LockedInput]) -> Result<Toolkit> {
    let root = match &args.toolkit_root {
        Some(root) => root.clone(),
        None => extract_pinned_wheels(args, wheels)?,
    };
    let step = "check the toolkit";
    let nvcc = root.join("bin/nvcc");
    if !nvcc.is_file() {
        return Err(GenError::refused(
            step,
            format!("toolkit root {}: bin/nvcc does not exist", root.display()),
        ));
    }
    let version = run("nvcc --version", Command::new(&nvcc).arg("--version"))?;
    let (nvcc_version, nvcc_build) = parse_nvcc_version(&version)?;
    if !nvcc_matches(&nvcc_version, expected_nvcc) {
        return Err(GenError::refused(step, format!(
            "toolkit {}: nvcc is {nvcc_version}, the lock pins {expected_nvcc}; use a toolkit of that version \
             or drop --toolkit-root to use the pinned wheels",
            root.display(),
        )));
    }
    let host_cxx = args
        .host_cxx
        .clone()
        .or_else(|| std::env::var("CXX").ok())
        .unwrap_or_else(|| "g++".to_string());
    let cxx_version = run(
        "host compiler --version",
        Command::new(&host_cxx).arg("--version"),
    )?;
    let host_compiler = cxx_version
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(Toolkit {
        root,
        host_cxx,
        identity: ToolchainIdentity {
            nvcc_version,
            nvcc_build,
            toolkit: kind(args),
            host_compiler,
        },
    })
}

/// Exact match, or a `V12.8.x`-style pattern for unrecorded variants.
pub fn nvcc_matches(actual: &str, expected: &str) -> bool {
    match expected.strip_suffix('x') {
        Some(prefix) => actual.starts_with(prefix),
        None => actual == expected,
    }
}

/// `Cuda compilation tools, release 13.0, V13.0.88` and `Build cuda_13.0.r13.0/compiler.36424714_0`.
pub fn parse_nvcc_version(text: &str) -> Result<(String, String)> {
    let release = text
        .lines()
        .find(|l| l.contains("Cuda compilation tools"))
        .and_then(|l| l.rsplit(", ").next())
        .map(|s| s.trim().to_string());
    let build = text
        .lines()
        .find(|l| l.starts_with("Build "))
        .map(|l| l.trim().to_string());
    match (release, build) {
        (Some(r), Some(b)) => Ok((r, b)),
        _ => Err(GenError::refused(
            "read the nvcc version",
            format!("cannot parse `nvcc --version` output:\n{text}"),
        )),
    }
}

/// Extracts the toolchain wheels into a directory named by their hashes, once.
fn extract_pinned_wheels(args: &BuildArgs, wheels: &[&LockedInput]) -> Result<PathBuf> {
    let key = Sha256Hex::of_bytes(
        wheels
            .iter()
            .map(|w| w.sha256.as_str())
            .collect::<Vec<_>>()
            .join(",")
            .as_bytes(),
    );
    let dir = args.cache.join("toolkit").join(&key.as_str()[..16]);
    let root = dir.join("nvidia/cu13");
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(root);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for wheel in wheels {
        let path = ensure_input(wheel, &args.cache, args.inputs_dir.as_deref(), args.offline)?;
        eprintln!("gdn-gen: extracting {}", wheel.filename);
        extract_zip(&path, &dir, |_| true)?;
    }
    std::fs::write(&done, b"").map_err(|e| GenError::io("extract the toolkit", &done, e))?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvcc_13_0_88() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n\
                    Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n\
                    Build cuda_13.0.r13.0/compiler.36424714_0\n";
        let (v, b) = parse_nvcc_version(text).unwrap();
        assert_eq!(v, "V13.0.88");
        assert_eq!(b, "Build cuda_13.0.r13.0/compiler.36424714_0");
    }

    #[test]
    fn nvcc_version_matching() {
        assert!(nvcc_matches("V13.0.88", "V13.0.88"));
        assert!(!nvcc_matches("V13.0.48", "V13.0.88"));
        assert!(!nvcc_matches("V13.0.880", "V13.0.88"));
        assert!(nvcc_matches("V12.8.93", "V12.8.x"));
        assert!(!nvcc_matches("V12.9.41", "V12.8.x"));
    }

    #[test]
    fn unparsable_version_is_an_error() {
        assert!(parse_nvcc_version("clang version 17").is_err());
    }
}
