#!/usr/bin/env bash
# gdn-server side by side with vLLM 0.26.0 on the H200 (a benchmark, not a
# test): one random-weight Qwen3.5-4B checkpoint in the VL layout (vLLM has no
# text-only Qwen3.5 entry) served by each in turn, driven by the client and
# sweep of serve_bench.sh (sglang 0.4.10 bench_serving, --backend vllm,
# random-ids, fixed lengths, ignore_eos, seed 1, max(c, 8) prompts).
#   PHASE=P[,P...] checks/bench/peer_vllm.sh [SETS] [CONCURRENCIES]
# SETS, CONCURRENCIES: as serve_bench.sh (default 1024/256,8192/256 and
# 1,8,32,64,128). The wheel set and vLLM's install and start are
# checks/bench/peer_vllm/ (copied from the first side-by-side; provenance in
# their headers). Phases, each safe to repeat, one or a few per device call
# (10 minutes each; /tmp and the setsid vLLM survive between calls while the
# machine stays warm):
#   fetch    here, with a package index: the wheels into .peer/, packed in
#            parts that fit one device call beside the working tree (PART_MIB,
#            default from the tree's size, at most 56); prints the call plan
#   carry    there: copy the carried .peer/part?? and .peer/parts.sha256 to
#            /tmp/peerstash (one part per call)
#   install  there: check and unpack the parts, install vLLM into /tmp/site
#   setup    there: sglang's client, the tokenizer and the VL checkpoint
#            (serve_bench.sh's setup; needs serve_bench.sh's .carry), one
#            folder per state dtype, /tmp/q4b_vl_float32 and _bfloat16, whose
#            only difference is config.json's text_config.mamba_ssm_dtype
#   start    there: vLLM with prefix caching and the state dtype below; waits
#            for /health (START_TIMEOUT, default 540 s); a start still under
#            way is waited for, a server of other settings is stopped first
#   sweep    there: the client against vLLM, cell by cell; cells already
#            measured are skipped, and no new cell starts after SWEEP_BUDGET_S
#            (default 420 s): run the phase again to go on
#   stop     there: vLLM stopped by its pid file (its process group)
#   ours     there: vLLM stopped, then serve_bench.sh on the same checkpoint,
#            cells and prefix-cache mode (SKIP_RUNTIME=1), with
#            --mamba-ssm-cache-dtype when this gdn-server has that flag
#   report   there or here: the markdown table (checks/bench/peer_vllm_table.py)
# PRESET: 4b (default) or 35b-a3b (the MoE model, its checkpoint under
# /dev/shm: about 67 GB, past the H200 machine's 64 GiB disk).
# STATE_DTYPE: float32 (default; released Qwen3.5 configs say so) or bfloat16,
# on both servers. PREFIX_CACHE: off (default) or on, on both servers.
# MAX_NUM_SEQS (default 128) and GPU_MEMORY_UTILIZATION (default 0.9): one
# value for both servers' --max-num-seqs and --gpu-memory-utilization.
# VLLM_ARGS / SERVER_ARGS: more vLLM / gdn-server flags. GDN_COMMIT: the commit
# the binaries were built from, for the table's header. FORCE=1: measure again.
# DRY_RUN=1: no GPU, nothing run: checks the files and the wheel list, tests
# the table, and prints each phase's commands (all phases when PHASE is unset).
# Logs: /tmp/peer_vllm/*.log; every phase copies this settings' results to $OUT
# (peer_vllm.log, vllm_TAG.jsonl, ours_TAG.jsonl, peer_vllm_TAG.md and logs,
# TAG = PREFIX_CACHE_STATE_DTYPE, e.g. off_float32).
set -uo pipefail
self=checks/bench/peer_vllm.sh
cd "$(dirname "$0")/../.." || exit 1
here=checks/bench
sets=${1:-1024/256,8192/256}; concs=${2:-1,8,32,64,128}
STATE_DTYPE=${STATE_DTYPE:-float32}; PREFIX_CACHE=${PREFIX_CACHE:-off}
OUT=${OUT:-/tmp/gdn-out}; W=/tmp/peer_vllm; STASH=/tmp/peerstash
# PRESET: 4b (default) or 35b-a3b, as serve_bench.sh; the 35B-A3B's
# checkpoint (about 67 GB) lives in /dev/shm, past the disk's size.
PRESET=${PRESET:-4b}
case $PRESET in
  4b) base=/tmp/q4b_vl; model_name=Qwen3.5-4B;;
  35b-a3b) base=/dev/shm/q35b_vl; model_name=Qwen3.5-35B-A3B;;
  *) echo "PRESET: 4b or 35b-a3b, not $PRESET" >&2; exit 2;;
