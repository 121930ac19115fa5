#!/usr/bin/env bash
# Copied from the first vLLM side-by-side's scripts (../shared/peer-vllm/fetch.sh,
# 2026-12-03, outside this repository); changed: the part size is PART_MIB, and
# the parts get a sha256 list. Called by checks/bench/peer_vllm.sh's fetch phase.
# On a CPU machine with a package index: downloads the vLLM 0.26.0 wheel set for
# the H200's Python 3.12 / torch 2.11.0+cu130 (wheels.txt, ~390 MB; torch, triton,
# numpy, transformers and tokenizers are already on the H200) and packs it into
# parts of at most PART_MIB MiB (default 56), one per device call (the device
# tool carries 64 MiB with the working tree).
#   fetch.sh OUT_DIR        -> OUT_DIR/whl/*.whl, OUT_DIR/part??, OUT_DIR/parts.sha256
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); out=${1:?OUT_DIR}; mkdir -p "$out/whl"
part_mib=${PART_MIB:-56}
while read -r spec; do
  [ -z "$spec" ] && continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any -d "$out/whl" "$spec" \
    || { echo "fetch.sh: could not download $spec" >&2; exit 1; }
done < "$here/wheels.txt"
# One wheel per line of wheels.txt: a stale wheel left in OUT_DIR/whl from another
# set would be installed beside the pinned one.
[ "$(ls "$out"/whl/*.whl | wc -l)" -eq "$(grep -c . "$here/wheels.txt")" ] \
  || { echo "fetch.sh: $out/whl holds other wheels than wheels.txt names; empty it and fetch again" >&2; exit 1; }
du -sh "$out/whl"; rm -f "$out"/part?? "$out/parts.sha256"
tar -cf - -C "$out" whl | split -b "${part_mib}m" - "$out/part"
(cd "$out" && sha256sum part?? > parts.sha256)
ls -la "$out"/part??
