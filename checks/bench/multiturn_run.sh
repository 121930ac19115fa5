#!/usr/bin/env bash
# Issue #11 (b) on the H200 (not a test): checks/bench/multiturn_bench.py
# against gdn-server on the 4B-shaped checkpoint that serve_bench.sh wrote to
# /tmp/q4b, prefix cache off then on, each on a fresh server, in one run.
#   checks/bench/multiturn_run.sh [multiturn_bench.py options]
# SERVER_ARGS: more gdn-server flags (e.g. --request-timeline, then
# checks/bench/multiturn_timeline.py $OUT/multiturn_server_on.log).
# Needs .carry/bin/gdn-server (serve_bench.sh unpacks it). Appends the JSON
# lines to $OUT/multiturn.jsonl.
set -uo pipefail
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
for mode in off on; do
  flag=--enable-prefix-caching; [ $mode = off ] && flag=--no-enable-prefix-caching
  .carry/bin/gdn-server --model /tmp/q4b --served-model-name q4b --port 8001 --device gpu \
    --max-num-seqs 128 --max-model-len 9216 --sse-keepalive-secs 0 $flag ${SERVER_ARGS:-} \
    > "$OUT/multiturn_server_$mode.log" 2>&1 &
  server=$!
  until curl -sf -o /dev/null http://127.0.0.1:8001/health; do
    kill -0 $server 2>/dev/null || { echo "server exited"; tail -5 "$OUT/multiturn_server_$mode.log"; exit 1; }
    sleep 0.1
  done
  python3 "$(dirname "$0")/multiturn_bench.py" http://127.0.0.1:8001 q4b --label "cache_$mode" "$@" | tee -a "$OUT/multiturn.jsonl"
  curl -s http://127.0.0.1:8001/metrics | grep -E "^(vllm|gdn):prefix_cache" | tee -a "$OUT/multiturn.jsonl"
  kill -TERM $server; wait $server
done
