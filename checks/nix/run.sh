#!/usr/bin/env bash
# Static checks for the Nix files: parse, format, dead code, flake.lock shape,
# and an evaluation of flake.nix + nix/*.nix against test doubles of nixpkgs
# and crane (checks/nix/eval-test.nix). Needs no network and no nixpkgs.
#
# Needs: nix-instantiate (Debian's nix-bin 2.8 works) and jq.
# Optional: nixpkgs-fmt, deadnix (skipped with a note when not on PATH;
# CI installs them: cargo install --locked nixpkgs-fmt deadnix).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

for tool in nix-instantiate jq; do
  if ! command -v "$tool" >/dev/null; then
    fail "required tool '$tool' not on PATH (Debian: apt-get install nix-bin jq)"
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "$passed passed, $failed failed"
  exit 1
fi

mapfile -t nix_files < <(
  { echo flake.nix; find nix checks/nix -name '*.nix'; } | sort -u
)

# 1. Every .nix file parses.
for f in "${nix_files[@]}"; do
  if out=$(nix-instantiate --parse "$f" 2>&1 >/dev/null); then
    pass "parse $f"
  else
    fail "parse $f: $out"
  fi
done

# 2. Formatting and dead code, when the tools are installed.
if command -v nixpkgs-fmt >/dev/null; then
  if out=$(nixpkgs-fmt --check "${nix_files[@]}" 2>&1); then
    pass "nixpkgs-fmt --check (${#nix_files[@]} files)"
  else
    fail "nixpkgs-fmt --check: $out (run: nixpkgs-fmt ${nix_files[*]})"
  fi
else
  echo "SKIP nixpkgs-fmt not on PATH (cargo install --locked nixpkgs-fmt)"
fi
if command -v deadnix >/dev/null; then
  if out=$(deadnix --fail "${nix_files[@]}" 2>&1); then
    pass "deadnix --fail (${#nix_files[@]} files)"
  else
    fail "deadnix --fail: $out"
  fi
else
  echo "SKIP deadnix not on PATH (cargo install --locked deadnix)"
fi

# 3. flake.lock: every input of flake.nix is locked to a github revision with
#    a narHash (the values themselves are checked by `nix flake metadata`
#    with network access, not here).
lock_report=$(jq -r '
  .nodes as $n
  | ($n.root.inputs | keys) as $inputs
  | [ $inputs[] as $i
      | $n[$n.root.inputs[$i]].locked as $l
      | if ($l.type == "github")
          and ($l.rev | test("^[0-9a-f]{40}$"))
          and ($l.narHash | test("^sha256-[A-Za-z0-9+/]{43}=$"))
          and ($l.lastModified | type == "number")
        then "ok \($i) \($l.owner)/\($l.repo)@\($l.rev)"
        else "bad \($i)" end ]
  | .[]' flake.lock 2>&1)
if [ -n "$lock_report" ] && ! grep -qv '^ok ' <<<"$lock_report"; then
  pass "flake.lock: $(tr '\n' ';' <<<"$lock_report")"
else
  fail "flake.lock: $lock_report"
fi
lock_inputs=$(jq -r '.nodes.root.inputs | keys | join(" ")' flake.lock)
if [ "$lock_inputs" = "crane nixpkgs" ]; then
  pass "flake.lock root inputs = flake.nix inputs ($lock_inputs)"
else
  fail "flake.lock root inputs are '$lock_inputs', flake.nix declares 'crane nixpkgs'"
fi

# 4. Evaluate the flake against the test doubles, in a scratch copy so that
#    nix/default.nix reads ../gdn-bundle.lock.json from there.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp flake.nix flake.lock "$scratch/"
cp -r nix "$scratch/nix"
if [ -f gdn-bundle.lock.json ]; then
  cp gdn-bundle.lock.json "$scratch/"
  echo "NOTE eval test uses the repository's gdn-bundle.lock.json"
else
  # Minimal stand-in with the contract's shape; the hashes are placeholders
  # that exist only in this scratch directory.
  cat >"$scratch/gdn-bundle.lock.json" <<'JSON'
{
  "schema_version": 1,
  "toolchain": { "nvcc_version": "13.0.88" },
  "inputs": [
    { "name": "flashinfer-python", "version": "0.6.13", "role": "kernel-source",
      "filename": "flashinfer_python-0.6.13-py3-none-any.whl",
      "url": "https://files.pythonhosted.org/packages/test/flashinfer_python-0.6.13-py3-none-any.whl",
      "sha256": "1111111111111111111111111111111111111111111111111111111111111111", "size": 1 },
    { "name": "second-kernel-source", "version": "1.0", "role": "kernel-source",
      "filename": "second_kernel_source-1.0.tar.gz",
      "url": "https://files.pythonhosted.org/packages/test/second_kernel_source-1.0.tar.gz",
      "sha256": "2222222222222222222222222222222222222222222222222222222222222222", "size": 2 },
    { "name": "nvidia-cuda-nvcc", "version": "13.0.88", "role": "toolchain",
      "filename": "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux_2_27_x86_64.whl",
      "url": "https://files.pythonhosted.org/packages/test/nvidia_cuda_nvcc-13.0.88.whl",
      "sha256": "3333333333333333333333333333333333333333333333333333333333333333", "size": 3 }
  ],
  "outputs": {},
  "variants": { "cuda-12.8": { "status": "unrecorded" }, "cuda-13.0": { "status": "recorded" } }
}
JSON
  echo "NOTE no gdn-bundle.lock.json at the repository root: eval test uses a stand-in lock"
fi

if results=$(nix-instantiate --eval --strict --json checks/nix/eval-test.nix --arg root "$scratch" 2>&1); then
  while IFS=$'\t' read -r ok name detail; do
    if [ "$ok" = "true" ]; then pass "eval: $name"; else fail "eval: $name -- $detail"; fi
  done < <(jq -r '.[] | [(.ok | tostring), .name, .detail] | @tsv' <<<"$results")
else
  fail "eval: checks/nix/eval-test.nix did not evaluate: $results"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
