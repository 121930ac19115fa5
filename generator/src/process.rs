//! Subprocesses with errors that say what was attempted.

use std::path::Path;
use std::process::Command;

use crate::error::{GenError, Result};

/// Runs `cmd` and returns its stdout; on failure the error names the step,
/// the command line, the exit status and the tail of stderr.
pub fn run(step: &str, cmd: &mut Command) -> Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| GenError::Process {
        step: step.to_string(),
        command: line.clone(),
        outcome: format!("cannot start it: {e}"),
        tail: String::new(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = stderr.lines().chain(stdout.lines()).collect();
        return Err(GenError::Process {
            step: step.to_string(),
            command: line,
            outcome: out.status.to_string(),
            tail: tail[tail.len().saturating_sub(25)..].join("\n"),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The environment every compiler invocation gets: nothing from the caller
/// that could leak into outputs (locale, time zone, temp dir, home).
pub fn hermetic(cmd: &mut Command, tmp: &Path) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    // Nix's compiler wrappers read NIX_* variables; nothing else is passed on.
    let nix_vars: Vec<_> = std::env::vars_os()
        .filter(|(k, _)| k.to_string_lossy().starts_with("NIX_"))
        .collect();
    cmd.env_clear()
        .envs(nix_vars)
        .env("PATH", path)
        .env("LC_ALL", "C")
        .env("LANG", "C")
        .env("TZ", "UTC")
        .env("SOURCE_DATE_EPOCH", "0")
        .env("HOME", tmp)
        .env("TMPDIR", tmp);
}
