#!/usr/bin/env bash
# Copied from ../shared/peer-vllm/serve.sh (2026-12-03, outside this
# repository); changed: the pid file, the wait's limit (START_TIMEOUT), a
# start that finds its server still starting waits for it instead of starting
# another, and --max-num-seqs / --gpu-memory-utilization from the settings
# both servers share (the copy had 128 and 0.85 fixed). Called by checks/bench/peer_vllm.sh's start phase.
# On the H200: starts vLLM's OpenAI server on MODEL at PORT (default 8001) in its
# own process group (setsid), so it outlives the device call that started it; waits
# for /health and prints "VLLM_READY startup_s=N" (or VLLM_DIED / VLLM_TIMEOUT + log).
# EXTRA_ARGS: more vLLM flags (prefix caching, the state dtype). MAX_NUM_SEQS
# (default 128) and GPU_MEMORY_UTILIZATION (default 0.9) as serve_bench.sh
# gives them to gdn-server. PID_FILE holds the
# server's pid, which is also its process group: stop it with `kill -TERM -- -PID`
# (a broad `pkill -f vllm` also matches the shell running the device command).
set -uo pipefail
PY=${PY:-python3}; PORT=${PORT:-8001}; MODEL=${MODEL:?MODEL}; LOG=${LOG:-/tmp/vllm_serve.log}
PID_FILE=${PID_FILE:-/tmp/vllm_serve.pid}; START_TIMEOUT=${START_TIMEOUT:-540}
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 NCCL_NVLS_ENABLE=0 VLLM_CACHE_ROOT=/tmp/vllm_cache
t0=$(date +%s)
if [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
  echo "vLLM (pid $(cat "$PID_FILE")) already runs: waiting for /health"
else
  # GDN prefill on FLA's Triton kernels: FlashInfer's CuTe DSL GDN kernel needs the nvidia-cutlass-dsl
  # wheels (about 180 MB more), without which vLLM 0.26.0 dies on the first prefill.
  # shellcheck disable=SC2086  # EXTRA_ARGS is a list of flags
  setsid nohup "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name q4b --port "$PORT" \
    --max-model-len 9216 --max-num-seqs "${MAX_NUM_SEQS:-128}" \
    --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.9}" --language-model-only \
    --gdn-prefill-backend triton ${EXTRA_ARGS:-} > "$LOG" 2>&1 < /dev/null &
  echo $! > "$PID_FILE"; echo "$t0" > "$PID_FILE.t0"
fi
launched=$(cat "$PID_FILE.t0" 2>/dev/null || echo "$t0")
while [ $(( $(date +%s) - t0 )) -lt "$START_TIMEOUT" ]; do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && { echo "VLLM_READY startup_s=$(( $(date +%s) - launched ))"; exit 0; }
  kill -0 "$(cat "$PID_FILE")" 2>/dev/null || { echo VLLM_DIED; tail -40 "$LOG"; exit 1; }
  sleep 2
done
echo "VLLM_TIMEOUT after ${START_TIMEOUT} s (still starting: run the start phase again to keep waiting)"; tail -20 "$LOG"; exit 1
