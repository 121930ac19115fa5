# Stands in for the nixpkgs flake input (`nix ... --override-input nixpkgs
# path:<copy of checks/nix>?dir=fake-nixpkgs`, see modern-nix.sh): `lib` from
# the test doubles; `import nixpkgs { ... }` reads default.nix next to this file.
{
  outputs = _: { inherit (import ../fakes.nix { nvccVersion = "13.0.88"; }) lib; };
}
