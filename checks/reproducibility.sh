#!/usr/bin/env bash
# Builds the bundle from scratch under deliberately unusual conditions and
# compares every artifact byte for byte with another from-scratch build.
#
# Two ways (both also check every file against the lock, which `gdn-gen
# build` enforces):
#   checks/reproducibility.sh                 builds a (this checkout, 2
#       cores, --jobs 2, TZ=UTC, LANG=C, umask 022, `python3`) and b in a
#       temp dir and compares them file by file, manifests too. Build b
#       differs from a in: checkout directory (a copy of the tracked files
#       at a deeper, different path), cache directory, HOME, TMPDIR,
#       TZ=Asia/Kolkata, LANG/LC_ALL=C.UTF-8, umask 077, CPU affinity (one
#       core) and compile parallelism (--jobs 1), PID and time, and the
#       CPython that runs the CuTe DSL export (below). Run it when the
#       generator, the table or the toolchain changes (about twice CI's
#       bundle time: b compiles every unit in series);
#   checks/reproducibility.sh --against-lock  builds b only, and the other
#       side is the lock: `gdn-gen lock` wrote its hashes from a
#       from-scratch build in a developer's environment. b then differs from
#       that build in checkout path, cache, HOME, TMPDIR, TZ, locale and
#       umask (each chosen unlike the environment it runs in: a developer's
#       and CI's are the same machine kind), PID, time and the Python patch
#       version; it uses every core (CI's time limit: the core-count
#       variation is the first way's, and the GPU machine's `gdn-gen verify`
#       on 16 cores). b is then installed as this checkout's bundle
#       (target/gdn-bundle, its units in target/gdn-cache): CI builds the
#       bundle once, and that build is the reproducibility proof.
# The CPython of b: another CPython of the same major.minor with a
# different patch version than a's `python3` (against the lock: than the
# lock's `dsl_recorded_with_python`). The wheel set is the same, so every
# file must be the same bytes; only the manifest's `dsl.python` may say
# which interpreter ran. On this project's image and CI that is pyenv's
# 3.11.7 vs Debian 12's /usr/bin/python3 (3.11.2), whose pickle modules
# write different bytes for the same object (docs/reproducibility.md).
# GDN_REPRO_OTHER_PYTHON names b's interpreter explicitly; without a second
# interpreter the check fails.
# Usage: checks/reproducibility.sh [--against-lock]   (from the repository root)
set -euo pipefail
mode=pair
case "${1:-}" in
  "") ;;
  --against-lock) mode=lock ;;
  *) echo "usage: checks/reproducibility.sh [--against-lock]" >&2; exit 2 ;;
esac
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
# pyenv's shims could pick another version). Against the lock, "a's"
# version is the one the lock records.
pyver() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])'; }
python_a=$(python3 -c 'import sys; print(sys.executable)')
if [ $mode = lock ]; then
  version_a=$(jq -r .dsl_recorded_with_python gdn-bundle.lock.json)
else
  version_a=$(pyver "$python_a")
fi
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

build() { # name checkout cores jobs tz lang umask python cache out
  local name=$1 checkout=$2 cores=$3 jobs=$4 tz=$5 lang=$6 mask=$7 python=$8 cache=$9 out=${10}
  mkdir -p "$work/$name/home" "$work/$name/tmp"
  echo "== build $name: $checkout cores=$cores jobs=$jobs TZ=$tz LANG=$lang umask=$mask python=$python ($(pyver "$python"))"
  ( cd "$checkout" && umask "$mask" && \
    env HOME="$work/$name/home" TMPDIR="$work/$name/tmp" TZ="$tz" LANG="$lang" LC_ALL="$lang" \
      taskset -c "$cores" "$gen" build --lock gdn-bundle.lock.json --inputs-dir "$inputs" \
      --cache "$cache" --out "$out" --jobs "$jobs" --python "$python" )
}
if [ $mode = lock ]; then
  # From scratch: no compiled unit may come from an earlier build. The
  # build checks every file against the lock before it installs the bundle.
  rm -rf "$repo/target/gdn-cache/units"
  # Conditions unlike the ones in force here (the lock's build ran in an
  # environment like this one).
  tz_b=Asia/Kolkata; [ "${TZ:-}" = "$tz_b" ] && tz_b=America/St_Johns
  lang_b=C; [ "${LC_ALL:-${LANG:-C}}" = C ] && lang_b=C.UTF-8
  mask_b=077; [ "$(umask)" = 0077 ] && mask_b=027
  cores=$(nproc); started=$(date +%s)
  build b "$other" "0-$((cores - 1))" "$cores" "$tz_b" "$lang_b" "$mask_b" "$python_b" \
    "$repo/target/gdn-cache" "$repo/target/gdn-bundle"
  echo "bundle build b: $(( $(date +%s) - started )) s wall on $cores cores"
  jq -e --arg v "$version_b" '.dsl.python == $v' "$repo/target/gdn-bundle/manifest.json" >/dev/null \
    || { echo "the manifest does not name Python $version_b"; echo "reproducibility: 0 passed, 1 failed"; exit 1; }
  # The interpreter b used, for a later `gdn-gen build --python` that should
  # find this bundle up to date (the DSL units are keyed by it).
  echo "$python_b" > "$repo/target/gdn-repro-python"
  echo "same as the lock: every artifact of target/gdn-bundle (built from scratch as b, Python $version_b; the lock's DSL units were recorded with $version_a)"
  echo "reproducibility: 1 passed, 0 failed"
  exit 0
fi
build a "$repo" 0-1 2 UTC C 022 "$python_a" "$work/a/cache" "$work/a/bundle"
build b "$other" 0 1 Asia/Kolkata C.UTF-8 077 "$python_b" "$work/b/cache" "$work/b/bundle"

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
