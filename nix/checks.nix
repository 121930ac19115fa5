# checks (CPU only, run by `nix flake check`) and gpuChecks (need a builder
# with the `cuda` system feature; kept out of `checks` so a machine without a
# GPU can still run `nix flake check`).
{ pkgs, rust, generator, bundle, bundleSecondBuild }:
let
  inherit (rust) craneLib commonArgs cargoArtifacts;

  # Everything that runs build scripts needs the bundle (gdn-kernels' build.rs).
  withBundle = commonArgs // {
    inherit cargoArtifacts;
    GDN_BUNDLE_DIR = "${bundle}";
    # The Nix bundle's host objects come from nixpkgs' compiler, not the
    # lock's; build.rs still checks they embed the locked cubins.
    GDN_ALLOW_FOREIGN_HOST_OBJECTS = "1";
  };
in
{
  checks = {
    # The packaged bundle against the lock it was built from (also done
    # inside the bundle build; this keeps it visible as its own check).
    bundle-matches-lock = pkgs.runCommand "gdn-bundle-matches-lock"
      { nativeBuildInputs = [ generator ]; }
      ''
        gdn-gen check --allow-foreign-host-compiler --bundle ${bundle} --lock ${bundle.src}/gdn-bundle.lock.json
        touch "$out"
      '';

    # Two independent builds (different derivation hashes, same inputs) must
    # be bit-identical. `nix build .#gdn-bundle --rebuild` is the cheaper
    # variant when the bundle is already in the store.
    bundle-deterministic = pkgs.runCommand "gdn-bundle-deterministic" { } ''
      if ! diff -r --no-dereference ${bundle} ${bundleSecondBuild}; then
        echo "gdn-bundle is not deterministic: the two builds above differ." >&2
        exit 1
      fi
      touch "$out"
    '';

    cargo-clippy = craneLib.cargoClippy (withBundle // {
      cargoClippyExtraArgs = "--all-targets -- --deny warnings";
    });

    cargo-fmt = craneLib.cargoFmt { inherit (commonArgs) src pname version; };

    cargo-doc = craneLib.cargoDoc withBundle;

    # Tests that need a GPU must skip themselves when none is present.
    # generator/tests/fake_repo.rs drives gdn-gen's fetch step (curl) and
    # makes FIFOs (coreutils, in stdenv).
    cargo-test = craneLib.cargoNextest (withBundle // {
      nativeBuildInputs = (commonArgs.nativeBuildInputs or [ ]) ++ [ pkgs.curl ];
    });
  };

  gpuChecks = {
    cargo-test-gpu = craneLib.cargoNextest (withBundle // {
      pname = "gdn-gpu";
      requiredSystemFeatures = [ "cuda" ];
      # nix-required-mounts exposes the driver at /run/opengl-driver/lib.
      preCheck = ''
        export LD_LIBRARY_PATH=/run/opengl-driver/lib''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      '';
    });
  };
}
