#!/usr/bin/env bash
# The device sampler's source run on the CPU (no GPU) against the engine's
# CPU sampler: crates/qwen35/tests/integration/gpu_sampling.rs writes random cases with
# the CPU sampler's answers, main.cpp runs sampling.cu over them through
# cuda_shim.h (1024 OS threads per row: slow, about 0.5-1 s a row on 2 cores).
# Arguments: PLAN entries (`vocab`x`rows`), default a mix of small
# vocabularies, two full Qwen3.5 rows, rows of ties and rows with
# allowed-token masks (half of them masked); exits 1 on a difference.
# REPLAY=<calls> instead runs the random GPU test's first calls row for row.
# device_main.cu is the same harness for the GPU machine (nvcc there; see
# docs/gpu-tests.md): the kernel source as nvcc compiles it, on the device.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=target/sampling_emulation
mkdir -p "$out"
# SANITIZE=1: built with AddressSanitizer and UBSan (out-of-bounds host
# memory, static __shared__ arrays included; slower).
opt=(-O2)
[[ ${SANITIZE:-0} == 1 ]] && opt=(-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined)
g++ -std=c++20 "${opt[@]}" -ffp-contract=off -pthread -o "$out/emulate" checks/sampling_emulation/main.cpp
if [[ -n ${REPLAY:-} ]]; then
  EMIT=$PWD/$out/replay.bin \
    cargo test -q -p qwen35 --test integration -- --ignored gpu_sampling::emit_cases_for_the_cpu_emulation --nocapture
  exec "$out/emulate" "$out/replay.bin"
fi
plan=${1:-1x10,7x40,40x40,1023x15,1025x15,3000x10,248320x2}
EMIT=$PWD/$out/cases.bin PLAN=$plan SEED=${SEED:-3} \
  cargo test -q -p qwen35 --test integration -- --ignored gpu_sampling::emit_cases_for_the_cpu_emulation --nocapture
"$out/emulate" "$out/cases.bin"
EMIT=$PWD/$out/ties.bin PLAN=3000x20 SEED=${SEED:-3} TIES=1 \
  cargo test -q -p qwen35 --test integration -- --ignored gpu_sampling::emit_cases_for_the_cpu_emulation --nocapture
"$out/emulate" "$out/ties.bin"
EMIT=$PWD/$out/masks.bin PLAN=7x20,40x20,1025x10,3000x6 SEED=${SEED:-3} MASKS=1 \
  cargo test -q -p qwen35 --test integration -- --ignored gpu_sampling::emit_cases_for_the_cpu_emulation --nocapture
"$out/emulate" "$out/masks.bin"
