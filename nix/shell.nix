# devShells.default: cargo/rustc from crane plus the same CUDA toolkit root
# the Nix bundle build uses.
{ pkgs, rust, toolkit }:
rust.craneLib.devShell {
  packages = [
    toolkit.root
    pkgs.cargo-nextest
    pkgs.nixpkgs-fmt
    pkgs.deadnix
    pkgs.cachix
    pkgs.jq
  ];

  # For `gdn-gen build --toolkit-root "$GDN_TOOLKIT_ROOT" ...`.
  GDN_TOOLKIT_ROOT = "${toolkit.root}";

  shellHook = ''
    echo "gdn: nvcc ${toolkit.nvccVersion} (${toolkit.variant}) at $GDN_TOOLKIT_ROOT" >&2
  '';
}
