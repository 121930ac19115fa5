#!/usr/bin/env bash
# Where time to first token goes at concurrency 1 (issue #10's TTFT goal; a
# benchmark, not a test). For each prompt-length set and prefix-cache mode, a
# fresh gdn-server with --request-timeline serves sglang bench_serving's c = 1
# run (the same requests as serve_bench.sh's c = 1 rows: random-ids, seed 1,
# one warm-up request, ignore_eos); then qwen35_bench times the runtime's
# prefill at the nominal lengths and at the lengths the server's tokenizer
# actually gave, on the served checkpoint's weights and on random ones; then
# checks/bench/ttft_breakdown.py prints, per set and mode, the client's TTFT
# next to the server's timeline (tokenizer, queue, every engine step with the
# executor's host prep / launch / device forward / sampling, the response) and
# the runtime's prefill.
#   checks/bench/ttft_breakdown.sh [SETS] [PROMPTS]
# SETS: comma list of prompt lengths (default 1024,8192); PROMPTS per set
# (default 8). CACHE_MODES (default "off on tok1"; tok1: cache off and the
# prompt tokenized on one thread, GDN_TOKENIZER_THREADS=1, as before the
# parallel tokenizer), OUT_LEN (default 256, as the sweep), SERVER_ARGS (more
# gdn-server flags). Run from the repository root,
# like serve_bench.sh, whose setup it reuses (SETUP_ONLY=1: the checkpoint in
# /tmp/q4b, the tokenizer, sglang in /tmp/sgl). Works in /tmp/ttft; leaves
# $OUT/ttft_breakdown.txt and every raw file in $OUT/ttft_raw.tar.gz
# (`checks/bench/ttft_breakdown.py DIR` reads them again where unpacked).
set -uo pipefail
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
SETUP_ONLY=1 checks/bench/serve_bench.sh || { echo "setup failed"; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') \
  -name 'libcublas.so.13*' 2>/dev/null | head -1)
[[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
sets=${1:-1024,8192}; prompts=${2:-8}; out_len=${OUT_LEN:-256}
T=/tmp/ttft; rm -rf "$T"; mkdir -p "$T"; : > "$T/runs.tsv"
port=8002
# Clocks, temperature and power at each phase: a hot GPU runs long prefills
# slower, and the sweep's runtime numbers were taken before the servers ran.
gpu_state() { echo "$1: $(nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1)" >> "$T/gpu_state.log"; }
for mode in ${CACHE_MODES:-off on tok1}; do
  flag=--enable-prefix-caching; [ "$mode" != on ] && flag=--no-enable-prefix-caching
  threads=; [ "$mode" = tok1 ] && threads=1
  for len in ${sets//,/ }; do
    # A fresh server per set: with the cache on, the longer set's prompts
    # begin with the shorter set's (same seed), which would make hits.
    log=server_${mode}_${len}.log
    GDN_TOKENIZER_THREADS=$threads .carry/bin/gdn-server --model /tmp/q4b --served-model-name q4b --port $port --device gpu \
      --max-num-seqs 128 --max-model-len 9216 --sse-keepalive-secs 0 --request-timeline \
      $flag ${SERVER_ARGS:-} > "$T/$log" 2>&1 &
    server=$!
    until curl -sf -o /dev/null http://127.0.0.1:$port/health; do
      kill -0 $server 2>/dev/null || { echo "server exited"; tail -20 "$T/$log"; exit 1; }
      sleep 0.05
    done
    echo "[$(date -u +%T)] cache $mode, $len-token prompts x $prompts, c = 1"
    gpu_state "before cache $mode $len"
    client=client_${mode}_${len}.jsonl
    timeout 600 python3 /tmp/sgl/sglang/bench_serving.py --backend vllm \
      --base-url http://127.0.0.1:$port --model q4b --tokenizer /tmp/q4b \
      --dataset-name random-ids --random-input-len "$len" --random-output-len "$out_len" \
      --random-range-ratio 1.0 --num-prompts "$prompts" --max-concurrency 1 --seed 1 \
      --output-file "$T/$client" --output-details > "$T/client_${mode}_${len}.log" 2>&1 \
      || { echo "client failed:"; tail -5 "$T/client_${mode}_${len}.log"; }
    grep -E "Median TTFT|Mean TTFT" "$T/client_${mode}_${len}.log"
    kill -TERM $server; wait $server
    printf '%s\t%s\t%s\t%s\n' "$mode" "$len" "$log" "$client" >> "$T/runs.tsv"
  done
done
# The runtime alone: the nominal lengths and the server's (median per set).
lens=$(python3 checks/bench/ttft_breakdown.py --lengths "$T")
echo "[$(date -u +%T)] qwen35_bench prefill at $lens (served weights, then random)"
gpu_state "before qwen35_bench"
.carry/bin/qwen35_bench prefill --prefill-lens "$lens" --model /tmp/q4b > "$T/runtime_served.jsonl" 2> "$T/runtime_served.err"
.carry/bin/qwen35_bench prefill --prefill-lens "$lens" > "$T/runtime_random.jsonl" 2> "$T/runtime_random.err"
gpu_state "after qwen35_bench"
python3 checks/bench/ttft_breakdown.py "$T" | tee "$T/breakdown.txt"
cp "$T/breakdown.txt" "$OUT/ttft_breakdown.txt"
tar -czf "$OUT/ttft_raw.tar.gz" -C /tmp ttft
