#!/usr/bin/env bash
# Runs on the H200 (through the device tool) with .carry/ from prepare_carry.sh.
# Stages (comma-separated first argument, default all):
#   tests      the GDN op's GPU gates, twice: plain and with CUDA_DISABLE_PTX_JIT=1;
#              then the attention op at Qwen3.5 shapes (gpu_model_ops) and the
#              fused DeltaNet decode (gpu_deltanet_decode)
#   dsl        the CuTe DSL backends' GPU gates (gpu_dsl_prefill)
#   crosscheck our backends against FLA's Triton kernel on shared inputs
#   bench      our two backends and FLA, side by side
#   repro      `gdn-gen verify` with the machine's own nvcc under /usr/local/cuda
#   fixtures   regenerate the Qwen3.5 fixtures with HF transformers (fixtures.tar;
#              the MoE ones in moe_fixtures.tar)
#   qwen35     qwen35's unit tests (the staged weight upload on the GPU), the
#              Qwen3.5 GPU gates, step-seam, executor, engine and prefix-cache tests, and the
#              fixtures served by gdn-server (on the fixtures just made, else the
#              committed ones)
#   qbench     the Qwen3.5-4B random-weight benchmark
#   skinny     the skinny linear kernels' GPU gate (gpu_skinny_linear, PTX JIT
#              off), the fused SwiGLU GEMM's (gpu_swiglu_gemm, PTX JIT off)
#              and the skinny kernels' benchmark against cuBLAS (skinny_bench.jsonl; the
#              standalone skinny_harness too where carried)
#   qprofile   nsys kernel summary of the 4B decode step at batch 1 (if nsys exists)
# Writes at most 8 files under $OUT (the device tool returns 8).
set -uo pipefail
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
stages=${1:-tests,crosscheck,bench,repro}
has() { [[ ",$stages," == *",$1,"* ]]; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; nvcc --version | tail -2; gcc --version | head -1; ldd --version | head -1
  echo "commit: ${GDN_COMMIT:-unknown}"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if has crosscheck || has bench; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/whl/fla_core-*.whl && export PYTHONPATH=/tmp/site
fi
rc=0
if has tests; then
  { echo "### GDN_REQUIRE_GPU=1 gpu_prefill"; GDN_REQUIRE_GPU=1 .carry/bin/gpu_prefill --test-threads=1 --nocapture; } > "$OUT/tests.log" 2>&1 || rc=1
  { echo "### GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 gpu_prefill"; GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_prefill --test-threads=1; } >> "$OUT/tests.log" 2>&1 || rc=1
  if [ -x .carry/bin/gpu_model_ops ]; then
    { echo "### GDN_REQUIRE_GPU=1 gpu_model_ops"; GDN_REQUIRE_GPU=1 .carry/bin/gpu_model_ops --test-threads=1 --nocapture; } >> "$OUT/tests.log" 2>&1 || rc=1
  fi
  if [ -x .carry/bin/gpu_deltanet_decode ]; then
    { echo "### GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 gpu_deltanet_decode"; GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_deltanet_decode --test-threads=1 --nocapture; } >> "$OUT/tests.log" 2>&1 || rc=1
  fi
  grep -E "^test result|^### " "$OUT/tests.log"
fi
if has dsl; then
  { echo "### GDN_REQUIRE_GPU=1 gpu_dsl_prefill"; GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_dsl_prefill --test-threads=1 --nocapture; } > "$OUT/dsl.log" 2>&1 || rc=1
  grep -E "^test |^test result|panicked" "$OUT/dsl.log"
fi
if has crosscheck; then
  { .carry/bin/gdn_dump /tmp/dump && python3 checks/gpu/fla_crosscheck.py /tmp/dump; } > "$OUT/crosscheck.log" 2>&1 || rc=1
  tail -1 "$OUT/crosscheck.log"
fi
if has bench; then
  { .carry/bin/gdn_bench && python3 checks/gpu/fla_bench.py; } > "$OUT/bench.jsonl" 2> "$OUT/bench.err" || rc=1
  cat "$OUT/bench.jsonl"
fi
if has repro; then
  ( time .carry/bin/gdn-gen verify --toolkit-root /usr/local/cuda --inputs-dir .carry/whl --offline \
      --cache /tmp/gdn-cache --out /tmp/gdn-bundle --jobs 2 ) > "$OUT/repro.log" 2>&1 || rc=1
  tar -cf "$OUT/repro_artifacts.tar" -C /tmp/gdn-cache units 2>/dev/null --exclude='*.ii' --exclude='*.cpp' --exclude='*.c' --exclude='*.ptx' --exclude='*.gpu' --exclude='tmp'
  grep -E "same|DIFFERS|MISSING|host artifacts|error|verify:|real" "$OUT/repro.log"
fi
if has fixtures; then
  # Without fla-core on the path: HF must run its pure-torch paths (and FLA's
  # Triton kernels cannot take the CPU tensors of the fp32 reference).
  env -u PYTHONPATH PYTHONUNBUFFERED=1 python3 checks/fixtures/make_qwen35_fixtures.py /tmp/fixtures > /tmp/generation.log 2>&1 || rc=1
  env -u PYTHONPATH PYTHONUNBUFFERED=1 python3 checks/fixtures/make_qwen35_moe_fixtures.py /tmp/fixtures > /tmp/generation_moe.log 2>&1 || rc=1
  cp /tmp/generation.log /tmp/generation_moe.log /tmp/fixtures/ 2>/dev/null
  # Two archives, each under the size of one file that comes back.
  tar -cf "$OUT/fixtures.tar" -C /tmp --exclude='fixtures/moe_*' --exclude=generation_moe.log fixtures
  tar -cf "$OUT/moe_fixtures.tar" -C /tmp fixtures/generation_moe.log $(cd /tmp && ls -d fixtures/moe_*)
  tail -3 /tmp/generation.log /tmp/generation_moe.log
  export QWEN35_FIXTURES=/tmp/fixtures
fi
# cuBLAS is loaded at run time (libcublas.so.13): the toolkit's or torch's copy.
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)
export QWEN35_FIXTURES=${QWEN35_FIXTURES:-$PWD/crates/qwen35/tests/fixtures}
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if has qwen35; then
  echo "### fixtures: $QWEN35_FIXTURES, cuBLAS: ${cublas:-not found}" > "$OUT/qwen35.log"
  for t in qwen35_lib gpu_forward gpu_moe_forward gpu_steps gpu_executor gpu_engine gpu_sampling gpu_prefix_cache gpu_snapshot_share gpu_served gpu_served_structured; do
    [ -x .carry/bin/$t ] || continue
    { echo "### GDN_REQUIRE_GPU=1 $t"; GDN_REQUIRE_GPU=1 .carry/bin/$t --test-threads=1 --nocapture; } >> "$OUT/qwen35.log" 2>&1 || rc=1
  done
  grep -E "^### |^test |^test result|panicked" "$OUT/qwen35.log"
