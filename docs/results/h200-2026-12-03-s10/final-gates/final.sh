#!/bin/bash
# Final gates of the tenth session: every GPU test binary carried (release,
# GDN_REQUIRE_GPU=1, kernel gates with CUDA_DISABLE_PTX_JIT=1), then the
# decode step with both recurrent-state dtypes.
set -u
cd "$(dirname "$0")"
# Test binaries find the demo checkpoint and fixtures where they were built.
[ -e /work/main/crates ] || { mkdir -p /work/main && ln -sfn "$(cd .. && pwd)/crates" /work/main/crates; }
for f in *.xz; do unxz -k -f "$f"; done; chmod +x ./*[!h]
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export QWEN35_FIXTURES=$PWD/../crates/qwen35/tests/fixtures GDN_REQUIRE_GPU=1
run() {  # name, env...
  local name=$1; shift
  { echo "### $* $name"; env "$@" timeout 150 ./$name --test-threads=1 --nocapture; echo "rc=$?"; } > $OUT/$name.log 2>&1
  echo "$name: $(grep -E '^test result' $OUT/$name.log | tail -1) $(grep -c panicked $OUT/$name.log) panics"
}
for t in gpu_deltanet_decode gpu_sampling gpu_model_ops; do run $t CUDA_DISABLE_PTX_JIT=1; done
for t in qwen35_lib gpu_forward gpu_steps gpu_executor gpu_engine gpu_snapshot_share gpu_prefix_cache gpu_served; do run $t CUDA_DISABLE_PTX_JIT=1; done
for d in float32 bfloat16; do
  timeout 100 ./qwen35_bench decode --decode-batches 1,8,32,64,128 --contexts 1024,8192 --state-dtype $d > $OUT/qwen35_bench_$d.jsonl 2>&1
done
python3 - <<'PY'
import json,os
o=os.environ['OUT']
for d in ('float32','bfloat16'):
    for l in open(f'{o}/qwen35_bench_{d}.jsonl'):
        if not l.startswith('{'): continue
        r=json.loads(l)
        if r.get('cuda_graphs') and 'step_ms' in r: print(d, r['decode_batch'], r['context'], r['step_ms'], r['memory_floor_ms'], r['step_over_floor'])
PY
