#!/usr/bin/env bash
# Runs on the H200 (through the device tool) with .carry/ from prepare_carry.sh.
# Stages (comma-separated first argument, default all):
#   tests      the GDN op's GPU gates, twice: plain and with CUDA_DISABLE_PTX_JIT=1;
#              then the attention op at Qwen3.5 shapes (gpu_model_ops), the
#              fused DeltaNet decode (gpu_deltanet_decode) and the MoE ops
#              (gpu_moe_ops)
#   dsl        the CuTe DSL backends' GPU gates (gpu_dsl_prefill)
#   crosscheck our backends against FLA's Triton kernel on shared inputs
#   bench      our two backends and FLA, side by side
#   repro      `gdn-gen verify` with the machine's own nvcc under /usr/local/cuda
#   fixtures   regenerate the Qwen3.5 fixtures with HF transformers (fixtures.tar;
#              the MoE ones in moe_fixtures.tar)
#   qwen35     qwen35's unit tests (the staged weight upload on the GPU), the
#              Qwen3.5 GPU gates, step-seam, executor, engine and prefix-cache tests, and the
#              fixtures served by gdn-server (gpu_served, gpu_served_structured,
#              prefix_cache_chat; on the fixtures just made, else the committed ones)
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
# gate LOG BINARY MODULE [VAR=VALUE ...]: one GPU gate, a module of a carried
# test binary (prepare_carry.sh), with a missing GPU a failure.
gate() {
  local log=$1 bin=$2 module=$3; shift 3
  if [ ! -x ".carry/bin/$bin" ]; then echo "### $module: .carry/bin/$bin not carried" >> "$log"; return 0; fi
  { echo "### GDN_REQUIRE_GPU=1 $* $bin $module::"
    env GDN_REQUIRE_GPU=1 "$@" ".carry/bin/$bin" "$module::" --test-threads=1 --nocapture; } >> "$log" 2>&1 || rc=1
}
if has tests; then
  : > "$OUT/tests.log"
  gate "$OUT/tests.log" kernels_tests gpu_prefill
  gate "$OUT/tests.log" kernels_tests gpu_prefill CUDA_DISABLE_PTX_JIT=1
  gate "$OUT/tests.log" kernels_tests gpu_model_ops
  gate "$OUT/tests.log" kernels_tests gpu_deltanet_decode CUDA_DISABLE_PTX_JIT=1
  gate "$OUT/tests.log" kernels_tests gpu_moe_ops CUDA_DISABLE_PTX_JIT=1
  grep -E "^test result|^### " "$OUT/tests.log"
fi
if has dsl; then
  : > "$OUT/dsl.log"
  gate "$OUT/dsl.log" kernels_tests gpu_dsl_prefill CUDA_DISABLE_PTX_JIT=1
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
  if [ -x .carry/bin/qwen35_lib ]; then
    { echo "### GDN_REQUIRE_GPU=1 qwen35_lib"; GDN_REQUIRE_GPU=1 .carry/bin/qwen35_lib --test-threads=1 --nocapture; } >> "$OUT/qwen35.log" 2>&1 || rc=1
  fi
  for m in gpu_forward gpu_moe_forward gpu_steps gpu_executor gpu_engine gpu_arena gpu_sampling gpu_prefix_cache gpu_snapshot_share; do
    gate "$OUT/qwen35.log" qwen35_tests "$m"
  done
  for m in gpu_served gpu_served_structured prefix_cache_chat; do
    gate "$OUT/qwen35.log" server_tests "$m"
  done
  grep -E "^### |^test |^test result|panicked" "$OUT/qwen35.log"
fi
if has qbench; then
  .carry/bin/qwen35_bench > "$OUT/qbench.jsonl" 2> "$OUT/qbench.err" || rc=1
  cat "$OUT/qbench.jsonl"; tail -5 "$OUT/qbench.err"
fi
if has skinny; then
  : > "$OUT/skinny.log"
  gate "$OUT/skinny.log" kernels_tests gpu_skinny_linear CUDA_DISABLE_PTX_JIT=1
  gate "$OUT/skinny.log" kernels_tests gpu_swiglu_gemm CUDA_DISABLE_PTX_JIT=1
  grep -E "^test |^test result|panicked|^shape |worst error" "$OUT/skinny.log" | tail -40
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
