#!/usr/bin/env bash
# Evaluates the flake with a current Nix against the test doubles: `nix flake
# show`, `nix flake check --no-build`, the drvPath of every output, the
# server's contract at the derivation level, eval-test.nix once more, and an
# nvcc mismatch that must fail.
#
# Why a chroot: Debian 12's nix-bin (2.8, used by run.sh) cannot evaluate
# current nixpkgs or flakes as Nix >= 2.18 does; Debian 13's nix-bin (2.26)
# can. It runs in a minimal Debian 13 made by debootstrap, cached outside the
# repository and reused while its recipe is unchanged. Nothing is built and
# the real nixpkgs and crane are never fetched: both inputs are overridden
# with the path: flakes in checks/nix/fake-nixpkgs and checks/nix/fake-crane.
#
# Needs root (debootstrap, chroot, unshare), debootstrap, util-linux, jq and
# a Debian mirror for the first run (1 to 3 minutes; later runs seconds).
# Environment:
#   GDN_NIX_CHROOT      cached chroot (default /var/cache/gdn/nix-chroot-trixie)
#   GDN_DEBIAN_MIRROR   mirror for debootstrap (default http://deb.debian.org/debian)
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo" || exit 1

chroot_dir="${GDN_NIX_CHROOT:-/var/cache/gdn/nix-chroot-trixie}"
mirror="${GDN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# debootstrap does not resolve virtual packages: nix-bin needs
# libdbd-sqlite3-perl, which needs perl-dbdabi-94, provided by libdbi-perl.
debootstrap_options="--variant=minbase --include=nix-bin,libdbi-perl"
suite=trixie
recipe="debootstrap $debootstrap_options $suite"
# Named explicitly so that debootstrap refuses an unverifiable Release file
# instead of warning and going on (Debian 12's keyring has the trixie keys).
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
# Bounds: a stuck mirror or evaluation fails the run instead of hanging CI.
debootstrap_timeout_s=600
nix_timeout_s=300
system=x86_64-linux

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ] && exit 0
  exit 1
}
abort() { fail "$*"; finish; }
elapsed() { echo "$(($(date +%s) - $1)) s"; }

[ "$(id -u)" -eq 0 ] || abort "needs root (debootstrap, chroot and unshare); CI runs as root"
for tool in debootstrap gpgv unshare chroot flock timeout findmnt jq git tar; do
  command -v "$tool" >/dev/null || abort "required tool '$tool' not on PATH (Debian: apt-get install debootstrap gpgv util-linux jq git tar)"
done
[ -f "$keyring" ] || abort "$keyring missing (Debian: apt-get install debian-archive-keyring)"
unshare --mount --pid --fork true 2>/dev/null ||
  abort "cannot create mount and PID namespaces here (unshare --mount --pid needs CAP_SYS_ADMIN)"

# Deleting a directory with something mounted below it would delete through
# the mount: refuse instead. (Every mount made here lives in a private mount
# namespace and disappears with it, so this only trips on foreign mounts.)
remove_tree() {
  local dir=$1 mounts
  # Read the table once, then grep a here-string: grep -q quitting early on a
  # pipe would SIGPIPE findmnt and, under pipefail, turn a match into "no match".
  mounts=$(findmnt -rn -o TARGET)
  if grep -q -F -x -e "$dir" -e "$dir/" <<<"$mounts"; then
    abort "refusing to delete $dir: something is mounted there"
  fi
  if grep -q -F "$dir/" <<<"$mounts"; then
    abort "refusing to delete $dir: something is mounted below it ($(grep -m1 -F "$dir/" <<<"$mounts"))"
  fi
  rm -rf --one-file-system "$dir"
}

