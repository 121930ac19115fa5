# Evaluates flake.nix and nix/*.nix against the test doubles in fakes.nix and
# returns a list of { name, ok, detail } for run.sh to report.
#
# `root` is a directory holding copies of flake.nix, nix/ and a
# gdn-bundle.lock.json (the real one, or a minimal stand-in written by run.sh).
{ root }:
let
  system = "x86_64-linux";
  fakes = import ./fakes.nix { nvccVersion = "13.0.88"; };
  lock = builtins.fromJSON (builtins.readFile (root + "/gdn-bundle.lock.json"));
  flake = import (root + "/flake.nix");

  outputsWith = fakeNixpkgsDir: flake.outputs {
    self = { };
    nixpkgs = { outPath = fakeNixpkgsDir; inherit (fakes) lib; };
    inherit (fakes) crane;
  };

  out = outputsWith ./fake-nixpkgs;
  mismatched = outputsWith ./fake-nixpkgs-nvcc-mismatch;

  packages = out.packages.${system};
  checks = out.checks.${system};
  gpuChecks = out.gpuChecks.${system};
  bundle = packages.gdn-bundle;
  bundle12 = packages.gdn-bundle-cuda12_8;

  # Small helpers (no nixpkgs lib here on purpose).
  # Regexes may not carry string context (the fakes' paths are real derivations).
  noContext = builtins.unsafeDiscardStringContext;
  hasInfix = needle: haystack: builtins.length (builtins.split (escapeRegex (noContext needle)) (noContext haystack)) > 1;
  escapeRegex = builtins.replaceStrings
    [ "\\" "." "[" "]" "(" ")" "{" "}" "*" "+" "?" "^" "$" "|" ]
    [ "\\\\" "\\." "\\[" "\\]" "\\(" "\\)" "\\{" "\\}" "\\*" "\\+" "\\?" "\\^" "\\$" "\\|" ];
  all = builtins.all (x: x);
  names = builtins.attrNames;
  hasAll = set: wanted: all (map (name: set ? ${name}) wanted);
  missing = set: wanted: builtins.filter (name: !(set ? ${name})) wanted;
  show = builtins.toJSON;
  # Fileset members are paths or test-double records; render them as text.
  toString' = member:
    if builtins.isAttrs member
    then toString (member.fakeMaybeMissing or member.fakeFileFilter or member.fakeCommonCargoSources or "")
    else toString member;
  nameOf = drv: drv.name;

  check = name: ok: detail: { inherit name ok; detail = if ok then "" else detail; };

  pythonMinor = "3.12";
  kernelInputs = builtins.filter
    (input:
      builtins.elem input.role [ "kernel-source" "dsl-kernel-source" "dsl-runtime" ]
      && ((input.python or null) == null || input.python == pythonMinor))
    lock.inputs;
  toolchainInputs = builtins.filter (input: input.role == "toolchain") lock.inputs;
  fetched = map (src: { inherit (src) url sha256; }) bundle.kernelSources;
  expected = map (input: { inherit (input) url sha256; }) kernelInputs;

  buildPhase = bundle.buildPhase;
  generatorFlags = [ "gdn-gen build" "--lock" "--out" "--cache" "--toolkit-root" "--inputs-dir" "--offline" ];

  toolkit13 = bundle.toolkit.root;
  toolkit12 = bundle12.toolkit.root;

  storePathsOf = pattern: text:
    map builtins.head (builtins.filter builtins.isList (builtins.split "(/nix/store/[0-9a-z]{32}-${pattern})" (noContext text)));
  deterministicPaths = storePathsOf "gdn-bundle-cuda-13\\.0" checks.bundle-deterministic.buildCommand;

  # Directories the crane source must keep whole (beyond Rust files and JSON).
  serverSourceDirs = [ "crates/server/demo" "crates/server/tests/fixtures" "crates/qwen35/tests/fixtures" ];

  wantedPackages = [ "default" "gdn-bundle" "gdn-bundle-cuda12_8" "gdn-gen" "server" "gdn-server" ];
  wantedChecks = [ "bundle-matches-lock" "bundle-deterministic" "cargo-clippy" "cargo-fmt" "cargo-doc" "cargo-test" ];
  needsCuda = drv: builtins.elem "cuda" (drv.requiredSystemFeatures or [ ]);

  config = import (root + "/nix/nixpkgs-config.nix");
  unfreeOk = pname: config.allowUnfreePredicate { inherit pname; };

  mismatchEval = builtins.tryEval mismatched.packages.${system}.gdn-bundle.outPath;
  variant12Eval = builtins.tryEval bundle12.outPath;
