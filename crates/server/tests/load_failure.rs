//! The gdn-server program with a checkpoint it cannot load: it must exit
//! with status 1 and the reason, not keep a server up whose /health says
//! 503 "retry" forever. Runs on the CPU executor without a GPU and on the
//! GPU executor with one (both refuse the file).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn demo_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("demo")
}

/// Runs gdn-server on `model` (loopback, an ephemeral port) and returns its
/// exit status and stderr; kills it after `limit`.
fn run_server(model: &Path, limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn-server"))
        .args(["--host", "127.0.0.1", "--port", "0", "--model"])
        .arg(model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gdn-server");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn a_truncated_checkpoint_exits_1_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(demo_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let (status, stderr) = run_server(dir.path(), Duration::from_secs(60));
    assert_eq!(
        status,
        Some(1),
        "gdn-server did not exit 1; stderr:\n{stderr}"
    );
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("gdn-server: the engine stopped: loading failed:")
            && last.contains("model.safetensors"),
        "last line: {last}\nstderr:\n{stderr}"
    );
}