# Runs a command inside the chroot with /proc mounted (Nix reads
# /proc/self/exe). In its own mount and PID namespaces: if unshare is killed
# (timeout, CI cancelled), its child gets SIGKILL, the kernel kills everything
# else in the PID namespace, and the mount goes with the namespace.
# `timeout --foreground` stays in this script's process group, so a signal
# to the group (CI cancelled, an outer timeout) reaches unshare too; fd 9
# (the chroot lock) is closed so that nothing can hold the lock after us.
in_chroot() {
  # shellcheck disable=SC2016 # $1 and $@ belong to the inner sh
  timeout --foreground "$nix_timeout_s" unshare --mount --pid --fork --kill-child -- sh -c '
    root=$1; shift
    mount -t proc proc "$root/proc" && exec chroot "$root" "$@"' sh "$chroot_dir" \
    env -i PATH=/usr/bin:/bin HOME=/root "$@" </dev/null 9>&-
}

chroot_nix_version() {
  in_chroot nix --version 2>/dev/null | sed -n 's/^nix (Nix) //p'
}

create_chroot() {
  local fresh="$chroot_dir.new" log="$chroot_dir.debootstrap.log" start attempt
  start=$(date +%s)
  echo "creating the Nix chroot at $chroot_dir ($recipe from $mirror; log: $log)"
  for attempt in 1 2; do
    remove_tree "$fresh"
    # debootstrap mounts /proc and /sys in the target while configuring;
    # the private namespaces keep those mounts, and any dpkg or wget left
    # running, from outliving it (see in_chroot).
    # shellcheck disable=SC2086 # the options are a word list on purpose
    if timeout --foreground "$debootstrap_timeout_s" unshare --mount --pid --fork --kill-child -- \
      debootstrap $debootstrap_options --keyring="$keyring" "$suite" "$fresh" "$mirror" >"$log" 2>&1 9>&-; then
      break
    fi
    echo "debootstrap attempt $attempt failed after $(elapsed "$start"); last lines of $log:"
    tail -n 15 "$log"
    [ "$attempt" -eq 2 ] && { remove_tree "$fresh"; abort "could not create the Nix chroot (see $log)"; }
  done
  echo "$recipe" >"$fresh/.gdn-recipe"
  remove_tree "$chroot_dir"
  mv "$fresh" "$chroot_dir"
  echo "chroot created in $(elapsed "$start")"
}

# One creator at a time; users hold the lock shared so that nobody replaces
# the chroot under a running evaluation.
mkdir -p "$(dirname "$chroot_dir")"
exec 9>"$chroot_dir.lock"
flock -w 1200 9 || abort "timed out waiting for $chroot_dir.lock"
setup_start=$(date +%s)
if [ "$(cat "$chroot_dir/.gdn-recipe" 2>/dev/null)" != "$recipe" ] || [ -z "$(chroot_nix_version)" ]; then
  create_chroot
fi
nix_version=$(chroot_nix_version)
flock -s 9
if [ -z "$nix_version" ]; then
  abort "nix does not run in the chroot at $chroot_dir"
fi
# nixpkgs 25.11 and the flake features used here need Nix >= 2.18.
if printf '2.18\n%s\n' "$nix_version" | sort -V -C; then
  pass "Nix $nix_version in the chroot $chroot_dir (ready in $(elapsed "$setup_start"))"
else
  abort "the chroot's Nix is $nix_version; need >= 2.18"
fi

