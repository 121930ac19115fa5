//! The tamper suite: the real bundle built by `gdn-gen build` (the README's
//! test command builds it first), copied and damaged in every way a bundle
//! can go wrong, must be refused with an error that names the artifact.

use std::path::{Path, PathBuf};

use gdn_lock::{
    check_lock_matches_table, to_canonical_json, verify_bundle, ArtifactTable, Digests, Error,
    HostPolicy, InputRole, Lock, Manifest, Sha256Hex, ToolkitKind, UnitOutput, LOCK_FILE,
    MANIFEST_FILE, TABLE_FILE,
};

const GVA: &str = "cubin/flashinfer_sm90_gva.sm_90a.cubin";
const MHA: &str = "cubin/flashinfer_sm90_mha.sm_90a.cubin";
const DSL_RUNTIME: &str = "lib/libcuda_dialect_runtime_static.a";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn table_and_lock() -> (ArtifactTable, Lock) {
    let r = repo();
    (
        ArtifactTable::load(&r.join(TABLE_FILE)).unwrap(),
        Lock::load(&r.join(LOCK_FILE)).unwrap(),
    )
}

fn real_bundle() -> PathBuf {
    // A relative GDN_BUNDLE_DIR means the workspace root's relative path, as for build.rs.
    let p = std::env::var_os("GDN_BUNDLE_DIR")
        .map(|p| repo().join(p))
        .unwrap_or_else(|| repo().join("target/gdn-bundle"));
    assert!(
        p.join(MANIFEST_FILE).exists(),
        "no bundle at {}: run `cargo run --release -p gdn-gen -- build` first",
        p.display()
    );
    p
}

