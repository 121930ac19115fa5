#!/usr/bin/env bash
# The MoE expert kernels' source (model_moe.cuh) run on the CPU against an
# f64 reference (main.cpp says what it checks): one OS thread per CUDA
# thread, so about a minute on 2 cores; FULL=1 adds larger cases (minutes).
# Exits 1 on a difference.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=target/moe_emulation
mkdir -p "$out"
g++ -std=c++20 -O2 -ffp-contract=off -pthread -I crates/gdn-kernels/cuda \
  -I checks/deltanet_decode_emulation -o "$out/emulate" checks/moe_emulation/main.cpp
"$out/emulate"
