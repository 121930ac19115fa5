# Composes the per-system outputs. Every file under nix/ is a plain function
# of its arguments, so checks/nix/eval-test.nix can call this with test
# doubles of pkgs, lib and crane.
{ pkgs
, lib
, crane
, src
, lock ? builtins.fromJSON (builtins.readFile ../gdn-bundle.lock.json)
}:
let
  toolchain = import ./toolchain.nix { inherit pkgs; };
  defaultToolkit = toolchain.variants.${toolchain.default};

  rust = import ./rust.nix {
    inherit pkgs lib crane src;
    toolkitRoot = defaultToolkit.root;
  };

  mkBundle = variant: rebuildSalt: import ./bundle.nix {
    inherit pkgs lib lock src variant rebuildSalt;
    inherit (rust) generator;
    toolkit = toolchain.variants.${variant};
    isDefaultVariant = variant == toolchain.default;
  };

  bundle = mkBundle toolchain.default null;

  server = import ./server.nix { inherit pkgs rust bundle; };

  allChecks = import ./checks.nix {
    inherit pkgs rust bundle;
    inherit (rust) generator;
    bundleSecondBuild = mkBundle toolchain.default "second-build";
  };
in
{
  packages = {
    default = bundle;
    gdn-bundle = bundle;
    gdn-bundle-cuda12_8 = mkBundle "cuda-12.8" null;
    gdn-gen = rust.generator;
    server = server.package;
    gdn-server = server.package;
    cuda-toolkit = defaultToolkit.root;
  };

  apps.server = {
    type = "app";
    program = "${server.launcher}/bin/gdn-server";
    meta.description = "Run gdn-server (OpenAI-compatible server; the embedded demo model without --model)";
  };

  inherit (allChecks) checks gpuChecks;

  devShells.default = import ./shell.nix {
    inherit pkgs rust;
    toolkit = defaultToolkit;
  };
}
