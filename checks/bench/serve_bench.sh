#!/usr/bin/env bash
# Serving benchmark on the H200 (not a test): a Qwen3.5-4B-shaped checkpoint
# with random weights written here by make_random_checkpoint.py, served by
# gdn-server, driven by sglang's bench_serving (0.4.10, self-contained client;
# its wheel travels in .carry/whl; run as a script, since the package's
# __init__ pulls in the whole runtime) with ignore_eos and fixed lengths, next to
# the runtime's own step times from qwen35_bench in the same run.
#   checks/bench/serve_bench.sh [SETS] [CONCURRENCIES]
# SETS: comma list of IN/OUT (default 1024/256,8192/256); CONCURRENCIES:
# comma list (default 1,8,32,64,128). SERVER_ARGS: more gdn-server flags
# (e.g. --no-enable-prefix-caching); SKIP_RUNTIME=1: no qwen35_bench.
# SETUP_ONLY=1: only the setup (checkpoint, tokenizer, sglang), then exit.
# MODEL: the checkpoint folder (default /tmp/q4b), written by
# make_random_checkpoint.py with CHECKPOINT_ARGS (e.g. "--vl") when missing.
# PRESET: the model's shape, 4b (default) or 35b-a3b (about 67 GB: on the
# H200's 64 GiB disk only under /dev/shm, e.g. MODEL=/dev/shm/q35b).
# MAX_NUM_SEQS (default 128) and GPU_MEMORY_UTILIZATION (default 0.9, both
# servers' default): gdn-server's --max-num-seqs and
# --gpu-memory-utilization; peer_vllm.sh gives vLLM the same two values.
# COLD_START_ONLY=1: only the cold start,
# COLD_STARTS times (default 3), each with the server's `startup:` phase line
# and its gdn:startup_phase_seconds gauges; no runtime bench, no sweep.
# Needs .carry/bin/{gdn-server,qwen35_bench},
# .carry/whl/sglang-0.4.10-*.whl, .carry/tok/tokenizer.json.xz. Writes under $OUT.
set -uo pipefail
# .gpucarry (device tool carry) unpacks into .carry
if [ -d .gpucarry ]; then mkdir -p .carry/whl .carry/tok; tar -xJf .gpucarry/bin.tar.xz -C .carry; cp .gpucarry/whl/* .carry/whl/; cp .gpucarry/tok/* .carry/tok/; fi
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
sets=${1:-1024/256,8192/256}; concs=${2:-1,8,32,64,128}
# No network there: transformers must not try the Hub (it retries for a minute per run).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/serve_bench.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sgl .carry/whl/sglang-0.4.10-*.whl || exit 1
xz -dc .carry/tok/tokenizer.json.xz > /tmp/tokenizer.json
# PRESET: 4b (default) or 35b-a3b: the text config crates/qwen35 names
# (QWEN35_4B_TEXT, QWEN35_35B_A3B_TEXT), the checkpoint writer's --moe and
# qwen35_bench's --preset follow it.
PRESET=${PRESET:-4b}
case $PRESET in
  4b) preset_const=QWEN35_4B_TEXT; preset_src=crates/qwen35/src/config.rs; moe_arg=;;
  35b-a3b) preset_const=QWEN35_35B_A3B_TEXT; preset_src=crates/qwen35/src/config/moe.rs; moe_arg=--moe;;
  *) echo "PRESET: 4b or 35b-a3b, not $PRESET" >&2; exit 2;;
esac
python3 - "$preset_src" "$preset_const" > /tmp/${PRESET}_config.json <<'PY'
import json, re, sys
src = open(sys.argv[1]).read()
print(json.dumps(json.loads(re.search(sys.argv[2] + r': &str = r#"(.*?)"#', src, re.S).group(1))))
PY
MODEL=${MODEL:-/tmp/q4b}
if [ ! -f "$MODEL/model.safetensors.index.json" ] && [ ! -f "$MODEL/model.safetensors" ]; then
  python3 checks/bench/make_random_checkpoint.py /tmp/${PRESET}_config.json /tmp/tokenizer.json \
    crates/server/demo/chat_template.jinja "$MODEL" $moe_arg ${CHECKPOINT_ARGS:-} 2>&1 | tail -2 | tee -a "$OUT/serve_bench.log"
fi
cat "$MODEL"/*.safetensors > /dev/null  # weights in the page cache: cold start = process + load
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# SETUP_ONLY=1: stop here (checks/bench/ttft_breakdown.sh shares this setup).
[ -n "${SETUP_ONLY:-}" ] && exit 0

# 1. The runtime alone, same process conditions: prefill and decode step times.
if [ -z "${COLD_START_ONLY:-}" ] && [ -z "${SKIP_RUNTIME:-}" ]; then
  log "runtime step times (qwen35_bench)"
  .carry/bin/qwen35_bench --preset "$PRESET" --decode-batches "$concs" > "$OUT/runtime.jsonl" 2> "$OUT/runtime.err"
  cat "$OUT/runtime.jsonl"
fi

# 2. Cold start: process start to /health 200, then the server's own
# breakdown (its `startup:` line and gauges).
cold_start() {  # $1: server log file
  start=$(date +%s.%N); log "server start"
  # Each server log line gets a wall-clock stamp (where start-up time goes).
  .carry/bin/gdn-server --model "$MODEL" --served-model-name q4b --port 8000 --device gpu \
    --max-num-seqs "${MAX_NUM_SEQS:-128}" --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.9}" \
    --max-model-len 9216 --sse-keepalive-secs 0 ${SERVER_ARGS:-} \
    > >(while IFS= read -r l; do printf '%s %s\n' "$(date -u +%T.%N | cut -c1-12)" "$l"; done > "$1") 2>&1 &
  server=$!
  until curl -sf -o /dev/null http://127.0.0.1:8000/health; do
    kill -0 $server 2>/dev/null || { log "server exited"; tail -20 "$1"; exit 1; }
    sleep 0.05
  done
  log "cold start: $(python3 -c "print(round($(date +%s.%N) - $start, 2))") s (process start to /health 200, weights in page cache)"
  sleep 0.2  # the startup line follows ready by at most a few ms
  grep -o 'startup:.*' "$1" | tee -a "$OUT/serve_bench.log"
  grep -oE '(request memory|state arena|GPU executor): .*' "$1" | tee -a "$OUT/serve_bench.log"
  curl -s http://127.0.0.1:8000/metrics | grep '^gdn:startup_phase_seconds' >> "$OUT/serve_bench.log"
}
if [ -n "${COLD_START_ONLY:-}" ]; then
  for i in $(seq "${COLD_STARTS:-3}"); do
    cold_start "$OUT/server$i.log"
    kill -TERM $server; wait $server
  done
  exit 0
fi
cold_start "$OUT/server.log"

# 3. The sweep.
for set in ${sets//,/ }; do
  in=${set%/*}; out=${set#*/}
  for c in ${concs//,/ }; do
    n=$(( c < 8 ? 8 : c ))
    log "in $in out $out concurrency $c prompts $n"
    timeout 300 python3 /tmp/sgl/sglang/bench_serving.py --backend vllm \
      --base-url http://127.0.0.1:8000 --model q4b --tokenizer "$MODEL" \
      --dataset-name random-ids --random-input-len "$in" --random-output-len "$out" \
      --random-range-ratio 1.0 --num-prompts "$n" --max-concurrency "$c" --seed 1 \
      --output-file "$OUT/sweep.jsonl" > "$OUT/last_client.log" 2>&1 || log "client failed: $(tail -3 "$OUT/last_client.log")"
    grep -E "Successful requests|Output token throughput|Mean TTFT|Median TTFT|P99 TTFT|Median TPOT|P99 TPOT|Median ITL|P99 ITL" "$OUT/last_client.log" | tee -a "$OUT/serve_bench.log"
  done
done
curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:(num_preemptions_total|num_requests_running|kv_cache_usage_perc|prefix_cache_queries_total|prefix_cache_hits_total)|^gdn:(state_slots|recomputed_tokens_total|max_concurrency|cache_pool_bytes)" | tee -a "$OUT/serve_bench.log"
kill -TERM $server; wait $server
log "server exit status $?"
