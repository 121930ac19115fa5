# The nixpkgs flake input with an nvcc other than the lock's: evaluating the
# bundle must fail (modern-nix.sh asserts that it does, and why).
{
  outputs = _: { inherit (import ../fakes.nix { nvccVersion = "13.0.0"; }) lib; };
}
