#!/usr/bin/env bash
# Builds everything the H200 run needs on this (CPU-only) machine and puts it
# under .carry/ (git-ignored), for the device tool's `carry`:
#   .carry/bin: the test binaries holding the GPU gates (kernels_tests, qwen35_tests,
#               server_tests, qwen35_lib), the benchmarks
#               (GDN op, skinny linear vs cuBLAS, Qwen3.5-4B), the dump tool, gdn-gen
#   .carry/whl: fla-core (FLA Triton) and the pinned FlashInfer wheel (for the
#               cross-machine reproducibility check with NVIDIA's toolkit there)
# The device tool carries at most 64 MiB with the working tree: name the
# binaries a run needs (e.g. `prepare_carry.sh qwen35_tests qwen35_bench`) to
# carry only those; with no arguments everything is built and carried.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .carry && mkdir -p .carry/bin .carry/whl
cargo build --release -p gdn-gen -p gdn-kernels -p qwen35 --examples
cp target/release/gdn-gen target/release/examples/{gdn_bench,gdn_dump,qwen35_bench,skinny_bench} .carry/bin/
test_binary() {  # crate -> path of its integration-test executable (each crate has
  # one test target, tests/integration/main.rs; a crate with a binary also
  # reports the binary's path, hence the filter on the target's kind)
  cargo test --release -p "$1" --test integration --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([j["executable"] for j in map(json.loads, sys.stdin) if j.get("executable") and j["target"]["kind"] == ["test"]][-1])'
}
# The GPU gates are modules of these binaries (device_run.sh picks them by
# module path, e.g. `qwen35_tests gpu_forward::`).
cp "$(test_binary gdn-kernels)" .carry/bin/kernels_tests
cp "$(test_binary qwen35)" .carry/bin/qwen35_tests
cp "$(test_binary gdn-server)" .carry/bin/server_tests
# qwen35's unit tests: the staged weight upload's GPU test among them.
cargo test --release -p qwen35 --lib --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; print([j["executable"] for j in map(json.loads, sys.stdin) if j.get("executable")][-1])' \
  | xargs -I{} cp {} .carry/bin/qwen35_lib
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .carry/whl fla-core==0.6.0
read -r fi_wheel fi_url fi_sha < <(python3 -c 'import json; i=[i for i in json.load(open("gdn-bundle.lock.json"))["inputs"] if i["role"]=="kernel-source"][0]; print(i["filename"], i["url"], i["sha256"])')
curl -fsSL -o ".carry/whl/$fi_wheel" "$fi_url"
echo "$fi_sha  .carry/whl/$fi_wheel" | sha256sum -c -
if [ $# -gt 0 ]; then
  keep=" $* "
  for f in .carry/bin/*; do
    [[ $keep == *" $(basename "$f") "* ]] || rm -f "$f"
  done
  [[ $keep == *" whl "* ]] || rm -rf .carry/whl
fi
du -sh .carry
size=$(du -sm .carry | cut -f1)
[ "$size" -le 56 ] || echo "warning: .carry is ${size} MiB; with the tree that may exceed the device tool's 64 MiB: name fewer binaries" >&2
