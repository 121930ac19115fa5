# A nixpkgs whose nvcc differs from the lock: the bundle must refuse to evaluate.
{ ... }: (import ../fakes.nix { nvccVersion = "13.0.0"; }).pkgs
