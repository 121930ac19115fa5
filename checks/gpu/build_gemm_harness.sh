#!/usr/bin/env bash
# Builds checks/gpu/gemm_vs_cublas_harness.cu into .carry/bin/gemm_vs_cublas_harness (static
# cudart and the CuTe DSL runtime; cuBLAS is loaded at run time as libcublas.so.13), linking the
# quack plain-GEMM variants that docs/results/quack-gemm-probe-2026-12-02/probe.sh exports.
# Needs the bundle's toolkit and DSL site (`gdn-gen build`) and network to PyPI.
# Usage: build_gemm_harness.sh [WORKDIR] (default /tmp/quack-gemm-probe).
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
cd "$repo"
work=${1:-/tmp/quack-gemm-probe}
docs/results/quack-gemm-probe-2026-12-02/probe.sh "$work"
tk=$(ls -d target/gdn-cache/toolkit/*/nvidia/cu13)
dsl=$(ls -d target/gdn-cache/dsl-site/*/nvidia_cutlass_dsl/cu13/lib | head -1)
mkdir -p .carry/bin
"$tk/bin/nvcc" -std=c++17 -O3 -arch=sm_90a -I "$work/out" -I "$tk/include" \
  -o .carry/bin/gemm_vs_cublas_harness checks/gpu/gemm_vs_cublas_harness.cu "$work"/out/quack_gemm_sm90_*.o \
  "$dsl/libcuda_dialect_runtime_static.a" -L "$tk/lib" -lcudart_static -ldl -lpthread -lrt
ls -l .carry/bin/gemm_vs_cublas_harness