/// A private copy of the real bundle.
fn copy() -> tempfile::TempDir {
    fn cp(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                cp(&e.path(), &to.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    cp(&real_bundle(), dir.path());
    dir
}

fn manifest(dir: &Path) -> Manifest {
    Manifest::load(&dir.join(MANIFEST_FILE)).unwrap()
}

fn save(dir: &Path, m: &Manifest) {
    std::fs::write(dir.join(MANIFEST_FILE), to_canonical_json(m)).unwrap();
}

/// Rewrites the manifest entry of `rel` to match the file, as a careful attacker would.
fn rehash(dir: &Path, rel: &str) {
    let mut m = manifest(dir);
    m.artifacts.get_mut(rel).unwrap().digests = Digests::of_file(&dir.join(rel)).unwrap();
    save(dir, &m);
}

fn refused(dir: &Path) -> String {
    let (t, l) = table_and_lock();
    // Mapped first: a wrongly accepted bundle's Debug holds every byte of it.
    let err = verify_bundle(dir, &t, &l, HostPolicy::Locked)
        .map(|_| ())
        .expect_err("a tampered bundle must be refused");
    err.to_string()
}

#[test]
fn untampered_copy_verifies() {
    let d = copy();
    let (t, l) = table_and_lock();
    let v = verify_bundle(d.path(), &t, &l, HostPolicy::Locked).unwrap();
    // Cubins, the host objects (one per host-object unit: 4 FlashInfer, one
    // of them the value-split kernel, the three C ABI launchers: GDN, the
    // CuTe DSL GDN kernels, the SwiGLU GEMM), the ABI
    // header, cudart, the DSL objects/headers and the DSL runtime.
    let host_objects = t
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
        .count();
    assert_eq!(host_objects, 7);
    assert_eq!(
        v.manifest.artifacts.len(),
        std::fs::read_dir(d.path().join("cubin")).unwrap().count()
            + host_objects
            + 2
            + t.dsl_artifact_paths().len()
            + 1
    );
    assert_eq!(t.dsl_runtime_path().as_deref(), Some(DSL_RUNTIME));
}

#[test]
fn one_byte_flipped() {
    let d = copy();
    let p = d.path().join(GVA);
    let mut b = std::fs::read(&p).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(&p, b).unwrap();
    let e = refused(d.path());
    assert!(e.contains(GVA) && e.contains("sha256"), "{e}");
}

#[test]
fn one_byte_appended() {
    let d = copy();
    let p = d.path().join(MHA);
    let mut b = std::fs::read(&p).unwrap();
    b.push(0);
    std::fs::write(&p, b).unwrap();
    let e = refused(d.path());
    assert!(e.contains(MHA) && e.contains("size"), "{e}");
}

#[test]
fn truncated_artifact() {
    let d = copy();
    let p = d.path().join("obj/gdn_abi.o");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    let e = refused(d.path());
    assert!(e.contains("obj/gdn_abi.o") && e.contains("size"), "{e}");
}

#[test]
fn artifacts_swapped_even_with_a_consistent_manifest() {
    let d = copy();
    let (a, b) = (d.path().join(GVA), d.path().join(MHA));
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    std::fs::write(&a, bb).unwrap();
    std::fs::write(&b, ba).unwrap();
    rehash(d.path(), GVA);
    rehash(d.path(), MHA);
    let e = refused(d.path());
    assert!(
        e.contains("against the lock") && (e.contains(GVA) || e.contains(MHA)),
        "{e}"
    );
}

#[test]
fn wrong_abi_version() {
    let d = copy();
    let mut m = manifest(d.path());
    m.abi_version += 1;
    save(d.path(), &m);
    assert!(refused(d.path()).contains("abi_version"));
}

#[test]
fn wrong_arch() {
    let d = copy();
    let mut m = manifest(d.path());
    m.geometry.target_arch = "sm_100a".into();
    save(d.path(), &m);
    let e = refused(d.path());
    assert!(e.contains("geometry") && e.contains("sm_100a"), "{e}");
}

#[test]
fn wrong_geometry() {
    let d = copy();
    let mut m = manifest(d.path());
    m.geometry.gva_ratios.push(4);
    save(d.path(), &m);
    assert!(refused(d.path()).contains("geometry"));
    let d = copy();
    let mut m = manifest(d.path());
    m.geometry.head_dim = 256;
    save(d.path(), &m);
    assert!(refused(d.path()).contains("256"));
}

#[test]
fn manifest_path_escaping_the_bundle() {
    let d = copy();
    let mut m = manifest(d.path());
    let mut art = m.artifacts[GVA].clone();
    art.digests = Digests::of_bytes(b"outside");
    m.artifacts
        .insert("../outside-gdn-test".into(), art.clone());
    save(d.path(), &m);
    let e = refused(d.path());
    assert!(e.contains("..") && e.contains("escapes"), "{e}");
    let mut m = manifest(d.path());
    m.artifacts.remove("../outside-gdn-test");
    m.artifacts.insert("/etc/passwd".into(), art);
    save(d.path(), &m);
    assert!(refused(d.path()).contains("absolute"));
}

#[cfg(unix)]
#[test]
fn symlink_out_of_the_bundle_even_to_identical_bytes() {
    let d = copy();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("same.cubin");
    std::fs::copy(d.path().join(GVA), &target).unwrap();
    std::fs::remove_file(d.path().join(GVA)).unwrap();
    std::os::unix::fs::symlink(&target, d.path().join(GVA)).unwrap();
    let e = refused(d.path());
    assert!(e.contains("symbolic link"), "{e}");
    // A linked directory is refused too.
    let d = copy();
    std::fs::rename(d.path().join("cubin"), outside.path().join("cubin")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("cubin"), d.path().join("cubin")).unwrap();
    assert!(refused(d.path()).contains("symbolic link"));
}

#[test]
fn unlisted_extra_file() {
    let d = copy();
    std::fs::write(d.path().join("cubin/extra.cubin"), b"\x7fELF").unwrap();
    let e = refused(d.path());
    assert!(
        e.contains("cubin/extra.cubin") && e.contains("not listed"),
        "{e}"
    );
}

#[test]
fn missing_artifact() {
    let d = copy();
    std::fs::remove_file(d.path().join("lib/libcudart_static.a")).unwrap();
    assert!(refused(d.path()).contains("libcudart_static.a"));
}

#[test]
fn host_object_embedding_other_device_code() {
    // Damage the cubin copy inside the host object and fix up the manifest:
    // the object no longer carries the locked device code.
    let d = copy();
    let obj = d.path().join("obj/flashinfer_sm90_gva.o");
    let cubin = std::fs::read(d.path().join(GVA)).unwrap();
    let mut b = std::fs::read(&obj).unwrap();
    let at = b
        .windows(cubin.len())
        .position(|w| w == cubin.as_slice())
        .expect("cubin embedded verbatim");
    b[at + cubin.len() / 2] ^= 0xff;
    std::fs::write(&obj, b).unwrap();
    rehash(d.path(), "obj/flashinfer_sm90_gva.o");
    let e = refused(d.path());
    assert!(e.contains("obj/flashinfer_sm90_gva.o"), "{e}");
}

#[test]
fn unknown_schema_version_and_corrupt_manifest() {
    let d = copy();
    let text = std::fs::read_to_string(d.path().join(MANIFEST_FILE)).unwrap();
    std::fs::write(
        d.path().join(MANIFEST_FILE),
        text.replacen(
            "\"schema_version\": 1",
            "\"schema_version\": 2, \"field_from_the_future\": true",
            1,
        ),
    )
    .unwrap();
    let (t, l) = table_and_lock();
    assert!(matches!(
        verify_bundle(d.path(), &t, &l, HostPolicy::Locked),
        Err(Error::SchemaVersion { actual: 2, .. })
    ));
    std::fs::write(d.path().join(MANIFEST_FILE), &text[..text.len() / 2]).unwrap();
    let e = refused(d.path());
    assert!(
        e.contains("manifest.json") && e.contains("not valid"),
        "{e}"
    );
}

#[test]
fn stale_lock_is_refused_with_the_remedy() {
    let (t, l) = table_and_lock();
    let other = Sha256Hex::of_bytes(b"edited table");
    let e = check_lock_matches_table(&t, &other, &l)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("artifacts.json") && e.contains("gdn-gen -- lock"),
        "{e}"
    );
    let real = Sha256Hex::of_bytes(&std::fs::read(repo().join(TABLE_FILE)).unwrap());
    check_lock_matches_table(&t, &real, &l).unwrap();
}

#[test]
fn missing_or_corrupt_lock_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(LOCK_FILE);
    let e = Lock::load(&p).unwrap_err().to_string();
    assert!(e.contains(LOCK_FILE), "{e}");
    std::fs::write(&p, "{\"schema_version\": 1").unwrap();
    let e = Lock::load(&p).unwrap_err().to_string();
    assert!(e.contains(LOCK_FILE) && e.contains("not valid"), "{e}");
}

