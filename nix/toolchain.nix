# CUDA toolkit selection: one merged toolkit root per bundle variant.
#
# Under Nix the toolkit comes from nixpkgs (`cudaPackages_13_0`, `_12_8`), not
# from the PyPI wheels that the lock's "toolchain" inputs name: those are for
# the non-Nix path. The patch level (nvcc 13.0.88 for the default variant) is
# set by the nixpkgs revision in flake.lock, not by the attribute name;
# bundle.nix compares it with the lock before building.
{ pkgs }:
let
  # Redistributables are split into outputs (bin, dev, lib, static, stubs...);
  # `libcudart_static.a` lives in `static`, so take every output.
  allOutputs = drv: map (output: drv.${output}) (drv.outputs or [ "out" ]);

  # `cuda_crt` (headers split out of nvcc in CUDA 13) and `libnvvm` only exist
  # in some package sets; take them when the pinned revision has them.
  optionalMember = cudaPackages: name:
    if cudaPackages ? ${name} && cudaPackages.${name} != null then [ cudaPackages.${name} ] else [ ];

  mkToolkit = variant: cudaPackages:
    let
      members = [
        cudaPackages.cuda_nvcc
        cudaPackages.cuda_cudart
        cudaPackages.cuda_cccl
      ]
      ++ optionalMember cudaPackages "cuda_crt"
      ++ optionalMember cudaPackages "libnvvm";
    in
    {
      inherit variant cudaPackages members;
      nvccVersion = cudaPackages.cuda_nvcc.version;
      # nvcc.profile in nixpkgs pins its host compiler to backendStdenv.cc;
      # building with the same stdenv keeps `c++` on PATH identical to it.
      stdenv = cudaPackages.backendStdenv;
      root = pkgs.symlinkJoin {
        name = "gdn-cuda-toolkit-${cudaPackages.cuda_nvcc.version}";
        paths = builtins.concatMap allOutputs members;
      };
    };
in
{
  # Variant names are the keys of `variants` in gdn-bundle.lock.json.
  default = "cuda-13.0";
  variants = {
    "cuda-13.0" = mkToolkit "cuda-13.0" pkgs.cudaPackages_13_0;
    "cuda-12.8" = mkToolkit "cuda-12.8" pkgs.cudaPackages_12_8;
  };
}
