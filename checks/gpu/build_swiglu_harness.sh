#!/usr/bin/env bash
# Builds checks/gpu/swiglu_gemm_harness.cu into .carry/bin/swiglu_gemm_harness
# (static cudart and the CuTe DSL runtime; cuBLAS is loaded at run time).
# Needs the bundle's toolkit and DSL site (`gdn-gen build`) and network to PyPI
# (docs/results/quack-probe-2026-12-01/probe.sh exports the kernel).
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
cd "$repo"
work=${1:-/tmp/quack-probe}
docs/results/quack-probe-2026-12-01/probe.sh "$work"
tk=$(ls -d target/gdn-cache/toolkit/*/nvidia/cu13)
dsl=$(ls -d target/gdn-cache/dsl-site/*/nvidia_cutlass_dsl/cu13/lib)
mkdir -p .carry/bin
"$tk/bin/nvcc" -std=c++17 -O3 -arch=sm_90a -I "$work/out/concatB" -I "$tk/include" \
  -o .carry/bin/swiglu_gemm_harness checks/gpu/swiglu_gemm_harness.cu "$work/out/concatB/quack_swiglu_sm90_concatB.o" \
  "$dsl/libcuda_dialect_runtime_static.a" -L "$tk/lib" -lcudart_static -ldl -lpthread -lrt
ls -l .carry/bin/swiglu_gemm_harness