esac
# Both servers read these two (serve_bench.sh, peer_vllm/serve.sh).
MAX_NUM_SEQS=${MAX_NUM_SEQS:-128}; GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
export PRESET MAX_NUM_SEQS GPU_MEMORY_UTILIZATION
tag=${PREFIX_CACHE}_$STATE_DTYPE; model=${base}_$STATE_DTYPE; port=8001
pid_file=$W/vllm.pid
case $STATE_DTYPE in float32|bfloat16) ;; *) echo "STATE_DTYPE: float32 or bfloat16, not $STATE_DTYPE" >&2; exit 2;; esac
case $PREFIX_CACHE in off|on) ;; *) echo "PREFIX_CACHE: off or on, not $PREFIX_CACHE" >&2; exit 2;; esac
dry=${DRY_RUN:-}
# No network there: transformers (the client's tokenizer) must not try the Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# x CMD...: run CMD, or under DRY_RUN print it. xl LOG CMD...: the same, its
# output also appended to LOG.
x() { if [ -n "$dry" ]; then echo "  + $(printf '%q ' "$@")"; else "$@"; fi; }
xl() {
  local f=$1; shift
  if [ -n "$dry" ]; then echo "  + $(printf '%q ' "$@")2>&1 | tee -a $f"; else "$@" 2>&1 | tee -a "$f"; return "${PIPESTATUS[0]}"; fi
}
log() { echo "[$(date -u +%T)] $*"; [ -n "$dry" ] || echo "[$(date -u +%T)] $*" >> "$W/peer_vllm.log"; }
[ -n "$dry" ] || mkdir -p "$W" "$OUT"
prefix_flag=--no-enable-prefix-caching; [ "$PREFIX_CACHE" = on ] && prefix_flag=--enable-prefix-caching

# Any process of its group: the engine's workers hold the GPU's memory too.
vllm_alive() { [ -f "$pid_file" ] && kill -0 -- "-$(cat "$pid_file")" 2>/dev/null; }
vllm_healthy() { curl -sf -o /dev/null "http://127.0.0.1:$port/health"; }
# Without it serve_bench.sh would write a text-layout checkpoint into $model.
need_checkpoint() {
  [ -n "$dry" ] || [ -f "$model/config.json" ] || { log "no checkpoint $model: run PHASE=setup first"; return 1; }
}

phase_fetch() {
  local part_mib=${PART_MIB:-}
  if [ -z "$part_mib" ]; then
    # What travels: tracked and untracked-not-ignored files (device tool: 64 MiB
    # with the carried paths), 4 MiB kept for the tree's growth.
    local tree_mib
    tree_mib=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
      | awk '{s += $1} END {print int(s / 1048576) + 1}')
    part_mib=$(( 64 - tree_mib - 4 )); [ "$part_mib" -gt 56 ] && part_mib=56
    echo "working tree ${tree_mib} MiB: parts of ${part_mib} MiB"
  fi
  [ "$part_mib" -ge 8 ] || { echo "parts of $part_mib MiB: the working tree leaves too little room" >&2; return 1; }
  x env PART_MIB="$part_mib" $here/peer_vllm/fetch.sh .peer || return 1
  [ -n "$dry" ] && return 0
  echo "device calls, one per part (carry [\".peer/partXX\", \".peer/parts.sha256\"]):"
  for p in .peer/part??; do echo "  PHASE=carry $self   carry: $p .peer/parts.sha256"; done
}

phase_carry() {
  x mkdir -p $STASH
  x cp -f .peer/parts.sha256 $STASH/ || return 1
  for p in .peer/part??; do
    [ -f "$p" ] || continue
    x cp -f "$p" $STASH/
  done
  [ -n "$dry" ] && return 0
  local want have
  want=$(awk '{print $2}' $STASH/parts.sha256); have=$(cd $STASH && ls part?? 2>/dev/null)
  log "carry: $(echo "$have" | wc -w) of $(echo "$want" | wc -w) parts in $STASH"
}

