#!/usr/bin/env bash
# The project's test command (README "Test"). Needs no GPU: GPU tests skip
# themselves; checks/gpu/ runs them on a GPU machine.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -f target/cargo-test-summary.txt
# A clean checkout builds everything once: incremental caches would only
# take disk (gigabytes across the workspace's test binaries).
export CARGO_INCREMENTAL=0
# Each step's wall time, printed as a table when the script ends (also on a
# failure): the numbers to measure before cutting anything (README, "Test").
step_names=() step_starts=()
step() {
  step_names+=("$*") step_starts+=("$(date +%s)")
  echo; echo "==== $* ($(date -u +%H:%M:%S))"
}
# A step that fails ends the script: the background bundle build (a process
# tree: the script, gdn-gen, nvcc) ends with it.
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
step_table() {
  local rc=$? now i next total=0
  if [ -n "${bundle_pid:-}" ] && kill -0 "$bundle_pid" 2>/dev/null; then kill_tree "$bundle_pid"; fi
  now=$(date +%s)
  echo; echo "| step | seconds |"; echo "|---|---|"
  for i in "${!step_names[@]}"; do
    next=${step_starts[$((i + 1))]:-$now}
    echo "| ${step_names[$i]} | $((next - step_starts[i])) |"
    total=$((total + next - step_starts[i]))
  done
  echo "| **total** | **$total** |"
  # The tests' closing line last, where CI's reader looks for it.
  if [ -f target/cargo-test-summary.txt ]; then echo; cat target/cargo-test-summary.txt; fi
  return $rc
}
trap step_table EXIT

# Every tool this script needs besides cargo, named before anything runs
# (`.ci/run` installs them on Debian).
missing=()
for pair in nix-instantiate:nix-bin jq:jq taskset:util-linux /usr/bin/time:time curl:curl patch:patch \
            g++:g++ python3:python3 mkfifo:coreutils pgrep:procps; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair%%:*} (Debian: ${pair#*:})")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "checks/ci.sh needs these tools: ${missing[*]}; .ci/run installs them" >&2
  exit 1
fi

step "format"
cargo fmt --all -- --check

step "architecture rules (no #[path], no Result<_, String>, no import circles, HTTP library on the engine only, no dates or figures in comments)"
python3 checks/architecture_rules.py

step "bundle from scratch as reproducibility build b (in the background)"
# The one from-scratch bundle build of this run, under conditions unlike the
# lock's build (another checkout path, HOME, TMPDIR, TZ, locale, umask, Python
# patch version) and checked file by file against the lock, whose hashes a
# from-scratch build in a developer's environment wrote: the
# reproducibility proof and the cross-machine proof at once
# (checks/reproducibility.sh). The steps up to "wait for the bundle" need no
# bundle and share the cores with it.
cargo build -q --release -p gdn-gen
checks/reproducibility.sh --against-lock > target/bundle-build.log 2>&1 &
bundle_pid=$!
echo "building in the background (pid $bundle_pid), log in target/bundle-build.log"

step "DeltaNet conv and fused decode kernels on the CPU, bit for bit against their references"
# The kernels' own source under a CUDA shim (checks/deltanet_decode_emulation):
# the prefill conv kernels over varlen batches and the fused decode step.
checks/deltanet_decode_emulation/run.sh

step "MoE direct-path kernels on the CPU, bit for bit against the grouped GEMV path"
checks/moe_emulation/run.sh

step "benchmark scripts parse; the vLLM side-by-side's dry run (files, wheel list, table)"
# The H200 runs these: a syntax error there costs device time.
for f in checks/bench/*.sh checks/bench/peer_vllm/*.sh checks/gpu/*.sh; do bash -n "$f"; done
DRY_RUN=1 checks/bench/peer_vllm.sh | grep -E '^(wheels.txt|dry run checks|== PHASE)'

step "nix static checks"
checks/nix/run.sh

step "nix flake show/check/drvPaths with Nix 2.26 (Debian 13 chroot) against the test doubles"
checks/nix/modern-nix.sh

step "gdn-server end-to-end client venv (pinned PyPI packages)"
checks/server/setup_venv.sh

step "clippy and tests of the crates that need no bundle"
# Their dependencies (tokio, axum, llguidance, tokenizers, ...) build here,
# on the core the bundle leaves free; the later runs find them built. (The
# lock and generator tests read the bundle and its downloads.) The later
# `cargo test` leaves these crates out.
no_bundle=(gdn-engine gdn-http gdn-engine-testkit)
cargo clippy "${no_bundle[@]/#/--package=}" --all-targets -- -D warnings
cargo test "${no_bundle[@]/#/--package=}" -- --show-output 2>&1 | tee target/cargo-test-no-bundle.log

step "wait for the bundle"
if wait "$bundle_pid"; then bundle_rc=0; else bundle_rc=$?; fi
cat target/bundle-build.log
[ "$bundle_rc" -eq 0 ] || { echo "the bundle build failed (exit $bundle_rc)"; exit 1; }

step "warm rebuild is a no-op"
# With the interpreter that build b used: the DSL units are keyed by it.
start=$(date +%s%N)
out=$(target/release/gdn-gen build --python "$(cat target/gdn-repro-python)" 2>&1)
echo "$out"
grep -q "up to date" <<<"$out"
echo "warm rebuild: $(( ($(date +%s%N) - start) / 1000000 )) ms"

step "the bundle and our sources against the lock, by content (timestamps play no part)"
# cargo reruns build.rs only on newer files: a source or bundle file
# replaced with its old timestamp kept is caught here (README, "Use the
# kernels from Rust").
target/release/gdn-gen check

step "clippy"
cargo clippy --all-targets -- -D warnings

step "build.rs fails closed"
checks/build_rs_fails_closed.sh

step "gdn-server end to end: openai client, schemathesis fuzz, load (CPU demo on loopback)"
checks/server/run.sh

step "cargo test of the crates that link the bundle (GPU tests skip without a GPU)"
cargo test --workspace "${no_bundle[@]/#/--exclude=}" -- --show-output 2>&1 | tee target/cargo-test-bundle.log
cat target/cargo-test-no-bundle.log target/cargo-test-bundle.log > target/cargo-test.log
# Without a GPU the GPU tests pass by returning early; say how many did.
echo "GPU tests that skipped (no GPU here): $(grep -c '^skipped: no usable GPU' target/cargo-test.log || true)"
# One closing line for all test binaries together (cargo prints one per binary,
# and the last ones are doc-test runs with nothing in them).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' target/cargo-test.log | tee target/cargo-test-summary.txt
# The build's disk footprint, so that growth shows here before a CI
# machine's disk runs out (README, "Test").
echo "disk used by target/: $(du -sh target | cut -f1)"
