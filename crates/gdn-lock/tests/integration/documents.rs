//! The three documents as a reader sees them, without a bundle: a document
//! whose JSON names one key twice is refused (a reviewer would read one
//! value, serde would enforce the other), and our sources are checked
//! against the lock's hashes.

use std::path::{Path, PathBuf};

use gdn_lock::{
    check_sources_match_lock, to_canonical_json, ArtifactKind, ArtifactTable, Digests, DslIdentity,
    Lock, Manifest, ManifestArtifact, Sha256Hex, ToolchainIdentity, ToolkitKind, LOCK_FILE,
    SCHEMA_VERSION, TABLE_FILE,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `text` with `insert` placed right after the first occurrence of `after`.
fn inject(text: &str, after: &str, insert: &str) -> String {
    let at = text
        .find(after)
        .unwrap_or_else(|| panic!("{after:?} not in the document"))
        + after.len();
    format!("{}{insert}{}", &text[..at], &text[at..])
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn assert_duplicate_refused(err: String, key: &str) {
    assert!(
        err.contains("duplicate key") && err.contains(key),
        "expected a duplicate-key error naming {key:?}, got: {err}"
    );
}

#[test]
fn lock_with_a_key_named_twice_is_refused_in_every_map() {
    let text = std::fs::read_to_string(repo().join(LOCK_FILE)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The unmodified lock parses (so the refusals below are about the duplicate).
    Lock::load(&write(dir.path(), "ok.json", &text)).unwrap();
    let lock = Lock::load(&repo().join(LOCK_FILE)).unwrap();
    let (src, _) = lock.sources.iter().next().unwrap();
    let (dev, d) = lock.device_artifacts.iter().next().unwrap();
    let (host, _) = lock.host_artifacts.artifacts.iter().next().unwrap();
    let other = Sha256Hex::of_bytes(b"another file");
    let digests = format!(
        "{{\"size\": {}, \"sha256\": \"{other}\", \"blake3\": \"{}\"}}",
        d.size, d.blake3
    );
    let cases = [
        (
            "sources",
            inject(
                &text,
                "\"sources\": {",
                &format!("\n    \"{src}\": \"{other}\","),
            ),
            src.clone(),
        ),
        (
            "device_artifacts",
            inject(
                &text,
                "\"device_artifacts\": {",
                &format!("\n    \"{dev}\": {digests},"),
            ),
            dev.clone(),
        ),
        (
            "host_artifacts.artifacts",
            inject(
                &text,
                "\"host_artifacts\": {",
                &format!("\n    \"artifacts\": {{\"{host}\": {digests}, \"{host}\": {digests}}},"),
            ),
            host.clone(),
        ),
        (
            "a field of a struct",
            inject(&text, "\"abi_version\": 1,", "\n  \"abi_version\": 2,"),
            "abi_version".to_string(),
        ),
        (
            "a digest inside a map value",
            inject(
                &text,
                &format!("\"{dev}\": {{"),
                &format!("\n      \"sha256\": \"{other}\","),
            ),
            "sha256".to_string(),
        ),
    ];
    for (what, doc, key) in cases {
        let err = Lock::load(&write(dir.path(), "dup.json", &doc))
            .expect_err(what)
            .to_string();
        assert_duplicate_refused(err, &key);
    }
}

fn small_manifest() -> Manifest {
    let table = ArtifactTable::load(&repo().join(TABLE_FILE)).unwrap();
    Manifest {
        schema_version: SCHEMA_VERSION,
        abi_version: table.abi_version,
        geometry: table.geometry,
        toolchain: ToolchainIdentity {
            nvcc_version: "V13.0.88".into(),
            nvcc_build: "Build x".into(),
            toolkit: ToolkitKind::PypiWheels,
            host_compiler: "g++".into(),
        },
        inputs: [("a.whl".to_string(), Sha256Hex::of_bytes(b"a"))].into(),
        artifacts: [(
            "cubin/a.sm_90a.cubin".to_string(),
            ManifestArtifact {
                kind: ArtifactKind::DeviceCubin,
                digests: Digests::of_bytes(b"a"),
            },
        )]
        .into(),
        dsl: Some(DslIdentity {
            python: "3.11.2".into(),
            python_abi: "3.11".into(),
            runtime_wheel: "a.whl".into(),
        }),
    }
}

#[test]
fn manifest_with_a_key_named_twice_is_refused() {
    let text = to_canonical_json(&small_manifest());
    let dir = tempfile::tempdir().unwrap();
    Manifest::load(&write(dir.path(), "ok.json", &text)).unwrap();
    let b = Digests::of_bytes(b"b");
    let cases = [
        (
            inject(&text, "\"inputs\": {", &format!("\n    \"a.whl\": \"{}\",", b.sha256)),
            "a.whl",
        ),
        (
            inject(
                &text,
                "\"artifacts\": {",
                &format!(
                    "\n    \"cubin/a.sm_90a.cubin\": {{\"kind\": \"device-cubin\", \"size\": 1, \"sha256\": \"{}\", \"blake3\": \"{}\"}},",
                    b.sha256, b.blake3
                ),
            ),
            "cubin/a.sm_90a.cubin",
        ),
        // Inside a flattened artifact entry (serde's flatten would keep one).
        (
            inject(
                &text,
                "\"cubin/a.sm_90a.cubin\": {",
                &format!("\n      \"sha256\": \"{}\",", b.sha256),
            ),
            "sha256",
        ),
    ];
    for (doc, key) in cases {
        let err = Manifest::load(&write(dir.path(), "dup.json", &doc))
            .expect_err(key)
            .to_string();
        assert_duplicate_refused(err, key);
    }
}

#[test]
fn table_with_a_key_named_twice_is_refused() {
    let text = std::fs::read_to_string(repo().join(TABLE_FILE)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    ArtifactTable::load(&write(dir.path(), "ok.json", &text)).unwrap();
    let doc = inject(&text, "\"geometry\": {", "\n    \"head_dim\": 64,");
    let err = ArtifactTable::load(&write(dir.path(), "dup.json", &doc))
        .expect_err("duplicate head_dim")
        .to_string();
    assert_duplicate_refused(err, "head_dim");
}

#[cfg(unix)]
#[test]
fn a_fifo_in_place_of_a_document_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(LOCK_FILE);
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Lock::load(&fifo).map(|_| ()).map_err(|e| e.to_string()));
    });
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a FIFO as the lock blocked for 10 s");
    let err = result.expect_err("a FIFO is not a lock");
    assert!(
        err.contains(LOCK_FILE) && err.contains("not a regular file"),
        "{err}"
    );
}