fi
if has qbench; then
  .carry/bin/qwen35_bench > "$OUT/qbench.jsonl" 2> "$OUT/qbench.err" || rc=1
  cat "$OUT/qbench.jsonl"; tail -5 "$OUT/qbench.err"
fi
if has skinny; then
  if [ -x .carry/bin/gpu_skinny_linear ]; then
    { echo "### GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 gpu_skinny_linear"; GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_skinny_linear --test-threads=1 --nocapture; } > "$OUT/skinny.log" 2>&1 || rc=1
    grep -E "^test |^test result|panicked|^shape " "$OUT/skinny.log"
  fi
  if [ -x .carry/bin/gpu_swiglu_gemm ]; then
    { echo "### GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 gpu_swiglu_gemm"; GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1 .carry/bin/gpu_swiglu_gemm --test-threads=1 --nocapture; } >> "$OUT/skinny.log" 2>&1 || rc=1
    grep -E "^test |^test result|panicked|worst error" "$OUT/skinny.log" | tail -20
  fi
  if [ -x .carry/bin/skinny_bench ]; then
    CUDA_DISABLE_PTX_JIT=1 .carry/bin/skinny_bench > "$OUT/skinny_bench.jsonl" 2>> "$OUT/skinny.log" || rc=1
    grep -E '"kind": "(copy|best|step)"' "$OUT/skinny_bench.jsonl"
  fi
  # The standalone twin (checks/gpu/skinny_harness.cu), for builds without the bundle.
  if [ -x .carry/bin/skinny_harness ]; then
    .carry/bin/skinny_harness > "$OUT/skinny_harness.jsonl" 2>> "$OUT/skinny.log" || rc=1
    grep -E '"kind": "(copy|best|step)"' "$OUT/skinny_harness.jsonl"
  fi
fi
if has qprofile; then
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -n $nsys ]]; then
    "$nsys" profile -o /tmp/qprof --force-overwrite true .carry/bin/qwen35_bench decode --decode-batches 1 > /dev/null 2>&1
    "$nsys" stats -r cuda_gpu_kern_sum,cuda_api_sum /tmp/qprof.nsys-rep > "$OUT/qprofile.txt" 2>&1 || rc=1
    head -40 "$OUT/qprofile.txt"
  else
    echo "qprofile: no nsys on this machine" | tee "$OUT/qprofile.txt"
  fi
fi
exit $rc