in
[
  (check "flake outputs: packages.${system} has ${show wantedPackages}"
    (hasAll packages wantedPackages) "missing ${show (missing packages wantedPackages)}")
  (check "flake outputs: apps.${system}.server runs the launcher's gdn-server"
    (out.apps.${system}.server.type == "app"
      && out.apps.${system}.server.program == "${packages.server.launcher}/bin/gdn-server")
    "apps.server = ${show out.apps.${system}.server}")
  (check "apps.server launcher execs the server package's bin/gdn-server unconditionally"
    (hasInfix "exec ${packages.server}/bin/gdn-server \"$@\"" packages.server.launcher.text
      && !(hasInfix "if [ ! -x" packages.server.launcher.text))
    "launcher: ${packages.server.launcher.text}")
  (check "flake outputs: devShells.${system}.default exists and carries the toolkit"
    (out.devShells.${system} ? default
      && builtins.elem toolkit13 out.devShells.${system}.default.packages)
    "devShells = ${show (names out.devShells.${system})}")
  (check "flake outputs: checks.${system} has ${show wantedChecks}"
    (hasAll checks wantedChecks) "missing ${show (missing checks wantedChecks)}")
  (check "packages.server and packages.gdn-server are the same crane build"
    (packages.server.outPath == packages.gdn-server.outPath
      && packages.server.fakeKind == "crane.buildPackage")
    "server kind ${packages.server.fakeKind}")

  (check "lock is read: fetched kernel-source url/sha256 equal the lock's (${toString (builtins.length expected)} inputs)"
    (expected != [ ] && fetched == expected)
    "fetched ${show fetched}, lock has ${show expected}")
  (check "toolchain-role inputs are not fetched under Nix"
    (all (map (input: !(builtins.elem input.url (map (f: f.url) fetched))) toolchainInputs))
    "a toolchain input was fetched")
  (check "--inputs-dir holds each kernel source under its lock filename"
    (map (entry: entry.name) bundle.inputsDir.entries == map (input: input.filename) kernelInputs)
    "entries ${show (map (entry: entry.name) bundle.inputsDir.entries)}")
  (check "generator invocation has ${show generatorFlags}"
    (all (map (flag: hasInfix flag buildPhase) generatorFlags))
    "buildPhase: ${buildPhase}")
  (check "the CuTe DSL units get the pinned Python 3.12 and only its wheel set"
    (hasInfix "--python ${bundle.python}/bin/python3" buildPhase
      && all (map (input: (input.python or pythonMinor) == pythonMinor) kernelInputs)
      && builtins.any (input: input.role == "dsl-runtime" && (input.python or null) == pythonMinor) kernelInputs
      && !(builtins.any (input: (input.python or null) == "3.11") kernelInputs))
    "buildPhase: ${buildPhase}")
  (check "generator gets this toolkit root and this inputs dir"
    (hasInfix "--toolkit-root ${toolkit13}" buildPhase
      && hasInfix "--inputs-dir ${bundle.inputsDir}" buildPhase)
    "buildPhase: ${buildPhase}")
  (check "bundle is checked against the lock after building (gdn-gen check)"
    (bundle.doCheck && hasInfix "gdn-gen check --allow-foreign-host-compiler --bundle \"$out\" --lock" bundle.checkPhase)
    "doCheck=${show bundle.doCheck} checkPhase=${bundle.checkPhase}")
  (check "bundle: allowedReferences == [ ]"
    (bundle ? allowedReferences && bundle.allowedReferences == [ ])
    "allowedReferences = ${show (bundle.allowedReferences or "unset")}")
  (check "bundle: dontFixup (no strip/patchelf on cubins)"
    (bundle.dontFixup or false) "dontFixup unset")
  (check "bundle is built with cudaPackages_13_0.backendStdenv"
    (bundle.fakeKind == "backendStdenv-13.0.mkDerivation") "built with ${bundle.fakeKind}")
  (check "bundle source holds the lock, artifacts.json, CUDA sources and patches"
    (all (map (needle: hasInfix needle (show (map toString' bundle.src.fakeFileset.fakeUnion)))
      [ "/gdn-bundle.lock.json" "/generator/artifacts.json" "/crates/gdn-kernels/cuda" "/patches" ]))
    "fileset ${show (map toString' bundle.src.fakeFileset.fakeUnion)}")

  (check "toolkit 13.0 = all outputs of nvcc, cudart (incl. static), cccl, crt"
    (map nameOf toolkit13.paths == [
      "cuda_nvcc-13.0.88-out"
      "cuda_nvcc-13.0.88-static"
      "cuda_cudart-13.0-cudart-out"
      "cuda_cudart-13.0-cudart-dev"
      "cuda_cudart-13.0-cudart-lib"
      "cuda_cudart-13.0-cudart-static"
      "cuda_cudart-13.0-cudart-stubs"
      "cuda_cccl-13.0-cccl-out"
      "cuda_cccl-13.0-cccl-dev"
      "cuda_crt-13.0-crt-out"
    ])
    "paths ${show (map nameOf toolkit13.paths)}")
  (check "toolkit 12.8 evaluates without cuda_crt"
    (variant12Eval.success && !(builtins.any (p: hasInfix "cuda_crt" p.name) toolkit12.paths))
    "paths ${show (map nameOf toolkit12.paths)}")
  (check "cuda-12.8 variant: lock entry unrecorded -> loud warning, lock comparison skipped"
    (lock.variants."cuda-12.8".status or "missing" == "recorded"
      || (!bundle12.doCheck && hasInfix "WARNING: variant cuda-12.8" bundle12.buildPhase))
    "doCheck=${show bundle12.doCheck}")
  (check "nvcc from nixpkgs != lock nvcc_version -> evaluation refuses"
    (!mismatchEval.success) "bundle evaluated with a mismatched nvcc")

  (check "server: GDN_BUNDLE_DIR = \"\${bundle}\""
    ((packages.server.GDN_BUNDLE_DIR or "") == "${bundle}")
    "GDN_BUNDLE_DIR = ${show (packages.server.GDN_BUNDLE_DIR or null)}")
  (check "server: crane builds only the gdn-server binary of package gdn-server, --locked"
    (all (map (flag: hasInfix flag packages.server.cargoExtraArgs) [ "--locked" "--package gdn-server" "--bin gdn-server" ])
      && !(hasInfix "--workspace" packages.server.cargoExtraArgs)
      && packages.server.pname == "gdn-server"
      && packages.server.meta.mainProgram == "gdn-server")
    "cargoExtraArgs = ${packages.server.cargoExtraArgs}, pname = ${packages.server.pname}")
  (check "server: source keeps the demo checkpoint (include_bytes!) and the test fixture directories"
    (all (map (needle: builtins.elem needle (map (member: noContext (toString' member)) packages.server.src.fakeFileset.fakeUnion))
      (map (dir: "${toString root}/${dir}") serverSourceDirs)))
    "fileset ${show (map toString' packages.server.src.fakeFileset.fakeUnion)}")
  (check "server: autoAddDriverRunpath in nativeBuildInputs"
    (builtins.any (d: d.name == "auto-add-driver-runpath-hook") packages.server.nativeBuildInputs)
    "nativeBuildInputs ${show (map nameOf packages.server.nativeBuildInputs)}")
  (check "checks: clippy runs with --deny warnings"
    (hasInfix "--deny warnings" checks.cargo-clippy.cargoClippyExtraArgs)
    "cargoClippyExtraArgs = ${checks.cargo-clippy.cargoClippyExtraArgs}")
  (check "checks: clippy, doc and test builds see GDN_BUNDLE_DIR"
    (all (map (c: (c.GDN_BUNDLE_DIR or "") == "${bundle}") [ checks.cargo-clippy checks.cargo-doc checks.cargo-test ]))
    "a cargo check lacks GDN_BUNDLE_DIR")
  (check "checks: bundle-matches-lock runs gdn-gen check on the bundle"
    (hasInfix "gdn-gen check --allow-foreign-host-compiler --bundle ${bundle}" checks.bundle-matches-lock.buildCommand)
    "buildCommand ${checks.bundle-matches-lock.buildCommand}")
  (check "checks: bundle-deterministic compares two distinct builds"
    (builtins.length deterministicPaths == 2
      && builtins.elem "${bundle}" deterministicPaths
      && builtins.elemAt deterministicPaths 0 != builtins.elemAt deterministicPaths 1)
    "paths ${show deterministicPaths}")
  (check "gpuChecks: non-empty, each requiredSystemFeatures = [ \"cuda\" ]"
    (gpuChecks != { } && all (map (c: c.requiredSystemFeatures or [ ] == [ "cuda" ]) (builtins.attrValues gpuChecks)))
    "gpuChecks ${show (names gpuChecks)}")
  (check "checks: no check needs the cuda feature; no GPU check in default checks"
    (!(builtins.any needsCuda (builtins.attrValues checks))
      && builtins.filter (name: checks ? ${name}) (names gpuChecks) == [ ])
    "checks ${show (names checks)}")
  (check "nixpkgs config: unfree allowed for CUDA redists only"
    (unfreeOk "cuda_nvcc" && unfreeOk "cuda_cudart" && unfreeOk "libcublas" && !(unfreeOk "steam"))
    "predicate mismatch")
]
