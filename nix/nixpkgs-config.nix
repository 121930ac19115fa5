# nixpkgs `config` for every system this flake builds for.
#
# Only the CUDA redistributables we actually use are allowed as unfree, so a
# stray unfree dependency fails evaluation instead of slipping in silently.
# `cudaSupport` stays off: nothing in this flake rebuilds nixpkgs packages
# with CUDA; we only take the toolkit pieces from `cudaPackages_*`.
{
  allowUnfreePredicate =
    pkg:
    let
      name = pkg.pname or (builtins.parseDrvName pkg.name).name;
    in
    builtins.match "(cuda_.*|libcu.*|libnv.*|cuda-merged.*|gdn-cuda-toolkit.*)" name != null;

  # The generator fixes its own nvcc flags (sm_90a); these only matter if a
  # nixpkgs package is ever built with CUDA through this pkgs instance.
  cudaCapabilities = [ "9.0" ];
  cudaForwardCompat = false;
}