# The flake as `git+file` would see it: the tracked files (working-tree
# contents), copied into a per-run directory with its own store, removed on exit.
mkdir -p "$chroot_dir/gdn-runs"
run_dir=$(mktemp -d "$chroot_dir/gdn-runs/run.XXXXXX")
trap 'remove_tree "$run_dir"' EXIT
run=${run_dir#"$chroot_dir"}
mkdir -p "$run_dir/flake" "$run_dir/home"
git ls-files -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$run_dir/flake" || abort "could not copy the tracked files to $run_dir/flake"
flake="path:$run/flake"
doubles="$run/flake/checks/nix"

# nix with the store and caches inside the run directory, no network, no
# registry, no evaluation cache (stale results), inputs replaced by doubles.
nix_in_chroot() {
  local nixpkgs_double=$1; shift
  local cmd=$1; shift
  in_chroot HOME="$run/home" XDG_CACHE_HOME="$run/home/.cache" \
    nix --extra-experimental-features 'nix-command flakes' \
    --store "local?root=$run/store" --offline \
    --option eval-cache false --option flake-registry '' \
    "$cmd" "$@" \
    --no-write-lock-file \
    --override-input nixpkgs "path:$doubles?dir=$nixpkgs_double" \
    --override-input crane "path:$doubles?dir=fake-crane"
}
nix_eval_json() { nix_in_chroot fake-nixpkgs eval --json "$flake#$1" --apply "$2"; }

out=$(mktemp)
trap 'rm -f "$out" "$out.json"; remove_tree "$run_dir"' EXIT
fail_with_log() { fail "$1: $(tail -n 20 "$out")"; }

# 1. nix flake show: every advertised output is there.
start=$(date +%s)
if nix_in_chroot fake-nixpkgs flake show --json "$flake" >"$out.json" 2>"$out"; then
  wanted='["default","gdn-bundle","gdn-bundle-cuda12_8","gdn-gen","server","gdn-server","cuda-toolkit"]'
  missing=$(jq -c --argjson w "$wanted" --arg s "$system" '$w - (.packages[$s] | keys)' "$out.json")
  server_type=$(jq -r --arg s "$system" '.packages[$s].server.type + " " + .apps[$s].server.type' "$out.json")
  if [ "$missing" = "[]" ] && [ "$server_type" = "derivation app" ]; then
    pass "nix flake show ($(elapsed "$start")): packages $(jq -c --arg s "$system" '.packages[$s] | keys' "$out.json"), apps.server, $(jq -c --arg s "$system" '{checks: (.checks[$s] | keys), devShells: (.devShells[$s] | keys)}' "$out.json")"
  else
    fail "nix flake show: packages missing $missing; server/app types '$server_type'"
  fi
else
  fail_with_log "nix flake show"
fi
rm -f "$out.json"

# 2. nix flake check --no-build: evaluates every check and package derivation.
start=$(date +%s)
if nix_in_chroot fake-nixpkgs flake check --no-build "$flake" >"$out" 2>&1; then
  pass "nix flake check --no-build ($(elapsed "$start"), $(grep -c '^checking derivation' "$out") derivations checked)"
else
  fail_with_log "nix flake check --no-build"
fi

# 3. The drvPath of every output; each must be a .drv written to the run's store.
drv_paths='builtins.mapAttrs (_: builtins.mapAttrs (_: drv: drv.drvPath))'
for output in packages checks gpuChecks devShells; do
  if nix_eval_json "$output" "$drv_paths" >"$out.json" 2>"$out"; then
    count=$(jq '[.[] | .[]] | length' "$out.json")
    bad=$(jq -r '[.[] | .[] | select(test("^/nix/store/[0-9a-z]{32}-[^/]+\\.drv$") | not)] | join(" ")' "$out.json")
    absent=$(jq -r '.[] | .[]' "$out.json" | while read -r drv; do [ -f "$chroot_dir$run/store$drv" ] || printf '%s ' "$drv"; done)
    if [ "$count" -gt 0 ] && [ -z "$bad" ] && [ -z "$absent" ]; then
      pass "drvPath of every $output output ($count): $(jq -c '[.[] | to_entries[] | .key + "=" + (.value | .[44:])]' "$out.json")"
    else
      fail "drvPath of $output: $count outputs; malformed: '$bad'; not in the store: '$absent'"
    fi
  else
    fail_with_log "drvPath of $output"
  fi
done
rm -f "$out.json"

# 4. The server's contract on the derivations themselves (issue 10 item 10).
server_drv() { nix_in_chroot fake-nixpkgs derivation show "$flake#packages.$system.$1"; }
if server_json=$(server_drv server 2>"$out") &&
  launcher_json=$(server_drv server.launcher 2>"$out") &&
  bundle_out=$(nix_eval_json "packages.$system.gdn-bundle" 'drv: drv.outPath' 2>"$out") &&
  bundle_drv=$(nix_eval_json "packages.$system.gdn-bundle" 'drv: drv.drvPath' 2>"$out") &&
  program=$(nix_eval_json "apps.$system.server" 'app: app.program' 2>"$out") &&
  server_out=$(nix_eval_json "packages.$system.server" 'drv: drv.outPath' 2>"$out"); then
  bundle_out=$(jq -r . <<<"$bundle_out")
  bundle_drv=$(jq -r . <<<"$bundle_drv")
  program=$(jq -r . <<<"$program")
  server_out=$(jq -r . <<<"$server_out")
  env_dir=$(jq -r '.[].env.GDN_BUNDLE_DIR' <<<"$server_json")
  cargo_args=$(jq -r '.[].env.cargoExtraArgs' <<<"$server_json")
  if [ "$env_dir" = "$bundle_out" ] && jq -e --arg d "$bundle_drv" '.[].inputDrvs | has($d)' <<<"$server_json" >/dev/null; then
    pass "server derivation: GDN_BUNDLE_DIR = the bundle's outPath, the bundle is an input derivation"
  else
    fail "server derivation: GDN_BUNDLE_DIR '$env_dir', bundle '$bundle_out' ($bundle_drv)"
  fi
  if [[ " $cargo_args " == *" --package gdn-server "* && " $cargo_args " == *" --bin gdn-server "* ]]; then
    pass "server derivation builds --package gdn-server --bin gdn-server ($cargo_args)"
  else
    fail "server derivation: cargoExtraArgs '$cargo_args'"
  fi
  launcher_out=$(jq -r '.[].outputs.out.path' <<<"$launcher_json")
  if [ "$program" = "$launcher_out/bin/gdn-server" ] &&
    jq -e --arg x "exec $server_out/bin/gdn-server" '.[].env.text | contains($x)' <<<"$launcher_json" >/dev/null; then
    pass "apps.server program $program ends in /bin/gdn-server and execs $server_out/bin/gdn-server"
  else
    fail "apps.server program '$program' (launcher $launcher_out, server $server_out)"
  fi
else
  fail_with_log "server contract evaluation"
fi

# 5. The detailed assertions of eval-test.nix, under this Nix as well.
start=$(date +%s)
if in_chroot HOME="$run/home" nix-instantiate --store "local?root=$run/store" --eval --strict --json \
  "$run/flake/checks/nix/eval-test.nix" --arg root "$run/flake" >"$out.json" 2>"$out"; then
  total=$(jq length "$out.json")
  failures=$(jq -r '.[] | select(.ok | not) | .name + " -- " + .detail' "$out.json")
  if [ "$total" -gt 0 ] && [ -z "$failures" ]; then
    pass "eval-test.nix under Nix $nix_version: $total assertions ($(elapsed "$start"))"
  else
    fail "eval-test.nix under Nix $nix_version: $failures"
  fi
else
  fail_with_log "eval-test.nix under Nix $nix_version"
fi
rm -f "$out.json"

# 6. A nixpkgs whose nvcc differs from the lock: evaluation must refuse, and
#    say why. (Checks that this script's nix failures do reach the report.)
lock_nvcc=$(jq -r .nvcc_version gdn-bundle.lock.json)
if nix_in_chroot fake-nixpkgs-nvcc-mismatch flake check --no-build "$flake" >"$out" 2>&1; then
  fail "nix flake check --no-build succeeded with an nvcc (13.0.0) that the lock does not record"
elif grep -q -F 'gives nvcc 13.0.0 for cuda-13.0' "$out" && grep -q -F "records nvcc $lock_nvcc" "$out"; then
  pass "nix flake check --no-build refuses nixpkgs with nvcc 13.0.0 (lock: $lock_nvcc), naming both"
else
  fail_with_log "nvcc mismatch: failed, but not with the nvcc error"
fi

finish
