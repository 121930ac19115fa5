{
  description = "gdn-bundle: reproducible CUDA kernel bundle and the Rust workspace that uses it";

  inputs = {
    # Pinned in flake.lock; see docs/nix.md for why this revision (nvcc 13.0.88).
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";
    crane.url = "github:ipetkov/crane";
  };

  # Only honoured with --accept-flake-config by trusted users; docs/nix.md
  # describes the `cachix use` route, which works for everyone.
  nixConfig = {
    extra-substituters = [ "https://cache.nixos-cuda.org" ];
    extra-trusted-public-keys = [ "cache.nixos-cuda.org:74DUi4Ye579gUqzH4ziL9IyiJBlDpMRn9MBN8oNan9M=" ];
  };

  outputs = { nixpkgs, crane, ... }:
    let
      # The lock records an x86_64 toolchain; other systems are not built.
      systems = [ "x86_64-linux" ];

      perSystem = nixpkgs.lib.genAttrs systems (system: import ./nix {
        pkgs = import nixpkgs {
          inherit system;
          config = import ./nix/nixpkgs-config.nix;
        };
        inherit (nixpkgs) lib;
        inherit crane;
        src = ./.;
      });

      output = name: builtins.mapAttrs (_system: outputs: outputs.${name}) perSystem;
    in
    {
      packages = output "packages";
      apps = output "apps";
      checks = output "checks";
      # Not a standard flake output: `nix flake check` skips it. Build on a
      # builder with the `cuda` system feature: nix build .#gpuChecks.x86_64-linux.cargo-test-gpu
      gpuChecks = output "gpuChecks";
      devShells = output "devShells";
    };
}
