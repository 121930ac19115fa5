//! gdn-gen end to end on a small repository of its own: a table with two
//! cubin units, an upstream "wheel" served by a file:// URL, and a fake nvcc
//! whose output is known (`FAKECUBIN <target>\n` + the source), so every
//! expected byte is computed here, independently of gdn-gen. Covers what a
//! real toolkit is not needed for: a poisoned unit cache, `lock` recording
//! only what it compiled itself, and `check` on a bundle with a FIFO.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gdn_lock::{Lock, Sha256Hex};

const TARGETS: [&str; 2] = ["sm_90a", "sm_80"];

struct FakeRepo {
    dir: tempfile::TempDir,
}

impl FakeRepo {
    fn new() -> FakeRepo {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("repo");
        for (path, text) in [
            ("src/k.cu", "__global__ void k() {}\n"),
            ("src/j.cu", "__global__ void j() {}\n"),
            ("src/abi.h", "#define FAKE_ABI 1\n"),
        ] {
            std::fs::create_dir_all(r.join(path).parent().unwrap()).unwrap();
            std::fs::write(r.join(path), text).unwrap();
        }
        // The upstream kernel-source wheel.
        let upstream = dir.path().join("upstream");
        std::fs::create_dir_all(&upstream).unwrap();
        let wheel = upstream.join("fake_kernels-1-py3-none-any.whl");
        let mut z = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
        z.start_file("fake/README", zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(b"upstream kernels\n").unwrap();
        z.finish().unwrap();
        let unit = |name: &str| {
            serde_json::json!({"name": name, "compiler": "nvcc", "output": "cubin",
                "source": format!("src/{name}.cu"), "targets": TARGETS, "flags": ["-O2"],
                "peak_memory_mib": 10, "why": "test unit"})
        };
        let table = serde_json::json!({
            "schema_version": 1, "abi_version": 1, "nvcc_version": "V13.0.88",
            "inputs": [{"name": "fake-kernels", "version": "1", "role": "kernel-source",
                        "filename": "fake_kernels-1-py3-none-any.whl",
                        "url": format!("file://{}", wheel.display())}],
            "kernel_source_members": ["fake/"], "patches": [],
            "sources": ["src/k.cu", "src/j.cu", "src/abi.h"], "abi_header": "src/abi.h",
            "toolkit_libraries": [],
            "geometry": {"target_arch": "sm_90a", "head_dim": 128, "qkv_dtype": "bf16",
                         "state_dtype": "f32", "gva_ratios": [1], "specializations": []},
            "units": [unit("k"), unit("j")],
        });
        std::fs::create_dir_all(r.join("generator")).unwrap();
        std::fs::write(
            r.join("generator/artifacts.json"),
            serde_json::to_string_pretty(&table).unwrap(),
        )
        .unwrap();
        // The toolkit: nvcc writes a known function of its input.
        let bin = dir.path().join("toolkit/bin");
        std::fs::create_dir_all(&bin).unwrap();
        script(
            &bin.join("nvcc"),
            "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo 'Cuda compilation tools, release 13.0, V13.0.88'\n  echo 'Build fake'\n  exit 0\nfi\n\
             out=; src=; target=\nwhile [ $# -gt 0 ]; do\n  case \"$1\" in\n    -o) out=$2; shift ;;\n    -cubin) src=$2; shift ;;\n    -gencode=*) target=${1##*code=} ;;\n  esac\n  shift\ndone\n\
             { printf 'FAKECUBIN %s\\n' \"$target\"; cat \"$src\"; } > \"$out\"\n",
        );
        script(
            &dir.path().join("toolkit/c++"),
            "#!/bin/sh\necho 'fake-c++ 1.0'\n",
        );
        FakeRepo { dir }
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }
    fn bundle(&self) -> PathBuf {
        self.dir.path().join("out/bundle")
    }
    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// gdn-gen `command` with the fake toolkit, the cache and the bundle.
    fn command(&self, command: &str) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gdn-gen"));
        cmd.current_dir(self.repo()).arg(command);
        if command == "check" {
            cmd.arg("--bundle").arg(self.bundle());
        } else {
            cmd.arg("--toolkit-root")
                .arg(self.dir.path().join("toolkit"))
                .arg("--host-cxx")
                .arg(self.dir.path().join("toolkit/c++"))
                .arg("--cache")
                .arg(self.cache())
                .arg("--out")
                .arg(self.bundle());
        }
        cmd
    }

