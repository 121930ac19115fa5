#!/usr/bin/env bash
# Runs on the H200 (through the device tool) with .carry/ from prepare_carry.sh.
# Writes logs under $OUT. Stages: tests (twice: plain and CUDA_DISABLE_PTX_JIT=1),
# FLA cross-check, benchmark, reproducibility with the machine's own nvcc.
set -uo pipefail
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
stages=${1:-tests,crosscheck,bench,repro}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; nvcc --version | tail -2; gcc --version | head -1; ldd --version | head -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/whl/fla_core-*.whl && export PYTHONPATH=/tmp/site
rc=0
if [[ $stages == *tests* ]]; then
  GDN_REQUIRE_GPU=1 RUST_LOG=info .carry/bin/gpu_prefill --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1 || rc=1
  tail -3 "$OUT/tests.log"
  GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_prefill --test-threads=1 > "$OUT/tests_no_ptx_jit.log" 2>&1 || rc=1
  tail -3 "$OUT/tests_no_ptx_jit.log"
fi
if [[ $stages == *crosscheck* ]]; then
  .carry/bin/gdn_dump /tmp/dump && python3 checks/gpu/fla_crosscheck.py /tmp/dump > "$OUT/fla_crosscheck.log" 2>&1 || rc=1
  tail -20 "$OUT/fla_crosscheck.log"
fi
if [[ $stages == *bench* ]]; then
  .carry/bin/gdn_bench > "$OUT/bench_ours.jsonl" 2> "$OUT/bench_ours.err" || rc=1
  python3 checks/gpu/fla_bench.py > "$OUT/bench_fla.jsonl" 2> "$OUT/bench_fla.err" || rc=1
  cat "$OUT/bench_ours.jsonl" "$OUT/bench_fla.jsonl"
fi
if [[ $stages == *repro* ]]; then
  ( time .carry/bin/gdn-gen verify --toolkit-root /usr/local/cuda --inputs-dir .carry/whl --offline \
      --cache /tmp/gdn-cache --out /tmp/gdn-bundle --jobs 2 ) > "$OUT/repro.log" 2>&1 || rc=1
  tail -25 "$OUT/repro.log"
fi
exit $rc
