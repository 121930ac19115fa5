# packages.server: the workspace built with crane against the Nix-built bundle.
#
# No server binary exists yet; `gdn-server` is the placeholder name the
# package, the app and the launcher use. Until it lands, this builds every
# workspace binary (today: gdn-gen) and `nix run .#server` reports the missing
# binary.
{ pkgs, rust, bundle }:
let
  package = rust.craneLib.buildPackage (rust.commonArgs // {
    inherit (rust) cargoArtifacts;
    pname = "gdn-server";
    cargoExtraArgs = "--locked --workspace";
    # Read by gdn-kernels' build.rs, which verifies the bundle.
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
    meta.mainProgram = "gdn-server";
  });

  # apps.server. On hosts without /run/opengl-driver (non-NixOS), point
  # GDN_CUDA_DRIVER_DIR at a directory holding only the driver's libcuda.so.1
  # (and its libnvidia-* companions); putting the whole host lib directory on
  # LD_LIBRARY_PATH would shadow Nix's glibc and libstdc++.
  launcher = pkgs.writeShellScriptBin "gdn-server" ''
    if [ -n "''${GDN_CUDA_DRIVER_DIR:-}" ]; then
      export LD_LIBRARY_PATH="$GDN_CUDA_DRIVER_DIR''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    server=${package}/bin/gdn-server
    if [ ! -x "$server" ]; then
      echo "gdn-server: no server binary in ${package}/bin yet (the runtime has not landed)." >&2
      exit 127
    fi
    exec "$server" "$@"
  '';
in
{
  inherit package launcher;
}