    /// Runs gdn-gen `command` with the fake toolkit; (success, stderr).
    fn gen(&self, command: &str) -> (bool, String) {
        let out = self.command(command).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), stderr)
    }

    /// [`FakeRepo::gen`], failing the test if gdn-gen has not finished
    /// within `secs` (a reader blocked on a FIFO never does); the process is
    /// killed then.
    fn gen_within(&self, command: &str, secs: u64) -> (bool, String) {
        let mut child = self
            .command(command)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("gdn-gen {command} did not finish within {secs} s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        (status.success(), stderr)
    }

    fn gen_ok(&self, command: &str) -> String {
        let (ok, err) = self.gen(command);
        assert!(ok, "gdn-gen {command} failed:\n{err}");
        err
    }

    /// What the fake nvcc makes of `unit` for `target`: the reference bytes.
    fn expected_cubin(&self, unit: &str, target: &str) -> Vec<u8> {
        let mut b = format!("FAKECUBIN {target}\n").into_bytes();
        b.extend(std::fs::read(self.repo().join(format!("src/{unit}.cu"))).unwrap());
        b
    }

    fn lock(&self) -> Lock {
        Lock::load(&self.repo().join(gdn_lock::LOCK_FILE)).unwrap()
    }

    /// The one cache entry of `unit` under units/.
    fn unit_cache_entry(&self, unit: &str) -> PathBuf {
        let entries: Vec<PathBuf> = std::fs::read_dir(self.cache().join("units"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{unit}-"))
            })
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    }

    /// Flips a byte of the cached cubin of `unit` for `target`.
    fn poison(&self, unit: &str, target: &str) -> PathBuf {
        let p = self
            .unit_cache_entry(unit)
            .join(format!("{unit}.{target}.cubin"));
        let mut b = std::fs::read(&p).unwrap();
        b[3] ^= 0x20;
        std::fs::write(&p, b).unwrap();
        p
    }
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

fn script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A fake repository with a lock written by `gdn-gen lock` and its bundle,
/// checked against the reference bytes.
fn locked_repo() -> FakeRepo {
    let r = FakeRepo::new();
    r.gen_ok("lock");
    let lock = r.lock();
    for unit in ["k", "j"] {
        for t in TARGETS {
            let path = format!("cubin/{unit}.{t}.cubin");
            assert_eq!(
                lock.device_artifacts[&path].sha256,
                Sha256Hex::of_bytes(&r.expected_cubin(unit, t)),
                "{path}"
            );
            assert_eq!(
                std::fs::read(r.bundle().join(&path)).unwrap(),
                r.expected_cubin(unit, t)
            );
        }
    }
    r
}

#[test]
fn poisoned_unit_cache_is_named_evicted_and_recompiled_once() {
    let r = locked_repo();
    r.poison("k", "sm_80");
    std::fs::remove_dir_all(r.bundle()).unwrap();
    let err = r.gen_ok("build");
    let entry = r.unit_cache_entry("k");
    // The message names the cache entry and says what was done.
    assert!(
        err.contains(&r.cache().join("units").display().to_string()) && err.contains("evicted"),
        "{err}"
    );
    // Only the poisoned unit was compiled again.
    assert!(err.contains("compiling k ("), "{err}");
    assert!(!err.contains("compiling j ("), "{err}");
    for t in TARGETS {
        assert_eq!(
            std::fs::read(r.bundle().join(format!("cubin/k.{t}.cubin"))).unwrap(),
            r.expected_cubin("k", t)
        );
        assert_eq!(
            std::fs::read(entry.join(format!("k.{t}.cubin"))).unwrap(),
            r.expected_cubin("k", t),
            "the cache entry holds the recompiled bytes"
        );
    }
    r.gen_ok("check");
}

#[test]
fn lock_records_what_it_compiled_not_what_the_unit_cache_holds() {
    let r = locked_repo();
    let before = std::fs::read(r.repo().join(gdn_lock::LOCK_FILE)).unwrap();
    r.poison("j", "sm_90a");
    r.gen_ok("lock");
    assert_eq!(
        r.lock().device_artifacts["cubin/j.sm_90a.cubin"].sha256,
        Sha256Hex::of_bytes(&r.expected_cubin("j", "sm_90a"))
    );
    assert_eq!(
        std::fs::read(r.repo().join(gdn_lock::LOCK_FILE)).unwrap(),
        before,
        "the same inputs give the same lock"
    );
    r.gen_ok("check");
}

#[test]
fn lock_reuses_only_units_of_unchanged_inputs_whose_bytes_it_records() {
    let r = locked_repo();
    // Nothing changed: the lock is rewritten from the cache, the same bytes.
    let before = std::fs::read(r.repo().join(gdn_lock::LOCK_FILE)).unwrap();
    let err = r.gen_ok("lock");
    assert!(
        !err.contains("compiling k (") && !err.contains("compiling j ("),
        "{err}"
    );
    assert!(err.contains("reusing 2 unit(s)"), "{err}");
    assert_eq!(
        std::fs::read(r.repo().join(gdn_lock::LOCK_FILE)).unwrap(),
        before
    );
    // An edit of j's source: j is compiled, k is taken from the cache.
    std::fs::write(
        r.repo().join("src/j.cu"),
        "__global__ void j() { /* v2 */ }\n",
    )
    .unwrap();
    let err = r.gen_ok("lock");
    assert!(err.contains("compiling j ("), "{err}");
    assert!(!err.contains("compiling k ("), "{err}");
    assert!(
        err.contains("reusing 1 unit(s)") && err.contains(": k"),
        "{err}"
    );
    let lock = r.lock();
    for (unit, t) in [
        ("j", "sm_90a"),
        ("j", "sm_80"),
        ("k", "sm_90a"),
        ("k", "sm_80"),
    ] {
        assert_eq!(
            lock.device_artifacts[&format!("cubin/{unit}.{t}.cubin")].sha256,
            Sha256Hex::of_bytes(&r.expected_cubin(unit, t)),
            "{unit} {t}"
        );
    }
    // A cached entry of unchanged inputs whose bytes the lock does not
    // record (poisoned) is compiled afresh, not recorded.
    r.poison("k", "sm_80");
    let err = r.gen_ok("lock");
    assert!(err.contains("compiling k ("), "{err}");
    assert_eq!(
        r.lock().device_artifacts["cubin/k.sm_80.cubin"].sha256,
        Sha256Hex::of_bytes(&r.expected_cubin("k", "sm_80"))
    );
    r.gen_ok("check");
}

#[cfg(unix)]
#[test]
fn check_refuses_a_fifo_in_the_bundle_without_blocking_and_advises_no_relock() {
    let r = locked_repo();
    let rel = "cubin/k.sm_90a.cubin";
    std::fs::remove_file(r.bundle().join(rel)).unwrap();
    mkfifo(&r.bundle().join(rel));
    let (ok, err) = r.gen_within("check", 30);
    assert!(!ok);
    assert!(
        err.contains(rel) && err.contains("not a regular file"),
        "{err}"
    );

    // Other bytes than the lock's (manifest made to agree): rebuild or find out why.
    std::fs::remove_file(r.bundle().join(rel)).unwrap();
    let mut b = r.expected_cubin("k", "sm_90a");
    b.push(0);
    std::fs::write(r.bundle().join(rel), &b).unwrap();
    let mut m = gdn_lock::Manifest::load(&r.bundle().join("manifest.json")).unwrap();
    m.artifacts.get_mut(rel).unwrap().digests = gdn_lock::Digests::of_bytes(&b);
    std::fs::write(
        r.bundle().join("manifest.json"),
        gdn_lock::to_canonical_json(&m),
    )
    .unwrap();
    let (ok, err) = r.gen("check");
    assert!(!ok);
    assert!(
        err.contains(rel) && err.contains("gdn-gen -- verify") && !err.contains("gdn-gen -- lock"),
        "{err}"
    );
}

#[test]
fn plan_prints_what_build_will_do_and_runs_nothing() {
    let r = locked_repo();
    let out = Command::new(env!("CARGO_BIN_EXE_gdn-gen"))
        .current_dir(r.repo())
        .args(["plan", "--toolkit-root"])
        .arg(r.dir.path().join("toolkit"))
        .arg("--cache")
        .arg(r.cache())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("variant: cuda-13.0 (nvcc V13.0.88, recorded in the lock)"),
        "{text}"
    );
    assert!(
        text.contains("fetch fake_kernels-1-py3-none-any.whl"),
        "{text}"
    );
    for unit in ["k", "j"] {
        for t in TARGETS {
            assert!(
                text.contains(&format!(
                    "-cubin src/{unit}.cu -o <unit-cache>/{unit}.{t}.cubin"
                )),
                "{unit} {t}: {text}"
            );
        }
    }
    assert!(
        text.contains(&format!(
            "unit cache: {}",
            r.cache().canonicalize().unwrap().join("units").display()
        )),
        "{text}"
    );
}

