#!/usr/bin/env bash
# The MoE expert kernels' source (model_moe.cuh, model_moe_tc.cuh) run on the
# CPU: main.cpp against an f64 reference (the grouped paths), direct.cpp the
# direct path against the GEMV path bit for bit (each file says what it
# checks). One OS thread per CUDA thread, so a minute or two on 2 cores;
# FULL=1 adds larger cases to main.cpp (minutes). Exits 1 on a difference.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=target/moe_emulation
mkdir -p "$out"
g++ -std=c++20 -O2 -ffp-contract=off -pthread -I crates/gdn-kernels/cuda \
  -I checks/deltanet_decode_emulation -o "$out/emulate" checks/moe_emulation/main.cpp
g++ -std=c++20 -O2 -ffp-contract=off -pthread -I crates/gdn-kernels/cuda \
  -I checks/deltanet_decode_emulation -o "$out/emulate_direct" checks/moe_emulation/direct.cpp
"$out/emulate"
"$out/emulate_direct"
