#!/usr/bin/env bash
# Builds the bundle twice from scratch under deliberately different conditions
# and compares every artifact byte for byte (and both against the lock, which
# `gdn-gen build` enforces). The two builds differ in:
#   checkout directory (different absolute path and depth), cache directory,
#   HOME, TMPDIR, TZ, LANG/LC_ALL, umask, CPU affinity (2 cores vs 1) and
#   compile parallelism (--jobs 2 vs 1), and of course PID and time.
# Usage: checks/reproducibility.sh            (from the repository root)
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/gdn-repro.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$repo"
cargo build -q --release -p gdn-gen
gen="$repo/target/release/gdn-gen"

# The second checkout: the tracked files (and the lock) copied to a deeper, different path.
other="$work/some/other/checkout-$RANDOM"
mkdir -p "$other"
git ls-files -z | xargs -0 -I{} cp --parents {} "$other/"

# Downloads are shared (they are checked by sha256 anyway); nothing else is.
inputs="$repo/target/gdn-cache/downloads"
mkdir -p "$inputs"

build() { # name checkout cores jobs tz lang umask
  local name=$1 checkout=$2 cores=$3 jobs=$4 tz=$5 lang=$6 mask=$7
  mkdir -p "$work/$name/home" "$work/$name/tmp"
  echo "== build $name: $checkout cores=$cores jobs=$jobs TZ=$tz LANG=$lang umask=$mask"
  ( cd "$checkout" && umask "$mask" && \
    env HOME="$work/$name/home" TMPDIR="$work/$name/tmp" TZ="$tz" LANG="$lang" LC_ALL="$lang" \
      taskset -c "$cores" "$gen" build --lock gdn-bundle.lock.json --inputs-dir "$inputs" \
      --cache "$work/$name/cache" --out "$work/$name/bundle" --jobs "$jobs" )
}
build a "$repo" 0-1 2 UTC C 022
build b "$other" 0 1 Asia/Kolkata C.UTF-8 077

fail=0
while IFS= read -r -d '' f; do
  rel=${f#"$work/a/bundle/"}
  if cmp -s "$f" "$work/b/bundle/$rel"; then
    echo "same     $rel  $(sha256sum < "$f" | cut -c1-16)"
  else
    echo "DIFFERS  $rel"; fail=1
  fi
done < <(find "$work/a/bundle" -type f -print0 | sort -z)
[ "$(cd "$work/a/bundle" && find . -type f | sort)" = "$(cd "$work/b/bundle" && find . -type f | sort)" ] || { echo "DIFFERENT FILE SETS"; fail=1; }
if [ $fail -ne 0 ]; then echo "reproducibility: 0 passed, 1 failed"; exit 1; fi
echo "reproducibility: 1 passed, 0 failed"