#[test]
fn errors_name_the_step_and_the_file() {
    let r = locked_repo();
    // A source gone: the step and the file are named.
    std::fs::remove_file(r.repo().join("src/j.cu")).unwrap();
    let (ok, err) = r.gen("build");
    assert!(!ok);
    assert!(
        err.contains("check our sources against the lock") && err.contains("src/j.cu"),
        "{err}"
    );
    // A compile that fails: the step, the command line and the compiler's words.
    std::fs::write(r.repo().join("src/j.cu"), "__global__ void j() {}\n").unwrap();
    script(
        &r.dir.path().join("toolkit/bin/nvcc"),
        "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo 'Cuda compilation tools, release 13.0, V13.0.88'\n  echo 'Build fake'\n  exit 0\nfi\necho 'fake nvcc: refusing' >&2\nexit 3\n",
    );
    // Neither the unit cache nor an up-to-date bundle may spare the compile.
    std::fs::remove_dir_all(r.cache().join("units")).unwrap();
    std::fs::remove_dir_all(r.bundle()).unwrap();
    let (ok, err) = r.gen("build");
    assert!(!ok, "{err}");
    let named = TARGETS
        .iter()
        .flat_map(|t| ["k", "j"].map(|u| format!("compile {u} ({t}) failed (exit status: 3)")))
        .any(|step| err.contains(&step));
    assert!(named && err.contains("fake nvcc: refusing"), "{err}");
}