phase_install() {
  if [ -z "$dry" ] && [ -f $W/installed ]; then log "install: done before ($(cat $W/installed))"; return 0; fi
  xl $W/install.log env STASH=$STASH $here/peer_vllm/install.sh || { log "install failed"; return 1; }
  [ -n "$dry" ] || { tail -2 $W/install.log | head -1 > $W/installed; log "install: $(cat $W/installed)"; }
}

phase_setup() {
  # The 35B-A3B's experts are written fused, as the released files hold
  # them (both servers read that layout); it also keeps the writer's device
  # memory at the model's size.
  local ckpt_args="--vl --mamba-ssm-dtype float32"
  [ "$PRESET" = 35b-a3b ] && ckpt_args="$ckpt_args --save-fused"
  x env OUT=$W/setup MODEL=$base CHECKPOINT_ARGS="$ckpt_args" SETUP_ONLY=1 \
    $here/serve_bench.sh || { log "setup failed"; return 1; }
  x python3 $here/peer_vllm/checkpoint.py variant $base ${base}_float32 float32
  x python3 $here/peer_vllm/checkpoint.py variant $base ${base}_bfloat16 bfloat16
  x python3 $here/peer_vllm/checkpoint.py describe ${base}_float32 ${base}_bfloat16
}

phase_stop() {
  if [ -z "$dry" ] && ! vllm_alive; then log "stop: no vLLM running"; return 0; fi
  local pid; pid=$(cat "$pid_file" 2>/dev/null || echo PID)
  log "stop: vLLM pid $pid"
  x kill -TERM -- "-$pid"
  [ -n "$dry" ] && return 0
  for _ in $(seq 60); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  kill -0 -- "-$pid" 2>/dev/null && { log "stop: still there after 60 s, KILL"; kill -KILL -- "-$pid"; sleep 2; }
  rm -f "$pid_file" "$pid_file.t0" $W/vllm.tag
}

phase_start() {
  need_checkpoint || return 1
  if [ -z "$dry" ] && [ ! -f $W/installed ]; then log "start: vLLM not installed: run PHASE=install first"; return 1; fi
  if [ -z "$dry" ] && vllm_alive && [ "$(cat $W/vllm.tag 2>/dev/null)" != "$tag" ]; then
    log "start: vLLM of other settings ($(cat $W/vllm.tag 2>/dev/null)) running"; phase_stop
  fi
  [ -n "$dry" ] || echo "$tag" > $W/vllm.tag
  log "start: vLLM, prefix caching $PREFIX_CACHE, state $STATE_DTYPE"
  xl $W/peer_vllm.log env MODEL="$model" PORT=$port LOG=$W/vllm_server_$tag.log PID_FILE="$pid_file" START_TIMEOUT="${START_TIMEOUT:-540}" \
    EXTRA_ARGS="$prefix_flag --mamba-ssm-cache-dtype $STATE_DTYPE ${VLLM_ARGS:-}" \
    $here/peer_vllm/serve.sh
}

# One client run of serve_bench.sh's sweep, against vLLM.
client() {  # $1 in, $2 out, $3 concurrency
  local n=$(( $3 < 8 ? 8 : $3 ))
  x timeout 300 python3 /tmp/sgl/sglang/bench_serving.py --backend vllm \
    --base-url http://127.0.0.1:$port --model q4b --tokenizer "$model" \
    --dataset-name random-ids --random-input-len "$1" --random-output-len "$2" \
    --random-range-ratio 1.0 --num-prompts "$n" --max-concurrency "$3" --seed 1 \
    --output-file $W/vllm_$tag.jsonl
}

