#!/usr/bin/env bash
# `gdn-gen verify` on the H200 with its own Python (3.12.3, the cp312 wheel
# set) and NVIDIA's toolkit: shows whether the CuTe DSL objects built there are
# the lock's bytes (issue 13). The inputs (~172 MiB: the lock's cp312 DSL wheel
# set and both FlashInfer wheels) exceed what one device call carries (64 MiB
# with the working tree), so they travel in parts on consecutive calls while
# the machine stays warm, and wait in /tmp there.
#
#   here:  checks/gpu/dsl_verify_parts.sh pack      -> .carry/dslv/p0 .. pN (git-ignored),
#                                                     p0 also holds gdn-gen and SHA256SUMS
#   there: checks/gpu/dsl_verify_parts.sh stash     (one call per part but the last, carrying that part)
#   there: checks/gpu/dsl_verify_parts.sh run       (the last call, carrying the last part): stashes it,
#          checks every part against SHA256SUMS, unpacks, runs gdn-gen verify, writes $OUT/dsl-verify.log
# Without every part in /tmp (the machine went back between calls) `run` says
# which are missing and fails; nothing is verified then.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PART_MIB=45
stash=/tmp/gdn-dslv

pack() {
  local inputs=target/gdn-cache/downloads
  rm -rf .carry/dslv && mkdir -p .carry/dslv/p0 /tmp/gdn-dslv-pack
  cargo build -q --release -p gdn-gen
  # The inputs a --toolkit-root build with Python 3.12 uses: the kernel sources
  # and the DSL wheels for 3.12 (python-independent ones included).
  python3 - "$inputs" > /tmp/gdn-dslv-pack/list <<'EOF'
import json, sys
lock = json.load(open("gdn-bundle.lock.json"))
for i in lock["inputs"]:
    if i["role"] == "kernel-source" or (i["role"].startswith("dsl-") and i.get("python") in (None, "3.12")):
        print(i["filename"], i["sha256"], i["url"])
EOF
  while read -r name sha url; do
    [ -f "$inputs/$name" ] || curl -fsSL -o "$inputs/$name" "$url"
    echo "$sha  $inputs/$name" | sha256sum -c --quiet -
  done < /tmp/gdn-dslv-pack/list
  tar -cf /tmp/gdn-dslv-pack/inputs.tar -C "$inputs" $(cut -d' ' -f1 /tmp/gdn-dslv-pack/list)
  ( cd /tmp/gdn-dslv-pack && rm -f chunk.* && split -b ${PART_MIB}M -d -a 1 inputs.tar chunk. )
  local n=0
  for c in /tmp/gdn-dslv-pack/chunk.*; do
    mkdir -p ".carry/dslv/p$n" && mv "$c" ".carry/dslv/p$n/${c##*/}"; n=$((n + 1))
  done
  cp target/release/gdn-gen .carry/dslv/p0/
  ( cd .carry/dslv && sha256sum p*/chunk.* > p0/SHA256SUMS && sha256sum /tmp/gdn-dslv-pack/inputs.tar | cut -d' ' -f1 > p0/TAR_SHA256 )
  rm -rf /tmp/gdn-dslv-pack
  du -sh .carry/dslv/p*
  echo "parts: $n (carry one per call: .carry/dslv/p0 .. .carry/dslv/p$((n - 1)))"
}

stash_parts() {
  mkdir -p "$stash"
  for p in .carry/dslv/p*; do
    [ -d "$p" ] || continue
    cp -r "$p" "$stash/" && echo "stashed $(basename "$p"): $(ls "$p" | tr '\n' ' ')"
  done
  ls "$stash"
}

run() {
  stash_parts
  OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
  local log="$OUT/dsl-verify.log"
  [ -f "$stash/p0/SHA256SUMS" ] || { echo "part p0 (gdn-gen, SHA256SUMS) is not in $stash: carry it first" | tee "$log"; exit 1; }
  ( cd "$stash" && sha256sum -c p0/SHA256SUMS ) > "$OUT/dsl-verify-parts.txt" 2>&1 || {
    cat "$OUT/dsl-verify-parts.txt"; echo "missing or damaged parts (the machine may have gone back between calls): carry them again" | tee "$log"; exit 1; }
  mkdir -p /tmp/gdn-dslv-whl
  cat "$stash"/p*/chunk.* > /tmp/gdn-dslv.tar
  [ "$(sha256sum < /tmp/gdn-dslv.tar | cut -d' ' -f1)" = "$(cat "$stash/p0/TAR_SHA256")" ] || { echo "reassembled tar has the wrong sha256" | tee "$log"; exit 1; }
  tar -xf /tmp/gdn-dslv.tar -C /tmp/gdn-dslv-whl
  {
    set +e
    echo "# gdn-gen verify on $(hostname) at ${GDN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}: --toolkit-root /usr/local/cuda, --python python3, offline"
    python3 --version; /usr/local/cuda/bin/nvcc --version | tail -2; gcc --version | head -1
    grep -m1 'model name' /proc/cpuinfo
    ls /tmp/gdn-dslv-whl
    time "$stash/p0/gdn-gen" verify --toolkit-root /usr/local/cuda --python python3 --offline \
      --inputs-dir /tmp/gdn-dslv-whl --cache /tmp/gdn-dslv-cache --out /tmp/gdn-dslv-bundle --jobs 8
    echo "verify rc=$?"
  } > "$log" 2>&1
  grep -E "DIFFERS|MISSING|error|verify|Python|model name" "$log"
  grep -q "^verify rc=0" "$log"
}

case "${1:-}" in
  pack) pack ;;
  stash) stash_parts ;;
  run) run ;;
  *) echo "usage: $0 pack | stash | run" >&2; exit 2 ;;
esac