#[test]
fn lock_follows_an_nvcc_bump_in_the_table() {
    let r = locked_repo();
    let bump = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("V13.0.88"), "{}", path.display());
        std::fs::write(path, text.replace("V13.0.88", "V13.0.99")).unwrap();
    };
    bump(&r.repo().join("generator/artifacts.json"));
    bump(&r.dir.path().join("toolkit/bin/nvcc"));
    // The old lock is stale (the table changed): build refuses, lock records.
    let (ok, err) = r.gen("build");
    assert!(!ok && err.contains("table_sha256"), "{err}");
    r.gen_ok("lock");
    let lock = r.lock();
    assert_eq!(lock.nvcc_version, "V13.0.99");
    assert_eq!(lock.variants["cuda-13.0"].nvcc_version, "V13.0.99");
    assert_eq!(lock.variants["cuda-13.0"].status, "recorded");
    r.gen_ok("check");
    let err = r.gen_ok("build");
    assert!(err.contains("up to date"), "{err}");
}

#[test]
fn a_compiler_that_gives_other_bytes_fails_the_build_after_one_recompile_and_writes_nothing() {
    let r = locked_repo();
    r.poison("k", "sm_90a");
    // From now on the "compiler" makes other bytes than the lock's.
    let nvcc = r.dir.path().join("toolkit/bin/nvcc");
    let text = std::fs::read_to_string(&nvcc).unwrap();
    std::fs::write(&nvcc, text.replace("FAKECUBIN", "OTHERCUBIN")).unwrap();
    std::fs::remove_dir_all(r.bundle()).unwrap();
    let (ok, err) = r.gen("build");
    assert!(!ok);
    assert!(
        err.contains("evicted"),
        "the poisoned entry is evicted first: {err}"
    );
    assert!(
        err.contains("does not match the lock")
            && err.contains("cubin/k.sm_90a.cubin")
            && err.contains("the unit cache is not the cause")
            && err.contains("/toolkit")
            && !err.contains("gdn-gen -- lock"),
        "{err}"
    );
    assert!(!r.bundle().exists(), "no bundle may be installed");
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_link_in_the_unit_cache_is_named_not_read() {
    let r = locked_repo();
    let cubin = r.unit_cache_entry("k").join("k.sm_80.cubin");
    std::fs::remove_file(&cubin).unwrap();
    mkfifo(&cubin);
    std::fs::remove_dir_all(r.bundle()).unwrap();
    let (ok, err) = r.gen_within("build", 30);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "{} is a FIFO, not a regular file",
            cubin.display()
        )),
        "{err}"
    );
    // A link, even to the right bytes: the cache holds only what gdn-gen
    // wrote, so someone else put it there.
    std::fs::remove_file(&cubin).unwrap();
    let elsewhere = r.dir.path().join("elsewhere.cubin");
    std::fs::write(&elsewhere, r.expected_cubin("k", "sm_80")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &cubin).unwrap();
    let (ok, err) = r.gen_within("build", 30);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "{} is a symbolic link, not a regular file",
            cubin.display()
        )),
        "{err}"
    );
    assert!(!r.bundle().exists(), "no bundle may be installed");
}

#[cfg(unix)]
#[test]
fn a_fifo_as_the_stamp_is_named_not_read() {
    let r = locked_repo();
    let stamp = r.dir.path().join("out/bundle.stamp");
    std::fs::remove_file(&stamp).unwrap();
    mkfifo(&stamp);
    let (ok, err) = r.gen_within("build", 30);
    assert!(!ok);
    assert!(
        err.contains("read the stamp") && err.contains("is a FIFO, not a regular file"),
        "{err}"
    );
}

#[test]
fn check_refuses_a_huge_sparse_cubin_by_its_size_unread() {
    let r = locked_repo();
    let rel = "cubin/k.sm_90a.cubin";
    let size = r.expected_cubin("k", "sm_90a").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(r.bundle().join(rel))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let (ok, err) = r.gen_within("check", 30);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "artifact {rel} size: expected {size}, found 1099511627776"
        )),
        "{err}"
    );
}
