//! Bad inputs to `gdn-gen build`, end to end through the binary: a toolkit of
//! another nvcc version, and a compile that fails. Each must stop with an
//! error that says what is wrong and leave no partial bundle behind (an
//! existing bundle stays as it was).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// A toolkit root whose bin/nvcc prints `version` and fails every compile.
fn fake_toolkit(dir: &Path, version: &str) -> PathBuf {
    let root = dir.join("toolkit");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo 'Cuda compilation tools, release 0.0, {version}'\n  echo 'Build fake'\n  exit 0\nfi\necho 'fake nvcc: compile refused' >&2\nexit 2\n"
    );
    let nvcc = root.join("bin/nvcc");
    std::fs::write(&nvcc, script).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    root
}

fn gen_build(dir: &Path, toolkit: &Path, inputs: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gdn-gen"))
        .current_dir(repo())
        .args(["build", "--offline", "--lock", "gdn-bundle.lock.json"])
        .arg("--toolkit-root")
        .arg(toolkit)
        .arg("--inputs-dir")
        .arg(inputs)
        .arg("--cache")
        .arg(dir.join("cache"))
        .arg("--out")
        .arg(dir.join("out/bundle"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn toolkit_of_another_nvcc_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tk = fake_toolkit(dir.path(), "V12.4.131");
    let (ok, err) = gen_build(dir.path(), &tk, dir.path());
    assert!(!ok);
    assert!(
        err.contains("nvcc is V12.4.131") && err.contains("V13.0.88"),
        "{err}"
    );
    assert!(
        !dir.path().join("out/bundle").exists(),
        "no bundle may be written"
    );
}

#[test]
fn failed_compile_leaves_no_partial_bundle_and_keeps_the_old_one() {
    let downloads = repo().join("target/gdn-cache/downloads");
    let wheel = "flashinfer_python-0.6.13-py3-none-any.whl";
    assert!(
        downloads.join(wheel).exists(),
        "{} is missing: run `cargo run --release -p gdn-gen -- build` first",
        downloads.join(wheel).display()
    );
    let dir = tempfile::tempdir().unwrap();
    let tk = fake_toolkit(dir.path(), "V13.0.88");
    let old = dir.path().join("out/bundle");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("sentinel"), b"previous bundle").unwrap();
    let (ok, err) = gen_build(dir.path(), &tk, &downloads);
    assert!(!ok);
    assert!(
        err.contains("compile") && err.contains("fake nvcc: compile refused"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(old.join("sentinel")).unwrap(),
        b"previous bundle"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("bundle")],
        "temporary bundle dirs left behind"
    );
}
