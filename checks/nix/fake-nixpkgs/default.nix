# Stands in for `import nixpkgs { system; config; }` at the pinned revision,
# whose cudaPackages_13_0.cuda_nvcc is 13.0.88.
{ ... }: (import ../fakes.nix { nvccVersion = "13.0.88"; }).pkgs