#[test]
fn extra_library_listed_in_the_manifest_is_refused() {
    // A consistent-looking extra static library would land on the link path.
    let d = copy();
    std::fs::write(d.path().join("lib/libdl.a"), b"!<arch>\n").unwrap();
    let mut m = manifest(d.path());
    let mut art = m.artifacts["lib/libcudart_static.a"].clone();
    art.digests = Digests::of_bytes(b"!<arch>\n");
    m.artifacts.insert("lib/libdl.a".into(), art);
    save(d.path(), &m);
    let e = refused(d.path());
    assert!(
        e.contains("lib/libdl.a") && e.contains("not produced by the artifact table"),
        "{e}"
    );
}

/// A copy whose manifest claims another host compiler, with `obj` appended to.
fn foreign_host(append_to: &str) -> tempfile::TempDir {
    let d = copy();
    let mut m = manifest(d.path());
    m.toolchain.host_compiler = "g++ (Other) 99.1".into();
    save(d.path(), &m);
    let p = d.path().join(append_to);
    let mut b = std::fs::read(&p).unwrap();
    b.extend_from_slice(b"\0extra host code");
    std::fs::write(&p, b).unwrap();
    rehash(d.path(), append_to);
    d
}

#[test]
fn foreign_host_objects_need_an_explicit_opt_in() {
    let (t, l) = table_and_lock();
    let d = foreign_host("obj/gdn_abi.o");
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::Locked)
        .unwrap_err()
        .to_string();
    assert!(e.contains("host compiler") && e.contains("Other"), "{e}");
    // With the opt-in, other host code passes: its device code is still checked.
    let v = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler).unwrap();
    assert!(!v.host_matches_lock);
}

#[test]
fn pinned_toolkit_library_must_match_even_with_a_foreign_host_compiler() {
    let (t, l) = table_and_lock();
    let d = foreign_host("lib/libcudart_static.a");
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lib/libcudart_static.a") && e.contains("against the lock"),
        "{e}"
    );
}

