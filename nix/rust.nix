# Shared crane setup for the Cargo workspace: source, dependency artifacts
# and the `gdn-gen` generator binary.
{ pkgs, lib, crane, src, toolkitRoot }:
let
  craneLib = crane.mkLib pkgs;

  # cleanCargoSource would drop the lock, the artifact list and the CUDA
  # sources that gdn-kernels' build.rs and the generator read.
  rustSource = lib.fileset.toSource {
    root = src;
    fileset = lib.fileset.unions [
      (craneLib.fileset.commonCargoSources src)
      (src + "/gdn-bundle.lock.json")
      (src + "/generator/artifacts.json")
      (src + "/crates/gdn-kernels/cuda")
      # The CuTe DSL export driver: a locked source (build.rs and gdn-gen check it).
      (src + "/generator/cute_dsl")
      (lib.fileset.maybeMissing (src + "/patches"))
      # Test fixtures and snapshots (sample locks, manifests), and gdn-http's
      # openapi.json (include_str!).
      (lib.fileset.fileFilter (file: file.hasExt "json") (src + "/crates"))
      (lib.fileset.fileFilter (file: file.hasExt "json") (src + "/generator"))
      # Whole fixture directories: checkpoints (.safetensors), tokenizers,
      # chat templates (.jinja) and their golden renders, read by the tests.
      (lib.fileset.maybeMissing (src + "/crates/qwen35/tests/fixtures"))
      (lib.fileset.maybeMissing (src + "/crates/server/tests/fixtures"))
      # The demo checkpoint, tokenizer and chat template that the gdn-server
      # binary embeds with include_bytes! (gdn-http's tests read them too).
      (lib.fileset.maybeMissing (src + "/crates/server/demo"))
    ];
  };

  workspace = craneLib.crateNameFromCargoToml { cargoToml = src + "/Cargo.toml"; };

  commonArgs = {
    src = rustSource;
    pname = "gdn";
    inherit (workspace) version;
    strictDeps = true;
    # Headers and libcudart_static.a for gdn-kernels' C ABI wrapper.
    buildInputs = [ toolkitRoot ];
  };

  # crane swaps every build.rs for a dummy here, so no bundle is needed yet.
  cargoArtifacts = craneLib.buildDepsOnly commonArgs;

  generator = craneLib.buildPackage (commonArgs // {
    inherit cargoArtifacts;
    pname = "gdn-gen";
    cargoExtraArgs = "--locked --package gdn-gen";
    # Its tests run in checks.cargo-test with the rest of the workspace.
    doCheck = false;
    meta.mainProgram = "gdn-gen";
  });
in
{
  inherit craneLib rustSource commonArgs cargoArtifacts generator;
}
