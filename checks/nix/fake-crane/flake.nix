# Stands in for the crane flake input: `mkLib` from the test doubles.
{
  outputs = _: { inherit ((import ../fakes.nix { nvccVersion = "13.0.88"; }).crane) mkLib; };
}
