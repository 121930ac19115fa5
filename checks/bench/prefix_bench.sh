#!/usr/bin/env bash
# Issue #11's shared-prefix and no-sharing workloads on the H200 (not a
# test): sglang's bench_serving against gdn-server on the 4B-shaped
# checkpoint of serve_bench.sh's setup (SETUP_ONLY=1 here), the prefix cache
# off then on, a fresh server per run, one run of the script for both.
#   checks/bench/prefix_bench.sh [WORKLOAD ...]   (default 8x8 16x16 noshare)
# WORKLOAD: GROUPSxPROMPTS (shared prefix) or noshare. SERVER_ARGS: more
# gdn-server flags (e.g. --request-timeline).
# Shared prefix: generated-shared-prefix, 2048-token system prompt,
# 128-token question, OUT_LEN (default 64) output tokens, concurrency 16,
# through /v1/completions (no chat marker: only branch points can hit).
# No sharing: random-ids 1024/256, 96 prompts at concurrency 32, a seed no
# other run uses and no warm-up request (bench_serving's warm-up repeats
# prompt 0, a hit): a clean figure for the "at most 2% lost" goal.
# MODES: the cache modes to run (default "off on"; one per device call when
# both do not fit its time limit, e.g. 32x32 with OUT_LEN=256);
# CLIENT_TIMEOUT: seconds a client run may take (default 300).
# The client is checks/bench/sglang_client.py (bench_serving with the
# tokenizer's vocabulary read once: see why there).
# Writes $OUT/prefix_bench.log (the client lines and the cache metrics of
# every run) and $OUT/prefix_<workload>_<off|on>.log.
set -uo pipefail
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
SETUP_ONLY=1 "$(dirname "$0")/serve_bench.sh" || { echo "setup failed"; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/prefix_bench.log"; }
port=8003
run() {  # $1: workload label, $2: off|on, then bench_serving arguments
  local label=$1 mode=$2; shift 2
  local flag=--enable-prefix-caching; [ "$mode" = off ] && flag=--no-enable-prefix-caching
  .carry/bin/gdn-server --model /tmp/q4b --served-model-name q4b --port $port --device gpu \
    --max-num-seqs 128 --max-model-len 9216 --sse-keepalive-secs 0 $flag ${SERVER_ARGS:-} \
    > "$OUT/prefix_server_${label}_$mode.log" 2>&1 &
  local server=$!
  until curl -sf -o /dev/null http://127.0.0.1:$port/health; do
    kill -0 $server 2>/dev/null || { log "server exited"; tail -5 "$OUT/prefix_server_${label}_$mode.log"; return 1; }
    sleep 0.1
  done
  log "$label, cache $mode"
  timeout "${CLIENT_TIMEOUT:-300}" python3 "$(dirname "$0")/sglang_client.py" /tmp/sgl/sglang/bench_serving.py --backend vllm \
    --base-url http://127.0.0.1:$port --model q4b --tokenizer /tmp/q4b "$@" \
    > "$OUT/prefix_${label}_$mode.log" 2>&1 || log "client failed: $(tail -3 "$OUT/prefix_${label}_$mode.log")"
  grep -E "Successful requests|Output token throughput|Total token throughput|Median TTFT|P99 TTFT|Median ITL" \
    "$OUT/prefix_${label}_$mode.log" | tee -a "$OUT/prefix_bench.log"
  curl -s http://127.0.0.1:$port/metrics | grep -E "^(vllm|gdn):prefix_cache" | tee -a "$OUT/prefix_bench.log"
  kill -TERM $server; wait $server
}
for workload in ${@:-8x8 16x16 noshare}; do
  for mode in ${MODES:-off on}; do
    if [ "$workload" = noshare ]; then
      run noshare $mode --dataset-name random-ids --random-input-len 1024 --random-output-len 256 \
        --random-range-ratio 1.0 --num-prompts 96 --max-concurrency 32 --seed 7 --warmup-requests 0
    else
      g=${workload%x*}; p=${workload#*x}
      run "gsp${g}x$p" $mode --dataset-name generated-shared-prefix --gsp-num-groups "$g" \
        --gsp-prompts-per-group "$p" --gsp-system-prompt-len 2048 --gsp-question-len 128 \
        --gsp-output-len "${OUT_LEN:-64}" --num-prompts $((g * p)) --max-concurrency 16 --seed 1
    fi
  done
done