#[test]
fn verified_bytes_are_the_bytes_on_disk() {
    let (t, l) = table_and_lock();
    let d = copy();
    let v = verify_bundle(d.path(), &t, &l, HostPolicy::Locked).unwrap();
    for (rel, bytes) in &v.files {
        assert_eq!(bytes, &std::fs::read(d.path().join(rel)).unwrap(), "{rel}");
    }
}

/// Runs `f` on another thread and fails the test if it has not returned
/// within 20 s (a reader blocked on a FIFO never returns).
fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("verification blocked for 20 s")
}

#[cfg(unix)]
#[test]
fn fifo_in_place_of_an_artifact_or_the_manifest_is_refused_without_blocking() {
    for rel in [GVA, MANIFEST_FILE] {
        let d = copy();
        std::fs::remove_file(d.path().join(rel)).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(d.path().join(rel))
            .status()
            .unwrap();
        assert!(status.success());
        let root = d.path().to_path_buf();
        let e = within_20s(move || refused(&root));
        assert!(
            e.contains(rel) && e.contains("not a regular file"),
            "{rel}: {e}"
        );
    }
}

#[test]
fn consumer_advice_is_to_rebuild_or_investigate_never_to_relock() {
    // Bytes that differ from the lock, with a manifest made to agree: what a
    // consumer (build.rs, `gdn-gen check`) must not "fix" by re-locking.
    for rel in [GVA, "obj/dsl/sm90_prefill.o", "obj/gdn_abi.o", DSL_RUNTIME] {
        let d = copy();
        let p = d.path().join(rel);
        let mut b = std::fs::read(&p).unwrap();
        b.push(0);
        std::fs::write(&p, b).unwrap();
        rehash(d.path(), rel);
        let e = refused(d.path());
        assert!(e.contains(rel) && e.contains("against the lock"), "{e}");
        assert!(
            e.contains("gdn-gen -- build") && e.contains("gdn-gen -- verify"),
            "{rel}: the advice must be to rebuild and find out why: {e}"
        );
        assert!(
            !e.contains("gdn-gen -- lock"),
            "{rel}: advises re-locking: {e}"
        );
    }
}

/// The lock pins the DSL runtime once per wheel set; a bundle's copy must be
/// the pin of the set its manifest names, from the wheel the pin names.
#[test]
fn dsl_runtime_must_be_its_wheel_sets_pin() {
    let (t, l) = table_and_lock();
    let d = copy();
    let abi = manifest(d.path()).dsl.unwrap().python_abi;
    // The other wheel set's library (bytes that differ) under a consistent manifest.
    let p = d.path().join(DSL_RUNTIME);
    let mut b = std::fs::read(&p).unwrap();
    b.extend_from_slice(b"\0another wheel set");
    std::fs::write(&p, b).unwrap();
    rehash(d.path(), DSL_RUNTIME);
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(DSL_RUNTIME) && e.contains(&format!("Python {abi} wheel set")),
        "{e}"
    );
}

#[test]
fn dsl_runtime_wheel_in_the_manifest_must_be_the_pinned_one() {
    let (_, l) = table_and_lock();
    let d = copy();
    let mut m = manifest(d.path());
    let dsl = m.dsl.as_mut().unwrap();
    let other = l
        .dsl_runtime
        .iter()
        .find(|(abi, _)| **abi != dsl.python_abi)
        .map(|(_, pin)| pin.wheel.clone())
        .expect("the lock pins more than one wheel set");
    dsl.runtime_wheel = other.clone();
    save(d.path(), &m);
    let e = refused(d.path());
    assert!(e.contains("runtime_wheel") && e.contains(&other), "{e}");
}

#[test]
fn a_lock_missing_a_wheel_sets_runtime_pin_is_refused_naming_the_pinned_ones() {
    let (t, mut l) = table_and_lock();
    assert_eq!(
        l.dsl_runtime.keys().collect::<Vec<_>>(),
        t.dsl.as_ref().unwrap().pythons.iter().collect::<Vec<_>>()
    );
    let d = copy();
    let abi = manifest(d.path()).dsl.unwrap().python_abi;
    l.dsl_runtime.remove(&abi);
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wheel sets with a DSL runtime pin") && e.contains("dsl.pythons"),
        "{e}"
    );
    let e = l.dsl_runtime_for(&abi).unwrap_err().to_string();
    assert!(e.contains(&abi) && e.contains("it pins"), "{e}");
}

