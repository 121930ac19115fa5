#!/bin/bash
# Constrained decoding on the H200: the random 4B checkpoint served by
# gdn-server (GPU executor), structured_bench.py unconstrained vs a JSON schema.
set -u
SETUP_ONLY=1 OUT=$OUT bash checks/bench/serve_bench.sh > $OUT/setup.log 2>&1; echo "setup rc=$?"
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
.carry/bin/gdn-server --model /tmp/q4b --served-model-name q4b --port 8000 --device gpu --max-num-seqs 64 --max-model-len 4096 > $OUT/server.log 2>&1 &
for i in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.5; done
timeout 200 python3 .gpucarry/structured_bench.py --base http://127.0.0.1:8000 --model q4b --concurrency 1,8,32,64 --requests 16 --max-tokens 128 | tee $OUT/structured_bench.jsonl
kill %1; wait
