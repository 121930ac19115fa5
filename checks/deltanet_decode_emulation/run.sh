#!/usr/bin/env bash
# The fused DeltaNet decode kernel's source run on the CPU against the
# unfused kernels' (main.cpp says what it checks); about 2 minutes on 2 cores
# (one OS thread per CUDA thread). Exits 1 on a difference.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=target/deltanet_decode_emulation
mkdir -p "$out"
# main.cpp includes the kernels' own parts (model_common.cuh and the two
# DeltaNet parts of model_kernels.cu) from crates/gdn-kernels/cuda.
g++ -std=c++20 -O2 -ffp-contract=off -pthread -I crates/gdn-kernels/cuda -o "$out/emulate" checks/deltanet_decode_emulation/main.cpp
"$out/emulate"
