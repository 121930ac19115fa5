//! The CUDA toolkit: the pinned PyPI wheels extracted into the cache, or an
//! existing toolkit root (Nix, NVIDIA's installer) of the same nvcc version.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use gdn_lock::{InputRole, Sha256Hex, ToolchainIdentity};

use crate::error::{GenError, Result};
use crate::fetch::ensure_input;
use crate::plan::Plan;
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

/// The plan's toolkit: `--toolkit-root` or the pinned wheels, with the nvcc
/// of the plan's variant (the exact version, `V13.0.88`, or for an
/// unrecorded variant a release pattern ending in `.x`, `V12.8.x`).
pub fn resolve(plan: &Plan) -> Result<Toolkit> {
    let args = &plan.args;
    let expected_nvcc = plan.variant.nvcc_version.as_str();
    let (root, kind) = match &args.toolkit_root {
        Some(root) => (root.clone(), "external-root"),
        None => (extract_pinned_wheels(plan)?, "pypi-wheels"),
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
            toolkit: kind.to_string(),
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

/// Extracts the plan's toolchain wheels into a directory named by their hashes, once.
fn extract_pinned_wheels(plan: &Plan) -> Result<PathBuf> {
    let args = &plan.args;
    let wheels: Vec<_> = plan.inputs_with(&[InputRole::Toolchain]).collect();
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
    if dir.join(".complete").exists() {
        return Ok(root);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for wheel in &wheels {
        let path = ensure_input(wheel, &args.cache, args.inputs_dir.as_deref(), args.offline)?;
        eprintln!("gdn-gen: extracting {}", wheel.filename);
        extract_zip(&path, &dir, |_| true)?;
    }
    let done = dir.join(".complete");
    std::fs::write(&done, b"").map_err(|e| GenError::io("extract the toolkit", &done, e))?;
    Ok(root)
}

/// Extracts the members of a zip (wheel) accepted by `keep`, refusing any
/// member whose name would land outside `dest`; keeps the executable bit.
pub fn extract_zip(zip_path: &Path, dest: &Path, keep: impl Fn(&str) -> bool) -> Result<usize> {
    let err = |e: &dyn std::fmt::Display| GenError::Input {
        filename: zip_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: Some(zip_path.to_owned()),
        problem: format!("cannot be extracted: {e}"),
        remedy: "remove it from the cache so it is fetched again".into(),
    };
    let file = std::fs::File::open(zip_path).map_err(|e| err(&e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| err(&e))?;
    let mut count = 0;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| err(&e))?;
        if entry.is_dir() || !keep(entry.name()) {
            continue;
        }
        let rel = entry
            .enclosed_name()
            .ok_or_else(|| err(&format!("member {:?} escapes the archive", entry.name())))?;
        let out = dest.join(rel);
        std::fs::create_dir_all(out.parent().expect("member has a parent")).map_err(|e| err(&e))?;
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut bytes).map_err(|e| err(&e))?;
        std::fs::write(&out, &bytes).map_err(|e| err(&e))?;
        #[cfg(unix)]
        if entry.unix_mode().is_some_and(|m| m & 0o111 != 0) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| err(&e))?;
        }
        count += 1;
    }
    Ok(count)
}

/// The bytes of member `name` of the zip at `zip_path`, `None` if it has none.
pub fn zip_member(zip_path: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let err = |e: &dyn std::fmt::Display| GenError::Input {
        filename: zip_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: Some(zip_path.to_owned()),
        problem: format!("cannot read its member {name}: {e}"),
        remedy: "remove it from the cache so it is fetched again".into(),
    };
    let file = std::fs::File::open(zip_path).map_err(|e| err(&e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| err(&e))?;
    let mut entry = match archive.by_name(name) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(err(&e)),
    };
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut bytes).map_err(|e| err(&e))?;
    Ok(Some(bytes))
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

    #[test]
    fn zip_members_outside_dest_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let zpath = dir.path().join("evil.zip");
        {
            let mut w = zip::ZipWriter::new(std::fs::File::create(&zpath).unwrap());
            w.start_file("../escape.txt", zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut w, b"x").unwrap();
            w.finish().unwrap();
        }
        let err = extract_zip(&zpath, &dir.path().join("out"), |_| true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("escapes"), "{err}");
        assert!(!dir.path().join("escape.txt").exists());
    }
}
