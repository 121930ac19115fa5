#!/usr/bin/env bash
# The 35B-A3B at 8192/256, c = 32 and 64, on one card: gdn-server as it
# was (slots reserved up front, the watermark's admission) and as it is
# now (the state arena, the new-token-ratio admission), same flags
# otherwise. On an H200, U = 0.54 leaves the room an H100 80GB has at
# 0.95 (the set-up). Run from the repository root on the GPU
# machine with serve_bench.sh's .carry (gdn-server, sglang, tokenizer).
set -uo pipefail
U=${U:-0.95}
mountpoint -q /dev/shm && mount -o remount,size=100G /dev/shm 2>/dev/null
export PRESET=35b-a3b MODEL=/dev/shm/q35b_vl SKIP_RUNTIME=1 MAX_NUM_SEQS=64 GPU_MEMORY_UTILIZATION=$U
export CHECKPOINT_ARGS="--vl --mamba-ssm-dtype float32 --save-fused"
base="--no-enable-prefix-caching --mamba-ssm-cache-dtype float32"
OUT=${OUT:-/tmp/gdn-out}
for run in ${RUNS:-old new}; do
  case $run in
    old) args="$base --admission-policy watermark";;
    new) args="$base --state-arena";;
  esac
  OUT=$OUT/$run SERVER_ARGS="$args" bash checks/bench/serve_bench.sh "${SETS:-8192/256}" "${CONCS:-32,64}"
done
