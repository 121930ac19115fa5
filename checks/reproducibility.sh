#!/usr/bin/env bash
# Builds the bundle twice from scratch under deliberately different conditions
# and compares every artifact byte for byte (and both against the lock, which
# `gdn-gen build` enforces). The two builds differ in:
#   checkout directory (different absolute path and depth), cache directory,
#   HOME, TMPDIR, TZ, LANG/LC_ALL, umask, CPU affinity (2 cores vs 1) and
#   compile parallelism (--jobs 2 vs 1), and of course PID and time;
#   and the CPython that runs the CuTe DSL export: build a uses `python3` (the
#   first on PATH), build b another CPython of the same major.minor with a
#   different patch version (same wheel set, so every file must be the same
#   bytes; only the manifest's `dsl.python` may say which interpreter ran).
#   On this project's image and CI that is pyenv's 3.11.7 vs Debian 12's
#   /usr/bin/python3 (3.11.2), whose pickle modules write different bytes for
#   the same object (docs/reproducibility.md). GDN_REPRO_OTHER_PYTHON names b's
#   interpreter explicitly; without a second interpreter the check fails.
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

# The two interpreters, resolved here (the builds run with other HOMEs, where
# pyenv's shims could pick another version).
pyver() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])'; }
python_a=$(python3 -c 'import sys; print(sys.executable)')
version_a=$(pyver "$python_a")
python_b=${GDN_REPRO_OTHER_PYTHON:-}
if [ -z "$python_b" ]; then
  for cand in /usr/bin/python3 /usr/local/bin/python3 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/*/bin/python3; do
    [ -x "$cand" ] || continue
    v=$(pyver "$cand" 2>/dev/null) || continue
    if [ "${v%.*}" = "${version_a%.*}" ] && [ "$v" != "$version_a" ]; then python_b=$cand; break; fi
  done
fi
if [ -z "$python_b" ]; then
  echo "reproducibility: no second CPython ${version_a%.*}.x besides $python_a ($version_a) to run build b's DSL export;"
  echo "  set GDN_REPRO_OTHER_PYTHON to one (it must be ${version_a%.*} with another patch version)"
  echo "reproducibility: 0 passed, 1 failed"; exit 1
fi
version_b=$(pyver "$python_b")
[ "${version_b%.*}" = "${version_a%.*}" ] && [ "$version_b" != "$version_a" ] || {
  echo "reproducibility: GDN_REPRO_OTHER_PYTHON=$python_b is $version_b; it must be ${version_a%.*} with another patch version than $version_a"
  echo "reproducibility: 0 passed, 1 failed"; exit 1; }

build() { # name checkout cores jobs tz lang umask python
  local name=$1 checkout=$2 cores=$3 jobs=$4 tz=$5 lang=$6 mask=$7 python=$8
  mkdir -p "$work/$name/home" "$work/$name/tmp"
  echo "== build $name: $checkout cores=$cores jobs=$jobs TZ=$tz LANG=$lang umask=$mask python=$python ($(pyver "$python"))"
  ( cd "$checkout" && umask "$mask" && \
    env HOME="$work/$name/home" TMPDIR="$work/$name/tmp" TZ="$tz" LANG="$lang" LC_ALL="$lang" \
      taskset -c "$cores" "$gen" build --lock gdn-bundle.lock.json --inputs-dir "$inputs" \
      --cache "$work/$name/cache" --out "$work/$name/bundle" --jobs "$jobs" --python "$python" )
}
build a "$repo" 0-1 2 UTC C 022 "$python_a"
build b "$other" 0 1 Asia/Kolkata C.UTF-8 077 "$python_b"

# The manifests must name the interpreters that ran (so they differ there and
# nowhere else); the comparison below then sees them without that one field.
for n in a b; do
  jq -e --arg v "$([ $n = a ] && echo "$version_a" || echo "$version_b")" '.dsl.python == $v' \
    "$work/$n/bundle/manifest.json" >/dev/null || { echo "manifest $n does not name Python $version_a/$version_b"; exit 1; }
  jq 'del(.dsl.python)' "$work/$n/bundle/manifest.json" > "$work/$n.manifest-sans-python.json"
done

fail=0
while IFS= read -r -d '' f; do
  rel=${f#"$work/a/bundle/"}
  if [ "$rel" = manifest.json ]; then
    if cmp -s "$work/a.manifest-sans-python.json" "$work/b.manifest-sans-python.json"; then
      echo "same     manifest.json except dsl.python ($version_a vs $version_b)"
    else
      echo "DIFFERS  manifest.json (beyond dsl.python)"; fail=1
    fi
  elif cmp -s "$f" "$work/b/bundle/$rel"; then
    echo "same     $rel  $(sha256sum < "$f" | cut -c1-16)"
  else
    echo "DIFFERS  $rel"; fail=1
  fi
done < <(find "$work/a/bundle" -type f -print0 | sort -z)
[ "$(cd "$work/a/bundle" && find . -type f | sort)" = "$(cd "$work/b/bundle" && find . -type f | sort)" ] || { echo "DIFFERENT FILE SETS"; fail=1; }
if [ $fail -ne 0 ]; then echo "reproducibility: 0 passed, 1 failed"; exit 1; fi
echo "reproducibility: 1 passed, 0 failed"