phase_sweep() {
  if [ -z "$dry" ]; then
    [ "$(cat $W/vllm.tag 2>/dev/null)" = "$tag" ] && vllm_healthy \
      || { log "sweep: no healthy vLLM with settings $tag: run PHASE=start first"; return 1; }
    [ -f /tmp/sgl/sglang/bench_serving.py ] || { log "sweep: no client in /tmp/sgl: run PHASE=setup first"; return 1; }
    [ -n "${FORCE:-}" ] && rm -f $W/vllm_$tag.jsonl $W/vllm_$tag.cells
  fi
  local t0; t0=$(date +%s)
  for set in ${sets//,/ }; do
    for c in ${concs//,/ }; do
      local in=${set%/*} out=${set#*/} key="$set/$c"
      if [ -z "$dry" ] && grep -qx "$key" $W/vllm_$tag.cells 2>/dev/null; then continue; fi
      if [ $(( $(date +%s) - t0 )) -gt "${SWEEP_BUDGET_S:-420}" ]; then
        log "sweep: paused before $key after ${SWEEP_BUDGET_S:-420} s: run PHASE=sweep again"; return 0
      fi
      log "sweep: vLLM in $in out $out concurrency $c"
      local clog=$W/client_vllm_${tag}_${in}_${out}_c$c.log
      if [ -n "$dry" ]; then client "$in" "$out" "$c"; continue; fi
      if client "$in" "$out" "$c" > "$clog" 2>&1; then echo "$key" >> $W/vllm_$tag.cells
      else log "client failed: $(tail -3 "$clog")"; fi
      grep -E "Successful requests|Output token throughput|Median TTFT|Median ITL" "$clog" | tee -a $W/peer_vllm.log
    done
  done
  log "sweep: every cell measured"
}

phase_ours() {
  need_checkpoint || return 1
  [ -n "$dry" ] || phase_stop  # vLLM holds 85% of the GPU's memory
  local args="$prefix_flag ${SERVER_ARGS:-}"
  local help=--mamba-ssm-cache-dtype
  if [ -n "$dry" ]; then
    echo "  (--mamba-ssm-cache-dtype only when \`.carry/bin/gdn-server --help\` lists it)"
  else
    help=$(.carry/bin/gdn-server --help 2>&1) || { log "ours: gdn-server --help failed: $(echo "$help" | tail -3)"; return 1; }
  fi
  if grep -q -- --mamba-ssm-cache-dtype <<<"$help"; then
    args="$args --mamba-ssm-cache-dtype $STATE_DTYPE"
  elif [ "$STATE_DTYPE" != float32 ]; then
    log "ours: this gdn-server has no --mamba-ssm-cache-dtype (its state is float32): no $STATE_DTYPE run"; return 1
  fi
  if [ -z "$dry" ] && [ -z "${FORCE:-}" ] && [ -f $W/ours_$tag.jsonl ]; then log "ours: measured before"; return 0; fi
  log "ours: gdn-server $args"
  x rm -rf $W/ours_$tag
  x env OUT=$W/ours_$tag MODEL="$model" SKIP_RUNTIME=1 SERVER_ARGS="$args" $here/serve_bench.sh "$sets" "$concs" \
    || { log "ours: serve_bench.sh failed"; return 1; }
  x cp $W/ours_$tag/sweep.jsonl $W/ours_$tag.jsonl
}

phase_report() {
  local machine; machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  local commit=${GDN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  x rm -f $W/peer_vllm_$tag.md
  xl $W/peer_vllm_$tag.md python3 $here/peer_vllm_table.py --ours $W/ours_$tag.jsonl --vllm $W/vllm_$tag.jsonl \
    --date "$(date -u +%F)" --commit "$commit" --machine "${machine:-unknown}" \
    --state-dtype "$STATE_DTYPE" --prefix-cache "$PREFIX_CACHE" --model "$model_name" \
    --max-num-seqs "$MAX_NUM_SEQS" --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION"
}

# Results back through $OUT (the device tool returns at most 8 files).
copy_out() {
  [ -n "$dry" ] && return 0
  for f in peer_vllm.log vllm_$tag.jsonl ours_$tag.jsonl peer_vllm_$tag.md; do
    [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"
  done
  [ -f "$W/vllm_server_$tag.log" ] && tail -c 4000000 "$W/vllm_server_$tag.log" > "$OUT/vllm_server_$tag.log"
  [ -f "$W/ours_$tag/serve_bench.log" ] && cp "$W/ours_$tag/serve_bench.log" "$OUT/ours_serve_bench_$tag.log"
  [ -f "$W/ours_$tag/server.log" ] && tail -c 4000000 "$W/ours_$tag/server.log" > "$OUT/ours_server_$tag.log"
}

# DRY_RUN's checks: every file the phases use, the wheel list, the table.
dry_checks() {
  local ok=1 f
  for f in $here/peer_vllm/{wheels.txt,fetch.sh,install.sh,serve.sh,checkpoint.py} $here/serve_bench.sh \
           $here/make_random_checkpoint.py $here/peer_vllm_table.py crates/server/demo/chat_template.jinja; do
    [ -e "$f" ] || { echo "missing: $f"; ok=0; }
  done
  for f in $self $here/peer_vllm/*.sh $here/serve_bench.sh; do bash -n "$f" || ok=0; done
  python3 -m py_compile $here/make_random_checkpoint.py $here/peer_vllm_table.py $here/peer_vllm/checkpoint.py || ok=0
  # The wheel list: NAME==VERSION lines, one per project, vLLM 0.26.0 among
  # them, none of the packages the H200 already has (install.sh keeps its own).
  python3 - $here/peer_vllm/wheels.txt <<'PY' || ok=0
import re, sys
lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
bad = [l for l in lines if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", l)]
names = [re.sub(r"[-_.]+", "-", l.split("==")[0]).lower() for l in lines]
dup = sorted({n for n in names if names.count(n) > 1})
own = sorted({"torch", "triton", "numpy", "transformers", "tokenizers"} & set(names))
errors = (["not NAME==VERSION: %s" % bad] if bad else []) + (["listed twice: %s" % dup] if dup else []) \
    + (["the H200's own packages listed: %s" % own] if own else []) \
    + ([] if "vllm==0.26.0" in lines else ["vllm==0.26.0 not listed"])
print("wheels.txt: %d wheels%s" % (len(lines), "".join("; " + e for e in errors)))
sys.exit(1 if errors else 0)
PY
  # The table from two known results: the numbers and the ratios as written.
  local t; t=$(mktemp -d)
  echo '{"random_input_len": 1024, "random_output_len": 256, "max_concurrency": 1, "completed": 8, "median_ttft_ms": 20.24, "median_itl_ms": 2.954, "output_throughput": 331.4}' > "$t/ours.jsonl"
  echo '{"random_input_len": 1024, "random_output_len": 256, "max_concurrency": 1, "completed": 7, "median_ttft_ms": 96.7, "median_itl_ms": 3.49, "output_throughput": 260.2}' > "$t/vllm.jsonl"
  local row; row=$(python3 $here/peer_vllm_table.py --ours "$t/ours.jsonl" --vllm "$t/vllm.jsonl" | grep '^| 1024/256')
  local header; header=$(python3 $here/peer_vllm_table.py --ours "$t/ours.jsonl" --vllm "$t/vllm.jsonl" --model Qwen3.5-35B-A3B)
  grep -q '^- Checkpoint: random-weight Qwen3.5-35B-A3B in the VL layout' <<<"$header" \
    || { echo "peer_vllm_table.py: the header does not name the model run"; ok=0; }
  [ "$row" = "| 1024/256 | 1 | 20.2 / 96.7* | 2.95 / 3.49* | 331 / 260* | 0.85x | 1.27x |" ] \
    || { echo "peer_vllm_table.py: unexpected row: $row"; ok=0; }
  rm -rf "$t"
  [ "$ok" = 1 ] && echo "dry run checks: ok"
  [ "$ok" = 1 ]
}

phases=${PHASE:-}
if [ -n "$dry" ]; then
  dry_checks || exit 1
  phases=${phases:-fetch,carry,install,setup,start,sweep,stop,ours,report}
fi
[ -n "$phases" ] || { sed -n '2,/^set -uo/p' $self | sed '$d'; exit 2; }
trap copy_out EXIT
rc=0
for p in ${phases//,/ }; do
  case $p in
    fetch|carry|install|setup|start|sweep|stop|ours|report) ;;
    *) echo "unknown phase $p" >&2; exit 2;;
  esac
  [ -n "$dry" ] && echo "== PHASE=$p (STATE_DTYPE=$STATE_DTYPE PREFIX_CACHE=$PREFIX_CACHE)"
  "phase_$p" || { rc=1; log "phase $p failed"; break; }
done
exit $rc