/// A sparse file of 1 TiB in place of `rel`: no disk, no memory, unless read.
fn sparse_tebibyte(dir: &Path, rel: &str) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(rel))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
}

#[test]
fn a_huge_file_is_refused_by_its_size_before_it_is_read() {
    let locked = table_and_lock().1.device_artifacts[GVA].size;
    // The manifest as built: the file's size against the manifest's.
    let d = copy();
    sparse_tebibyte(d.path(), GVA);
    let root = d.path().to_path_buf();
    let e = within_20s(move || refused(&root));
    assert!(
        e.contains(&format!(
            "artifact {GVA} size: expected {locked}, found 1099511627776"
        )),
        "{e}"
    );
    // A manifest made to agree: the manifest's size against the lock's.
    let d = copy();
    sparse_tebibyte(d.path(), GVA);
    let mut m = manifest(d.path());
    m.artifacts.get_mut(GVA).unwrap().digests.size = 1 << 40;
    save(d.path(), &m);
    let root = d.path().to_path_buf();
    let e = within_20s(move || refused(&root));
    assert!(
        e.contains(&format!(
            "device artifact {GVA} (against the lock) size: expected {locked}, found 1099511627776"
        )),
        "{e}"
    );
}

#[test]
fn a_huge_host_object_nothing_pins_is_refused_unread_too() {
    // Another host compiler's object is not pinned by the lock: the manifest
    // may claim any size, and a bundle file over the limit is refused.
    let (t, l) = table_and_lock();
    let d = foreign_host("obj/gdn_abi.o");
    sparse_tebibyte(d.path(), "obj/gdn_abi.o");
    let mut m = manifest(d.path());
    m.artifacts.get_mut("obj/gdn_abi.o").unwrap().digests.size = 1 << 40;
    save(d.path(), &m);
    let root = d.path().to_path_buf();
    let e = within_20s(move || {
        verify_bundle(&root, &t, &l, HostPolicy::AllowForeignHostCompiler)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    });
    assert!(
        e.contains("obj/gdn_abi.o") && e.contains("1099511627776 bytes, over the"),
        "{e}"
    );
}

/// The copy's manifest with `toolchain.toolkit` set to `kind` and the
/// toolchain wheels left out of its inputs (a bundle built without them).
fn claim_toolkit(dir: &Path, kind: &str) {
    let (_, l) = table_and_lock();
    let p = dir.join(MANIFEST_FILE);
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    m["toolchain"]["toolkit"] = kind.into();
    let inputs = m["inputs"].as_object_mut().unwrap();
    for i in l.inputs.iter().filter(|i| i.role == InputRole::Toolchain) {
        inputs
            .remove(&i.filename)
            .expect("the real bundle used the wheels");
    }
    std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn a_toolkit_kind_gdn_gen_never_writes_cannot_unpin_cudart() {
    let (t, l) = table_and_lock();
    assert_eq!(l.host_artifacts.toolkit, ToolkitKind::PypiWheels);
    // Another host compiler, a cudart that is not the wheels', and a
    // toolkit kind that no gdn-gen writes: refused, even with the opt-in.
    let d = foreign_host("lib/libcudart_static.a");
    claim_toolkit(d.path(), "local");
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler)
        .map(|_| ())
        .expect_err("a modified cudart passed under a `local` toolkit")
        .to_string();
    assert!(
        e.contains(MANIFEST_FILE) && e.contains("unknown variant `local`"),
        "{e}"
    );
    // An external toolkit (`--toolkit-root`, as Nix builds): nothing pins
    // its cudart, so it is accepted under the opt-in only, as the README
    // says.
    let d = foreign_host("lib/libcudart_static.a");
    claim_toolkit(d.path(), "external-root");
    let e = verify_bundle(d.path(), &t, &l, HostPolicy::Locked)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("external-root") && e.contains("Other"), "{e}");
    let v = verify_bundle(d.path(), &t, &l, HostPolicy::AllowForeignHostCompiler).unwrap();
    assert_eq!(v.manifest.toolchain.toolkit, ToolkitKind::ExternalRoot);
}
