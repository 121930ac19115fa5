#!/bin/bash
# Call 5: structured outputs with the matchers advanced in the mask jobs.
set -u
OUT=${OUT:-/tmp/out}; R=/tmp/r5; mkdir -p $R
echo "commit: $(cat .gpu3/COMMIT)" > $R/machine.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $R/machine.txt; nproc >> $R/machine.txt
t0=$(date +%s)
SETUP_ONLY=1 OUT=$R bash checks/bench/serve_bench.sh > $R/setup.log 2>&1; echo "setup rc=$? $(( $(date +%s)-t0 ))s"
for f in .gpu3/*.xz; do b=$(basename $f .xz); xz -dc $f > .carry/bin/$b; chmod +x .carry/bin/$b; done
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
.carry/bin/gdn-server --model /tmp/q4b --served-model-name q4b --port 8000 --device gpu --max-num-seqs 64 --max-model-len 4096 > $R/server.log 2>&1 &
for i in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.5; done
timeout 200 python3 checks/bench/structured_bench.py --base http://127.0.0.1:8000 --model q4b --concurrency 1,8,32,64,64,32 --requests 16 --max-tokens 128 > $R/structured_bench.jsonl 2>$R/structured_bench.err
grep concurrency $R/structured_bench.jsonl | grep -v mode
curl -s http://127.0.0.1:8000/metrics | grep "^gdn:structured" > $R/metrics_after.txt
kill %1; wait; echo "bench $(( $(date +%s)-t0 ))s"
( export GDN_REQUIRE_GPU=1 CUDA_DISABLE_PTX_JIT=1
  for t in gpu_served_structured; do echo "### $t"; timeout 150 .carry/bin/$t --test-threads=1 --nocapture; done ) > $R/gates.log 2>&1
grep -E "^### |^test |test result|Gpu\)|panicked" $R/gates.log; echo "gates $(( $(date +%s)-t0 ))s"
tar -cJf $OUT/results5.tar.xz -C /tmp r5
