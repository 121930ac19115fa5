#!/usr/bin/env bash
# CPU-only AOT export of quack-kernels 0.6.5's SM90 GEMM with a SwiGLU epilogue,
# through the pinned CuTe DSL site of the bundle (target/gdn-cache/dsl-site/*,
# made by `gdn-gen build`). Usage: probe.sh [WORKDIR] (default /tmp/quack-probe).
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
here=$repo/docs/results/quack-probe-2026-12-01
root=${1:-/tmp/quack-probe}
dsl=$(ls -d "$repo"/target/gdn-cache/dsl-site/*/ | head -1)
rm -rf "$root" && mkdir -p "$root"/{src,deps,stub/torch,py/lib/site-packages,out}
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/whl" quack-kernels==0.6.5 einops==0.8.2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 -d "$root/whl" apache-tvm-ffi==0.1.15.post2
python3 -m zipfile -e "$root"/whl/quack_kernels-0.6.5-py3-none-any.whl "$root/src"
for w in "$root"/whl/einops-*.whl "$root"/whl/apache_tvm_ffi-*.whl; do python3 -m zipfile -e "$w" "$root/deps"; done
cp "$here/torch_stub.py" "$root/stub/torch/__init__.py"
ln -s "$dsl" "$root/py/lib/site-packages/dsl"
cd "$here"
export_kernel() {  # OUT_DIR [VAR=VALUE...]: export_swiglu.py in a scrubbed environment
  local out=$1; shift
  env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONHASHSEED=0 CUTE_DSL_ARCH=sm_90a QUACK_PROBE="$root" REPO="$repo" \
    PYTHONDONTWRITEBYTECODE=1 "$@" "$(command -v python3)" export_swiglu.py "$out"
}
export_kernel "$root/out/run1"
export_kernel "$root/out/run2"
cmp "$root/out/run1/quack_swiglu_sm90.o" "$root/out/run2/quack_swiglu_sm90.o" && echo "two runs: .o identical"
# The variant for one [W_gate; W_up] weight tensor (the runtime's layout):
# what checks/gpu/swiglu_gemm_harness.cu links.
export_kernel "$root/out/concatB" CONCAT=B
