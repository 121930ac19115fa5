# Test doubles of nixpkgs and crane for eval-test.nix and for the flake
# evaluation with a current Nix (checks/nix/modern-nix.sh, through the flakes
# in fake-nixpkgs/ and fake-crane/).
#
# Every builder returns a real derivation that is never built (its builder
# fails on purpose), so `nix flake show`, `nix flake check --no-build` and
# `.drvPath` work on it, with its arguments kept as attributes next to
# `fakeArgs` (all of them) and `fakeKind` (the builder used). The arguments
# that can be derivation attributes are also passed to `derivation`, so
# changed arguments give a different drvPath and outPath, as with real
# builders, and references between fakes become input derivations.
{ nvccVersion }:
let
  system = "x86_64-linux";

  # Attributes `derivation` reserves or that real builders do not pass on.
  notEnv = [ "name" "system" "builder" "args" "outputs" "passthru" "meta" "__structuredAttrs" "__ignoreNulls" ];

  isPlain = value:
    builtins.isString value || builtins.isInt value || builtins.isBool value
    || value == null || (builtins.isAttrs value && value ? outPath);

  # Lists of strings/derivations and plain values go in as they are; other
  # values (attrsets, lists of records) as JSON text.
  toEnvValue = value:
    if isPlain value || (builtins.isList value && builtins.all isPlain value)
    then value
    else builtins.toJSON value;

  envOf = args: builtins.listToAttrs (map
    (name: { inherit name; value = toEnvValue args.${name}; })
    (builtins.filter
      (name: !(builtins.elem name notEnv) && !(builtins.isFunction args.${name}))
      (builtins.attrNames args)));

  mkFake = kind: args:
    let
      name = args.name or "${args.pname or "anonymous"}-${args.version or "0"}";
      drv = derivation (envOf args // {
        inherit name system;
        fakeKind = kind;
        builder = "/bin/sh";
        args = [ "-c" "echo 'test double (${kind}) from checks/nix/fakes.nix: never built' >&2; exit 1" ];
      });
    in
    (args.passthru or { }) // args // {
      inherit name system;
      inherit (drv) type drvPath outPath drvAttrs;
      outputName = "out";
      fakeKind = kind;
      fakeArgs = args;
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
    curl = mkFake "tool" { name = "curl"; };
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
