#!/usr/bin/env bash
# CPU-only AOT export of quack-kernels 0.6.5's plain SM90 GEMM (bf16, no epilogue) in a few
# tile/cluster configs, through the bundle's pinned CuTe DSL site (target/gdn-cache/dsl-site/*,
# from `gdn-gen build`). Same work dir setup as ../quack-probe-2026-12-01/probe.sh (its env.py
# and torch_stub.py). Usage: probe.sh [WORKDIR] [VARIANT...] (default /tmp/quack-gemm-probe, all
# variants of export_gemm.py). Outputs: WORKDIR/out/<variant>.{o,h,sm90.cubin}.
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
here=$repo/docs/results/quack-gemm-probe-2026-12-02
prev=$repo/docs/results/quack-probe-2026-12-01
root=${1:-/tmp/quack-gemm-probe}; shift || true
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(quack_gemm_sm90_128x192_c2x1_pp quack_gemm_sm90_128x256_c2x1_coop
                                      quack_gemm_sm90_128x128_c2x1_pp quack_gemm_sm90_256x128_c2x1_coop)
dsl=$(ls -d "$repo"/target/gdn-cache/dsl-site/*/nvidia_cutlass_dsl/.. | head -1)
rm -rf "$root" && mkdir -p "$root"/{src,deps,stub/torch,py/lib/site-packages,out}
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/whl" quack-kernels==0.6.5 einops==0.8.2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 -d "$root/whl" apache-tvm-ffi==0.1.15.post2
python3 -m zipfile -e "$root"/whl/quack_kernels-0.6.5-py3-none-any.whl "$root/src"
for w in "$root"/whl/einops-*.whl "$root"/whl/apache_tvm_ffi-*.whl; do python3 -m zipfile -e "$w" "$root/deps"; done
cp "$prev/torch_stub.py" "$root/stub/torch/__init__.py"
ln -s "$(cd "$dsl" && pwd)" "$root/py/lib/site-packages/dsl"
cd "$here"
failed=()
for v in "${variants[@]}"; do  # one scrubbed process per variant; a failing one does not stop the rest
  env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONHASHSEED=0 CUTE_DSL_ARCH=sm_90a QUACK_PROBE="$root" REPO="$repo" \
    PYTHONDONTWRITEBYTECODE=1 "$(command -v python3)" export_gemm.py "$root/out" "$v" || failed+=("$v")
done
[ ${#failed[@]} -eq 0 ] || echo "FAILED: ${failed[*]}" >&2
for o in "$root"/out/*.o; do nm -g --defined-only "$o" | awk '{print $3}'; done | sort | uniq -d | sed 's/^/duplicate symbol: /'
