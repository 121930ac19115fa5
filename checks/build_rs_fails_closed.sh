#!/usr/bin/env bash
# The kernels crate's build.rs must refuse a tampered or missing bundle, with
# the artifact and both hashes in the message and advice that does not
# re-lock; refuse a working tree whose sources differ from the lock (cargo
# must notice the edit; with GDN_VERIFY_EVERY_BUILD=1 also one that kept the
# file's old timestamp, as `cp -p`, `rsync -a` and `tar x` do); never block
# on a FIFO; and accept the real bundle, also named by a path relative to the
# workspace root.
# Usage: checks/build_rs_fails_closed.sh   (after `gdn-gen build`; honours GDN_BUNDLE_DIR)
set -uo pipefail
repo=$(git rev-parse --show-toplevel); cd "$repo"
bundle=$(realpath "${GDN_BUNDLE_DIR:-target/gdn-bundle}")
work=$(mktemp -d /tmp/gdn-buildrs.XXXXXX)
edited=crates/gdn-kernels/cuda/gdn_abi.cpp
cp "$edited" "$work/source-backup"
restore() { cp "$work/source-backup" "$edited"; rm -rf "$work"; }
trap restore EXIT
passed=0; failed=0
pass() { passed=$((passed+1)); echo "PASS $1"; }
fail() { failed=$((failed+1)); echo "FAIL $1"; [ -z "${2:-}" ] || echo "$2" | tail -5; }
build() { # bundle-dir: build gdn-kernels against it; a blocked build.rs is killed after 300 s
  # $every_build (set for one call) becomes GDN_VERIFY_EVERY_BUILD.
  GDN_BUNDLE_DIR="$1" GDN_VERIFY_EVERY_BUILD="${every_build:-}" \
    timeout -k 10 "${BUILD_TIMEOUT:-300}" cargo build -q -p gdn-kernels 2>&1
}
expect_refusal() { # name bundle-dir pattern... ; a pattern starting with ! must be absent
  local name=$1 dir=$2; shift 2
  local out status ok=1
  out=$(build "$dir"); status=$?
  [ $status -ne 0 ] && [ $status -ne 124 ] && [ $status -ne 137 ] || ok=0
  for pat in "$@"; do
    if [ "${pat:0:1}" = "!" ]; then ! grep -qF -- "${pat:1}" <<<"$out" || ok=0
    else grep -qF -- "$pat" <<<"$out" || ok=0; fi
  done
  if [ $ok -eq 1 ]; then pass "$name"; else fail "$name (exit $status)" "$out"; fi
}
expect_acceptance() { # name bundle-dir
  local out
  if out=$(build "$2"); then pass "$1"; else fail "$1" "$out"; fi
}

cp -r "$bundle" "$work/flipped"
f=cubin/flashinfer_sm90_gva.sm_90a.cubin
python3 - "$work/flipped/$f" <<'PY'
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//3]^=1; open(p,'wb').write(b)
PY
expect_refusal "one flipped byte in $f" "$work/flipped" "$f" "sha256" "gdn-gen -- build"
expect_refusal "missing bundle" "$work/nowhere" "no bundle at $work/nowhere" "GDN_BUNDLE_DIR"

# Bytes that differ from the lock with a manifest made to agree (two cubins
# of the same size swapped, their manifest entries too): the advice is to
# rebuild or find out why, never to re-lock.
g=cubin/flashinfer_sm90_mha.sm_90a.cubin
cp -r "$bundle" "$work/swapped"
python3 - "$work/swapped" "$f" "$g" <<'PY'
import json, os, sys
root, a, b = sys.argv[1:]
os.rename(f"{root}/{a}", f"{root}/swap.tmp"); os.rename(f"{root}/{b}", f"{root}/{a}"); os.rename(f"{root}/swap.tmp", f"{root}/{b}")
m = json.load(open(f"{root}/manifest.json"))
m["artifacts"][a], m["artifacts"][b] = m["artifacts"][b], m["artifacts"][a]
json.dump(m, open(f"{root}/manifest.json", "w"), indent=2)
PY
expect_refusal "bytes differ from the lock: advice" "$work/swapped" "against the lock" "gdn-gen -- verify" "!gdn-gen -- lock"

# A FIFO where an artifact should be: refused, not waited on.
cp -r "$bundle" "$work/fifo"
rm "$work/fifo/$f" && mkfifo "$work/fifo/$f"
expect_refusal "FIFO in place of $f" "$work/fifo" "$f" "not a regular file"

# A relative GDN_BUNDLE_DIR is the workspace root's, and messages show absolute paths.
rel_bundle=$(realpath --relative-to="$repo" "$bundle")
expect_acceptance "relative GDN_BUNDLE_DIR=$rel_bundle" "$rel_bundle"
expect_refusal "relative missing bundle named absolutely" "target/no-such-bundle" "no bundle at $repo/target/no-such-bundle"

# A source edited after the bundle was built: cargo must rerun build.rs and refuse.
expect_acceptance "real bundle accepted" "$bundle"
printf '\n// edited after the bundle was built\n' >> "$edited"
expect_refusal "source $edited edited after the build" "$bundle" "$edited" "sha256" "git checkout"
cp "$work/source-backup" "$edited"
expect_acceptance "real bundle accepted again once the source is restored" "$bundle"

# The same edit with the file's timestamp kept: cargo sees no newer file;
# with GDN_VERIFY_EVERY_BUILD=1 build.rs runs anyway and refuses it. The
# variable is set for the build before the edit too, so that its change is
# not what reruns build.rs.
every_build=1 expect_acceptance "real bundle accepted with GDN_VERIFY_EVERY_BUILD=1" "$bundle"
touch -r "$edited" "$work/mtime"
printf '\n// edited, timestamp kept\n' >> "$edited"
touch -r "$work/mtime" "$edited"
every_build=1 expect_refusal "source $edited edited with its timestamp kept, GDN_VERIFY_EVERY_BUILD=1" \
  "$bundle" "$edited" "sha256" "git checkout"
cp "$work/source-backup" "$edited"
expect_acceptance "real bundle accepted once more" "$bundle"

echo "build.rs fail-closed: $passed passed, $failed failed"
[ $failed -eq 0 ]
