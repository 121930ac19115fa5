# packages.gdn-bundle (and its variants): the CUDA kernel bundle built by
# `gdn-gen` from the inputs pinned in gdn-bundle.lock.json.
#
# Nothing is hashed here: URLs and sha256s are read from the lock, so the
# lock stays the one place they are recorded.
{ pkgs
, lib
, lock
, src
, generator
, toolkit
, # Key in lock.variants ("cuda-13.0", "cuda-12.8").
  variant
, # The lock's top-level `nvcc_version` describes the default variant only.
  isDefaultVariant
, # Non-null only for the second build of checks.bundle-deterministic: it
  # changes the derivation hash (forcing an independent build) and nothing else.
  rebuildSalt ? null
}:
let
  variantStatus = (lock.variants.${variant} or { status = "missing"; }).status;
  recorded = variantStatus == "recorded";

  # The CuTe DSL units run under this interpreter; the lock pins a wheel set
  # per Python major.minor (cp311, cp312) and gdn-gen picks by the version.
  python = pkgs.python312;
  pythonMinor = lib.versions.majorMinor python.version;

  # Kernel sources (FlashInfer for nvcc, FlashInfer + CuTe DSL wheels for the
  # DSL units); toolchain wheels are replaced by nixpkgs' toolkit.
  kernelInputs = builtins.filter
    (input:
      builtins.elem input.role [ "kernel-source" "dsl-kernel-source" "dsl-runtime" ]
      && ((input.python or null) == null || input.python == pythonMinor))
    lock.inputs;

  # `--inputs-dir`: a directory of files named exactly by their lock filename.
  inputEntries = map
    (input: {
      name = input.filename;
      path = pkgs.fetchurl {
        inherit (input) url sha256;
        name = input.filename;
      };
    })
    kernelInputs;
  inputsDir = pkgs.linkFarm "gdn-bundle-inputs" inputEntries;

  # The lock records nvcc as `nvcc --version` prints it ("V13.0.88").
  expectedNvcc = lock.nvcc_version;
  nvccMatches = !isDefaultVariant || "V${toolkit.nvccVersion}" == expectedNvcc;

  # Sources the generator resolves relative to the lock's directory.
  bundleSource = lib.fileset.toSource {
    root = src;
    fileset = lib.fileset.unions [
      (src + "/gdn-bundle.lock.json")
      (src + "/generator/artifacts.json")
      (src + "/crates/gdn-kernels/cuda")
      # The CuTe DSL export driver: a locked source (build.rs and gdn-gen check it).
      (src + "/generator/cute_dsl")
      (lib.fileset.maybeMissing (src + "/patches"))
    ];
  };

  unrecordedBanner = ''
    echo "################################################################" >&2
    echo "## WARNING: variant ${variant} is '${variantStatus}' in gdn-bundle.lock.json." >&2
    echo "## Its device outputs have never been recorded, so this build is" >&2
    echo "## NOT compared with the lock (gdn-gen check is skipped)." >&2
    echo "## Do not ship it; record the variant in the lock first." >&2
    echo "################################################################" >&2
  '';

  drv = toolkit.stdenv.mkDerivation ({
    name = "gdn-bundle-${variant}";
    src = bundleSource;

    nativeBuildInputs = [ generator ];

    dontConfigure = true;

    buildPhase = ''
      runHook preBuild
      ${if recorded then "" else unrecordedBanner}
      # nvcc and the generator must not touch a real home directory.
      export HOME="$TMPDIR/home"
      mkdir -p "$HOME"
      # The DSL wheels' native libraries look for libstdc++ (see gdn-gen's
      # GDN_DSL_LIBRARY_PATH).
      export GDN_DSL_LIBRARY_PATH=${lib.makeLibraryPath [ pkgs.stdenv.cc.cc.lib pkgs.zlib ]}
      gdn-gen build \
        --python ${python}/bin/python3 \
        --lock "$PWD/gdn-bundle.lock.json" \
        --out "$out" \
        --cache "$TMPDIR/gdn-cache" \
        --toolkit-root ${toolkit.root} \
        --inputs-dir ${inputsDir} \
        --variant ${variant} \
        --offline
      runHook postBuild
    '';

    # Compare the fresh bundle with the recorded device outputs. Skipped only
    # for variants the lock has not recorded (see the banner above).
    doCheck = recorded;
    checkPhase = ''
      runHook preCheck
      gdn-gen check --allow-foreign-host-compiler --bundle "$out" --lock "$PWD/gdn-bundle.lock.json"
      runHook postCheck
    '';

    dontInstall = true;
    # Fixup would strip and patch ELF files: cubins must stay byte-identical.
    dontFixup = true;

    # No store path (toolkit, compiler, inputs) may leak into the bundle.
    allowedReferences = [ ];

    passthru = {
      inherit variant recorded inputsDir toolkit python;
      kernelSources = map (entry: entry.path) inputEntries;
    };

    meta.description =
      "GDN CUDA kernel bundle (${variant}, lock status: ${variantStatus})";
  } // (if rebuildSalt == null then { } else { GDN_NIX_REBUILD_SALT = rebuildSalt; }));
in
if nvccMatches then
  drv
else
  throw ''
    gdn-bundle: the pinned nixpkgs gives nvcc ${toolkit.nvccVersion} for ${variant},
    but gdn-bundle.lock.json records nvcc ${expectedNvcc}. Pin a nixpkgs revision in
    flake.lock whose cudaPackages_13_0.cuda_nvcc is ${expectedNvcc}
    (`nix flake lock --override-input nixpkgs github:NixOS/nixpkgs/<rev>`),
    or record a new lock with `gdn-gen` for the new toolchain.''
