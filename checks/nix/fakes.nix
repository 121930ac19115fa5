# Test doubles of nixpkgs and crane for eval-test.nix.
#
# Every builder returns an attrset that records its arguments (`fakeArgs`),
# the builder used (`fakeKind`) and a fake `outPath` derived from those
# arguments, so string interpolation works and changed arguments give a
# different path, as with real derivations.
{ nvccVersion }:
let
  isSerializable = value: !(builtins.isFunction value);

  # passthru may hold package sets with functions; toJSON cannot take them.
  hashedArgs = args:
    let
      kept = builtins.filter
        (name: name != "passthru" && isSerializable args.${name})
        (builtins.attrNames args);
    in
    builtins.listToAttrs (map (name: { inherit name; value = args.${name}; }) kept);

  mkFake = kind: args:
    let
      name = args.name or "${args.pname or "anonymous"}-${args.version or "0"}";
      hash = builtins.hashString "sha256" (kind + name + builtins.toJSON (hashedArgs args));
    in
    (args.passthru or { }) // args // {
      inherit name;
      fakeKind = kind;
      fakeArgs = args;
      outPath = "/nix/store/${builtins.substring 0 32 hash}-${name}";
    };

  mkRedist = pname: version: outputs:
    let
      base = mkFake "redist" { inherit pname version outputs; };
      withOutputs = base // builtins.listToAttrs (map
        (output: {
          name = output;
          value = mkFake "redist-output" { name = "${pname}-${version}-${output}"; };
        })
        outputs);
    in
    withOutputs;

  mkCudaPackages = label: nvcc: extra:
    {
      cuda_nvcc = mkRedist "cuda_nvcc" nvcc [ "out" "static" ];
      cuda_cudart = mkRedist "cuda_cudart" "${label}-cudart" [ "out" "dev" "lib" "static" "stubs" ];
      cuda_cccl = mkRedist "cuda_cccl" "${label}-cccl" [ "out" "dev" ];
      backendStdenv.mkDerivation = mkFake "backendStdenv-${label}.mkDerivation";
    } // extra;

  pkgs = {
    cudaPackages_13_0 = mkCudaPackages "13.0" nvccVersion {
      cuda_crt = mkRedist "cuda_crt" "13.0-crt" [ "out" ];
    };
    cudaPackages_12_8 = mkCudaPackages "12.8" "12.8.93" { };

    stdenv = {
      mkDerivation = mkFake "stdenv.mkDerivation";
      cc.cc.lib = mkFake "lib" { name = "gcc-lib"; };
    };
    # nixos-25.11's 3.12 interpreter (the patch level is not 3.12.3; see docs/nix.md).
    python312 = mkFake "python" { name = "python3-3.12.11"; version = "3.12.11"; };
    zlib = mkFake "lib" { name = "zlib"; };
    symlinkJoin = mkFake "symlinkJoin";
    fetchurl = mkFake "fetchurl";
    linkFarm = name: entries: mkFake "linkFarm" { inherit name entries; };
    runCommand = name: env: buildCommand: mkFake "runCommand" (env // { inherit name buildCommand; });
    writeShellScriptBin = name: text: mkFake "writeShellScriptBin" { inherit name text; };

    autoAddDriverRunpath = mkFake "hook" { name = "auto-add-driver-runpath-hook"; };
    cargo-nextest = mkFake "tool" { name = "cargo-nextest"; };
    nixpkgs-fmt = mkFake "tool" { name = "nixpkgs-fmt"; };
    deadnix = mkFake "tool" { name = "deadnix"; };
    cachix = mkFake "tool" { name = "cachix"; };
    jq = mkFake "tool" { name = "jq"; };
  };

  # The subset of nixpkgs.lib that flake.nix and nix/*.nix use.
  lib = {
    versions.majorMinor = version:
      let parts = builtins.splitVersion version; in
      "${builtins.elemAt parts 0}.${builtins.elemAt parts 1}";
    makeLibraryPath = packages:
      builtins.concatStringsSep ":" (map (package: "${package}/lib") packages);
    genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);
    fileset = {
      toSource = { root, fileset }: {
        inherit root;
        fakeFileset = fileset;
        outPath = "/nix/store/00000000000000000000000000000000-source";
      };
      unions = members: { fakeUnion = members; };
      maybeMissing = path: { fakeMaybeMissing = path; };
      fileFilter = predicate: path: { fakeFileFilter = path; inherit predicate; };
    };
  };

  crane.mkLib = _pkgs: {
    fileset.commonCargoSources = path: { fakeCommonCargoSources = path; };
    crateNameFromCargoToml = _: { pname = "fake"; version = "0.0.0-test"; };
    buildDepsOnly = mkFake "crane.buildDepsOnly";
    buildPackage = mkFake "crane.buildPackage";
    cargoClippy = mkFake "crane.cargoClippy";
    cargoFmt = mkFake "crane.cargoFmt";
    cargoDoc = mkFake "crane.cargoDoc";
    cargoNextest = mkFake "crane.cargoNextest";
    devShell = mkFake "crane.devShell";
  };
in
{
  inherit pkgs lib crane;
}