/// A repository with the real table and lock, and copies of our sources.
fn repo_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (table, _) = ArtifactTable::load_with_sha256(&repo().join(TABLE_FILE)).unwrap();
    for p in table.sources.iter().chain(&table.patches) {
        let to = dir.path().join(p);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo().join(p), to).unwrap();
    }
    dir
}

#[test]
fn sources_are_checked_against_the_lock() {
    let (table, lock) =
        gdn_lock::load_table_and_lock(&repo().join(TABLE_FILE), &repo().join(LOCK_FILE)).unwrap();
    let copy = repo_copy();
    check_sources_match_lock(copy.path(), &table, &lock).unwrap();

    let edited = "crates/gdn-kernels/cuda/gdn_abi.cpp";
    let p = copy.path().join(edited);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend_from_slice(b"\n// edited after the bundle was built\n");
    std::fs::write(&p, &bytes).unwrap();
    let err = check_sources_match_lock(copy.path(), &table, &lock)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(edited)
            && err.contains(lock.sources[edited].as_str())
            && err.contains(Sha256Hex::of_bytes(&bytes).as_str()),
        "{err}"
    );

    std::fs::remove_file(&p).unwrap();
    let err = check_sources_match_lock(copy.path(), &table, &lock)
        .unwrap_err()
        .to_string();
    assert!(err.contains(edited), "{err}");
}

#[test]
fn a_huge_source_is_refused_by_its_size_not_hashed_to_its_end() {
    let (table, lock) =
        gdn_lock::load_table_and_lock(&repo().join(TABLE_FILE), &repo().join(LOCK_FILE)).unwrap();
    let copy = repo_copy();
    let edited = "crates/gdn-kernels/cuda/gdn_abi.cpp";
    std::fs::OpenOptions::new()
        .write(true)
        .open(copy.path().join(edited))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let e = check_sources_match_lock(copy.path(), &table, &lock).map_err(|e| e.to_string());
        let _ = tx.send(e);
    });
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("hashing a 1 TiB source ran for 20 s")
        .expect_err("a 1 TiB source is not the locked one");
    assert!(
        err.contains(edited) && err.contains("1099511627776 bytes, over the"),
        "{err}"
    );
}

#[test]
fn a_lock_edited_against_its_own_table_is_to_be_restored_not_rebuilt_against() {
    let (table, table_sha) = ArtifactTable::load_with_sha256(&repo().join(TABLE_FILE)).unwrap();
    let lock = Lock::load(&repo().join(LOCK_FILE)).unwrap();
    gdn_lock::check_lock_matches_table(&table, &table_sha, &lock).unwrap();
    let mut edited = lock.clone();
    edited.abi_version += 1;
    let mut other_nvcc = lock;
    other_nvcc.nvcc_version = "V13.0.99".into();
    for (what, l) in [("abi_version", edited), ("nvcc_version", other_nvcc)] {
        let err = gdn_lock::check_lock_matches_table(&table, &table_sha, &l)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(what) && err.contains("restore gdn-bundle.lock.json"),
            "{err}"
        );
    }
}
