//! The gdn-server program refusing to start: a checkpoint it cannot load
//! (it must exit with status 1 and the reason, not keep a server up whose
//! /health says 503 "retry" forever; without a GPU the CPU executor refuses
//! the file; on a GPU machine the GPU executor loads it instead, a case not
//! yet run there), a MoE checkpoint missing an expert tensor, and flags
//! out of range; and a MoE checkpoint that loads logging its architecture.

use crate::common;

use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs gdn-server with `args` (loopback, an ephemeral port) and returns
/// its exit status and stderr; kills it after `limit`.
fn run_server(args: &[&std::ffi::OsStr], limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn-server"))
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(args)
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
    for entry in std::fs::read_dir(common::demo_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let (status, stderr) = run_server(
        &["--model".as_ref(), dir.path().as_os_str()],
        Duration::from_secs(60),
    );
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

/// The last line of a refused start, which must exit 1 at once.
fn refused(args: &[&str]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let (status, stderr) = run_server(&args, Duration::from_secs(30));
    assert_eq!(
        status,
        Some(1),
        "{args:?} did not exit 1; stderr:\n{stderr}"
    );
    stderr.lines().last().unwrap_or("").to_string()
}

#[test]
fn flags_out_of_range_are_refused_with_the_limit() {
    // The demo's config.json says max_position_embeddings 4096.
    let last = refused(&["--max-model-len", "100000"]);
    assert!(
        last.contains("--max-model-len 100000") && last.contains("max_position_embeddings (4096"),
        "{last}"
    );
    let last = refused(&["--gpu-memory-utilization", "1.5"]);
    assert!(last.contains("(0, 1], got 1.5"), "{last}");
}

/// A copy of qwen35's MoE fixture with per-expert tensors, `drop` removed.
fn moe_checkpoint(drop: Option<&str>) -> tempfile::TempDir {
    let src = qwen35_testkit::dir("moe_text_per_expert");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    if let Some(drop) = drop {
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<_> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != drop)
            .collect();
        assert!(kept.len() < st.len(), "{drop} is not in the fixture");
        let out = safetensors::serialize(kept, None).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
    }
    dir
}

/// Flags that keep the CPU executor small on the tiny fixtures.
const SMALL_CPU: [&str; 6] = [
    "--device",
    "cpu",
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "512",
];

#[test]
fn a_moe_checkpoint_missing_an_expert_tensor_exits_1_naming_it() {
    let tensor = "model.layers.2.mlp.experts.5.up_proj.weight";
    let dir = moe_checkpoint(Some(tensor));
    let mut args: Vec<&std::ffi::OsStr> = SMALL_CPU.iter().map(|a| a.as_ref()).collect();
    args.extend(["--model".as_ref(), dir.path().as_os_str()]);
    let (status, stderr) = run_server(&args, Duration::from_secs(60));
    assert_eq!(
        status,
        Some(1),
        "gdn-server did not exit 1; stderr:\n{stderr}"
    );
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("gdn-server: the engine stopped: loading failed:")
            && last.contains(tensor)
            && last.contains("missing"),
        "last line: {last}\nstderr:\n{stderr}"
    );
}

#[test]
fn a_moe_checkpoint_loads_and_the_log_names_its_architecture() {
    let dir = moe_checkpoint(None);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn-server"))
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(SMALL_CPU)
        .arg("--model")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gdn-server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = vec![];
    let found = loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("model: MoE (8 experts, top-2, shared expert)") => {
                break true
            }
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(found, "no architecture line; stderr:\n{}", seen.join("\n"));
}
