#!/usr/bin/env bash
# The kernels crate's build.rs must refuse a tampered or missing bundle, with
# the artifact and both hashes in the message, and accept the real one.
# Usage: checks/build_rs_fails_closed.sh   (after `gdn-gen build`)
set -uo pipefail
repo=$(git rev-parse --show-toplevel); cd "$repo"
work=$(mktemp -d /tmp/gdn-buildrs.XXXXXX); trap 'rm -rf "$work"' EXIT
passed=0; failed=0
expect_refusal() { # name bundle-dir pattern...
  local name=$1 dir=$2; shift 2
  local out status ok=1
  out=$(GDN_BUNDLE_DIR="$dir" cargo build -q -p gdn-kernels 2>&1); status=$?
  [ $status -ne 0 ] || ok=0
  for pat in "$@"; do grep -qF -- "$pat" <<<"$out" || ok=0; done
  if [ $ok -eq 1 ]; then passed=$((passed+1)); echo "PASS $name"; else failed=$((failed+1)); echo "FAIL $name"; echo "$out" | tail -5; fi
}
cp -r target/gdn-bundle "$work/flipped"
f=cubin/flashinfer_sm90_gva.sm_90a.cubin
python3 - "$work/flipped/$f" <<'PY'
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//3]^=1; open(p,'wb').write(b)
PY
expect_refusal "one flipped byte in $f" "$work/flipped" "$f" "sha256" "gdn-gen -- build"
expect_refusal "missing bundle" "$work/nowhere" "no bundle at $work/nowhere" "GDN_BUNDLE_DIR"
if cargo build -q -p gdn-kernels 2>/dev/null; then passed=$((passed+1)); echo "PASS real bundle accepted"; else failed=$((failed+1)); echo "FAIL real bundle refused"; fi
echo "build.rs fail-closed: $passed passed, $failed failed"
[ $failed -eq 0 ]
