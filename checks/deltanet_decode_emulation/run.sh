#!/usr/bin/env bash
# The fused DeltaNet decode kernel's source run on the CPU against the
# unfused kernels' (main.cpp says what it checks); about 2 minutes on 2 cores
# (one OS thread per CUDA thread). Exits 1 on a difference.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
src=crates/gdn-kernels/cuda/model_kernels.cu
out=target/deltanet_decode_emulation
mkdir -p "$out"
# The bf16 typedef, the helpers' namespace (up to its first close) and the DeltaNet kernels
# from the conv through the end of the fused decode.
{
  grep '^typedef __nv_bfloat16 bf16;' "$src"
  # One sed that quits at the first close: a second sed quitting early would leave
  # the first writing into a closed pipe (SIGPIPE, exit 141 under pipefail).
  sed -n '/^namespace {/,/^}  \/\/ namespace/{p;/^}  \/\/ namespace/q}' "$src"
  sed -n '/^\/\/ DeltaNet input side for every token/,/^\/\/ -* end of the fused DeltaNet decode/p' "$src"
} > "$out/model_kernels_part.inc"
g++ -std=c++20 -O2 -ffp-contract=off -pthread -I "$out" -o "$out/emulate" checks/deltanet_decode_emulation/main.cpp
"$out/emulate"
