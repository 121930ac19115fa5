# packages.server: the `gdn-server` binary (crates/server) built with crane
# against the Nix-built bundle, and the launcher that apps.server runs.
{ pkgs, rust, bundle }:
let
  package = rust.craneLib.buildPackage (rust.commonArgs // {
    inherit (rust) cargoArtifacts;
    pname = "gdn-server";
    # Only the server package: its dependencies (gdn-http, engine, qwen35,
    # gdn-kernels) are built as libraries, and gdn-gen is not installed next
    # to it. The test kits (crates/testkits) are dev-dependencies only.
    cargoExtraArgs = "--locked --package gdn-server --bin gdn-server";
    # Read by gdn-kernels' build.rs, which verifies the bundle and embeds it.
    GDN_BUNDLE_DIR = "${bundle}";
    # Host objects from nixpkgs' compiler (not the lock's); device code is
    # still checked against the lock by build.rs.
    GDN_ALLOW_FOREIGN_HOST_OBJECTS = "1";
    # NixOS: adds /run/opengl-driver/lib to the RUNPATH so libcuda (loaded
    # by cudarc at run time) is found. Other hosts: see `launcher`.
    nativeBuildInputs = [ pkgs.autoAddDriverRunpath ];
    # The test suite runs in checks.cargo-test.
    doCheck = false;
    passthru = { inherit bundle launcher; };
    meta = {
      description = "OpenAI-compatible server for Qwen3.5 on the GDN kernel bundle";
      mainProgram = "gdn-server";
    };
  });

  # apps.server. On hosts without /run/opengl-driver (non-NixOS), point
  # GDN_CUDA_DRIVER_DIR at a directory holding only the driver's libcuda.so.1
  # (and its libnvidia-* companions); putting the whole host lib directory on
  # LD_LIBRARY_PATH would shadow Nix's glibc and libstdc++. Without a driver
  # the server falls back to the CPU (`--device auto`).
  launcher = pkgs.writeShellScriptBin "gdn-server" ''
    if [ -n "''${GDN_CUDA_DRIVER_DIR:-}" ]; then
      export LD_LIBRARY_PATH="$GDN_CUDA_DRIVER_DIR''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    exec ${package}/bin/gdn-server "$@"
  '';
in
{
  inherit package launcher;
}
