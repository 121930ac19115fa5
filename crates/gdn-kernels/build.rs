//! Verifies the GDN bundle against the lock and links it. Fails closed: a
//! missing, stale or tampered bundle stops the build with the artifact, the
//! expected and the actual value. Needs no nvcc and no Python.
//!
//! Cargo reruns it when a file it names is newer than its last run or a
//! variable it reads changed, so an incremental build does not see a locked
//! source or bundle file replaced with its old timestamp kept (`cp -p`,
//! `rsync -a`, `tar x`). `GDN_VERIFY_EVERY_BUILD=1` makes it run on every
//! build; that is not the default because every run also recompiles this
//! crate and everything that depends on it (the cost is measured in
//! docs/reproducibility.md, "Timestamps"). `gdn-gen check` hashes the
//! sources and the bundle whatever their timestamps; CI runs it.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use gdn_lock::{
    verify_bundle, ArtifactKind, ArtifactTable, HostPolicy, Lock, ToolkitKind, UnitOutput,
    VerifiedBundle, LOCK_FILE, TABLE_FILE,
};

/// Environment variable naming the bundle directory (Nix sets it to the
/// derivation's output path); otherwise the generator's default output.
const BUNDLE_ENV: &str = "GDN_BUNDLE_DIR";
const DEFAULT_BUNDLE: &str = "target/gdn-bundle";
/// The C ABI version this crate's bindings speak (`GDN_ABI_VERSION`).
const ABI_VERSION: u32 = 1;
const HEAD_DIM: u32 = 128;
const FLASHINFER_ARCH: &str = "sm_90a";
/// Units whose cubins are embedded and loaded with cuModuleLoadData.
const EMBEDDED_CUBIN_UNITS: [&str; 4] =
    ["gdn_portable", "model_kernels", "sampling", "skinny_linear"];
const LAUNCHER_LIB: &str = "gdn_flashinfer_sm90";
const CUDART: &str = "lib/libcudart_static.a";
/// The CuTe DSL's static CUDA-dialect runtime the exported objects call
/// (thin cudart wrappers): linked, never a shared library, no Python.
const DSL_RUNTIME: &str = "lib/libcuda_dialect_runtime_static.a";
/// Set to 1 to accept host objects built by another host compiler than the
/// lock's (Nix, other distributions); device code is still the locked cubins.
const FOREIGN_HOST_ENV: &str = "GDN_ALLOW_FOREIGN_HOST_OBJECTS";
/// Set to 1 to run this script on every build (see the module doc).
const EVERY_BUILD_ENV: &str = "GDN_VERIFY_EVERY_BUILD";
/// A file in OUT_DIR that is never created: cargo reruns a build script
/// that names a missing path in `rerun-if-changed` on every build (it cannot
/// tell a deleted file from one that never was), which is how
/// GDN_VERIFY_EVERY_BUILD works.
const NEVER_CREATED: &str = "gdn-kernels-build-rs-runs-on-every-build";
const REMEDY: &str = "build the bundle with `cargo run --release -p gdn-gen -- build` (or point GDN_BUNDLE_DIR at one)";

fn main() {
    if let Err(e) = run() {
        eprintln!("gdn-kernels build: {e}");
        println!("cargo:warning=gdn-kernels: {e}");
        std::process::exit(1);
    }
}

/// The steps, in order; each says what it checks or writes.
fn run() -> Result<(), BuildError> {
    let paths = locate_bundle()?;
    let (table, lock) = check_sources(&paths.repo)?;
    let verified = verify(&paths.bundle, &table, &lock)?;
    check_geometry(&verified)?;
    let written = write_verified_bytes(&paths, &verified)?;
    check_counts(&table, &written)?;
    link(&written)?;
    emit_embedded(&paths.out, &table, &lock, &verified, &written.cubins)
}

/// Why the build stops. Every message names the file, artifact or value.
#[derive(Debug)]
enum BuildError {
    /// An environment variable cargo sets is missing.
    Env(&'static str),
    RepoRoot(std::io::Error),
    NoBundle {
        bundle: PathBuf,
        origin: &'static str,
    },
    /// The table, the lock or our sources failed gdn-lock's checks.
    Lock(gdn_lock::Error),
    /// The bundle failed gdn-lock's checks.
    Bundle {
        bundle: PathBuf,
        source: gdn_lock::Error,
    },
    Expected {
        what: &'static str,
        expected: String,
        actual: String,
    },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    Detach {
        artifact: String,
        problem: ElfProblem,
    },
    NotInBundle(&'static str),
    Archive(cc::Error),
    CubinName(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Env(name) => {
                write!(f, "{name} is not set (build.rs runs under cargo)")
            }
            BuildError::RepoRoot(e) => write!(f, "repository root: {e}"),
            BuildError::NoBundle { bundle, origin } => {
                write!(f, "no bundle at {} ({origin}); {REMEDY}", bundle.display())
            }
            BuildError::Lock(e) => write!(f, "{e}"),
            BuildError::Bundle { bundle, source } => {
                write!(f, "{source} (bundle {})", bundle.display())
            }
            BuildError::Expected {
                what,
                expected,
                actual,
            } => write!(f, "{what}: expected {expected}, found {actual}; {REMEDY}"),
            BuildError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            BuildError::Detach { artifact, problem } => write!(f, "{artifact}: {problem}"),
            BuildError::NotInBundle(rel) => write!(f, "{rel} is not in the bundle; {REMEDY}"),
            BuildError::Archive(e) => write!(f, "archive the launcher: {e}"),
            BuildError::CubinName(rel) => write!(f, "cannot read unit and SM version from {rel}"),
        }
    }
}

impl std::error::Error for BuildError {}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Where things are: the repository, OUT_DIR and the bundle.
struct Paths {
    repo: PathBuf,
    out: PathBuf,
    bundle: PathBuf,
}

/// 1. The bundle: GDN_BUNDLE_DIR (relative to the workspace root, where
///    gdn-gen writes and where people type it) or the generator's default
///    output; says which, and that it exists.
fn locate_bundle() -> Result<Paths, BuildError> {
    let crate_dir = PathBuf::from(env("CARGO_MANIFEST_DIR")?);
    let repo = std::fs::canonicalize(crate_dir.join("../..")).map_err(BuildError::RepoRoot)?;
    let out = PathBuf::from(env("OUT_DIR")?);
    println!("cargo:rerun-if-env-changed={EVERY_BUILD_ENV}");
    if std::env::var(EVERY_BUILD_ENV).is_ok_and(|v| v == "1") {
        println!(
            "cargo:rerun-if-changed={}",
            out.join(NEVER_CREATED).display()
        );
    }
    println!("cargo:rerun-if-env-changed={BUNDLE_ENV}");
    let (bundle, origin) = match std::env::var_os(BUNDLE_ENV) {
        Some(p) => (repo.join(p), BUNDLE_ENV),
        None => (repo.join(DEFAULT_BUNDLE), "the generator's default output"),
    };
    println!(
        "cargo:warning=gdn-kernels: using the GDN bundle at {} ({origin})",
        bundle.display()
    );
    for f in [TABLE_FILE, LOCK_FILE] {
        println!("cargo:rerun-if-changed={}", repo.join(f).display());
    }
    if !bundle.join(gdn_lock::MANIFEST_FILE).exists() {
        return Err(BuildError::NoBundle { bundle, origin });
    }
    Ok(Paths { repo, out, bundle })
}

/// 2. The table and the lock, and our sources checked to be the locked ones
///    (the bundle was built from those).
fn check_sources(repo: &Path) -> Result<(ArtifactTable, Lock), BuildError> {
    let (table, lock) =
        gdn_lock::load_table_and_lock(&repo.join(TABLE_FILE), &repo.join(LOCK_FILE))
            .map_err(BuildError::Lock)?;
    for source in table.sources.iter().chain(&table.patches) {
        println!("cargo:rerun-if-changed={}", repo.join(source).display());
    }
    gdn_lock::check_sources_match_lock(repo, &table, &lock).map_err(BuildError::Lock)?;
    Ok((table, lock))
}

/// 3. Every file of the bundle against the table and the lock, host code
///    as strictly as GDN_ALLOW_FOREIGN_HOST_OBJECTS allows.
fn verify(bundle: &Path, table: &ArtifactTable, lock: &Lock) -> Result<VerifiedBundle, BuildError> {
    println!("cargo:rerun-if-env-changed={FOREIGN_HOST_ENV}");
    let policy = if std::env::var(FOREIGN_HOST_ENV).is_ok_and(|v| v == "1") {
        HostPolicy::AllowForeignHostCompiler
    } else {
        HostPolicy::Locked
    };
    let verified =
        verify_bundle(bundle, table, lock, policy).map_err(|source| BuildError::Bundle {
            bundle: bundle.to_owned(),
            source,
        })?;
    if !verified.host_matches_lock {
        println!(
            "cargo:warning=gdn-kernels: {FOREIGN_HOST_ENV}=1: linking host objects built by {:?}, not the lock's {:?} \
             (device code checked to be the locked cubins)",
            verified.manifest.toolchain.host_compiler, lock.host_artifacts.host_compiler
        );
        if verified.manifest.toolchain.toolkit == ToolkitKind::ExternalRoot {
            println!(
                "cargo:warning=gdn-kernels: {FOREIGN_HOST_ENV}=1: linking {CUDART} of an external toolkit \
                 (--toolkit-root), which the lock does not pin"
            );
        }
    }
    Ok(verified)
}

/// 4. The bundle describes what these bindings were written for.
fn check_geometry(verified: &VerifiedBundle) -> Result<(), BuildError> {
    let g = &verified.manifest.geometry;
    expect(
        "bundle abi_version",
        ABI_VERSION,
        verified.manifest.abi_version,
    )?;
    expect("bundle head_dim", HEAD_DIM, g.head_dim)?;
    expect(
        "bundle target_arch",
        FLASHINFER_ARCH,
        g.target_arch.as_str(),
    )
}

/// What [`write_verified_bytes`] wrote into OUT_DIR.
#[derive(Default)]
struct Written {
    /// Host and DSL objects, to archive into the launcher library.
    objects: Vec<PathBuf>,
    dsl_objects: usize,
    /// (bundle path, file) of the embedded cubins.
    cubins: Vec<(String, PathBuf)>,
    cudart_dir: PathBuf,
    /// The DSL runtime's directory, when the bundle has one.
    dsl_runtime_dir: Option<PathBuf>,
    cudart: bool,
}

/// 5. The verified bytes (read once by the verifier, never re-read from the
///    bundle) of what we link or embed, written into fresh OUT_DIR
///    directories; only those are used. cudart gets a search directory of
///    its own, holding only that file.
fn write_verified_bytes(paths: &Paths, verified: &VerifiedBundle) -> Result<Written, BuildError> {
    let copy = paths.out.join("bundle");
    let dslrt_dir = paths.out.join("dslrt");
    let mut written = Written {
        cudart_dir: paths.out.join("cudart"),
        ..Written::default()
    };
    for dir in [&copy, &written.cudart_dir, &dslrt_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
    for (rel, art) in &verified.manifest.artifacts {
        println!(
            "cargo:rerun-if-changed={}",
            paths.bundle.join(rel).display()
        );
        let to = match art.kind {
            ArtifactKind::HostObject => copy.join(rel),
            ArtifactKind::DeviceCubin
                if EMBEDDED_CUBIN_UNITS
                    .iter()
                    .any(|u| rel.starts_with(&format!("cubin/{u}."))) =>
            {
                copy.join(rel)
            }
            ArtifactKind::HostLibrary if rel == CUDART => {
                written.cudart = true;
                written.cudart_dir.join("libcudart_static.a")
            }
            ArtifactKind::DslObject => {
                written.dsl_objects += 1;
                copy.join(rel)
            }
            ArtifactKind::DslLibrary if rel == DSL_RUNTIME => {
                written.dsl_runtime_dir = Some(dslrt_dir.clone());
                dslrt_dir.join("libcuda_dialect_runtime_static.a")
            }
            _ => continue,
        };
        let parent = to.parent().expect("artifact has a parent");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        let bytes = &verified.files[rel];
        if art.kind == ArtifactKind::DslObject {
            let detached = detach_unwind_table(bytes).map_err(|problem| BuildError::Detach {
                artifact: rel.clone(),
                problem,
            })?;
            std::fs::write(&to, detached).map_err(io(&to))?;
        } else {
            std::fs::write(&to, bytes).map_err(io(&to))?;
        }
        match art.kind {
            ArtifactKind::HostObject | ArtifactKind::DslObject => written.objects.push(to),
            ArtifactKind::DeviceCubin => written.cubins.push((rel.clone(), to)),
            _ => {}
        }
    }
    Ok(written)
}

/// 6. cudart, one object per host-object unit, one per DSL variant, and the
///    DSL runtime when there are DSL objects.
fn check_counts(table: &ArtifactTable, written: &Written) -> Result<(), BuildError> {
    if !written.cudart {
        return Err(BuildError::NotInBundle(CUDART));
    }
    let host_units = table
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
        .count();
    expect(
        "host objects in the bundle",
        host_units,
        written.objects.len() - written.dsl_objects,
    )?;
    let dsl_variants: usize = table.units.iter().map(|u| u.dsl_variants().len()).sum();
    expect(
        "CuTe DSL objects in the bundle",
        dsl_variants,
        written.dsl_objects,
    )?;
    if dsl_variants > 0 && written.dsl_runtime_dir.is_none() {
        return Err(BuildError::NotInBundle(DSL_RUNTIME));
    }
    Ok(())
}

/// 7. Link: the launcher and DSL objects as one static library, then the
///    DSL's dialect runtime, then the bundle's cudart (each needs the next).
fn link(written: &Written) -> Result<(), BuildError> {
    let mut build = cc::Build::new();
    for o in &written.objects {
        build.object(o);
    }
    build
        .cargo_metadata(true)
        .try_compile(LAUNCHER_LIB)
        .map_err(BuildError::Archive)?;
    if let Some(dir) = &written.dsl_runtime_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=cuda_dialect_runtime_static");
    }
    println!(
        "cargo:rustc-link-search=native={}",
        written.cudart_dir.display()
    );
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["stdc++", "dl", "pthread", "rt"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    Ok(())
}

/// 8. `bundle_embed.rs`: our cubins by unit and SM version, the locked
///    FlashInfer cubins' identity, and the DSL kernel families.
fn emit_embedded(
    out: &Path,
    table: &ArtifactTable,
    lock: &Lock,
    verified: &VerifiedBundle,
    cubins: &[(String, PathBuf)],
) -> Result<(), BuildError> {
    let mut src =
        String::from("/// Our cubins from the verified bundle: (unit, SM version, bytes).\n");
    src.push_str("pub(crate) static CUBINS: &[(&str, u32, &[u8])] = &[\n");
    for (rel, path) in cubins {
        let (unit, sm) = unit_and_sm(rel).ok_or_else(|| BuildError::CubinName(rel.clone()))?;
        writeln!(
            src,
            "    ({unit:?}, {sm}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .expect("write to String");
    }
    src.push_str("];\n");
    let fi: Vec<String> = lock
        .device_artifacts
        .iter()
        .filter(|(p, _)| p.starts_with("cubin/flashinfer_"))
        .map(|(p, d)| format!("{p}={}", d.sha256))
        .collect();
    writeln!(src, "/// The locked FlashInfer cubins linked into this build.\npub(crate) const FLASHINFER_CUBINS: &str = {:?};", fi.join(" ")).expect("write to String");
    let ratios: Vec<String> = verified
        .manifest
        .geometry
        .gva_ratios
        .iter()
        .map(u32::to_string)
        .collect();
    writeln!(src, "/// Hv/Hqk ratios the FlashInfer instantiations were built and validated for.\npub(crate) const FLASHINFER_GVA_RATIOS: &[u32] = &[{}];", ratios.join(", ")).expect("write to String");
    src.push_str("/// The CuTe DSL kernel families the bundle links (from the artifact table).\n");
    src.push_str("pub(crate) static DSL_FAMILIES: &[crate::dsl::DslFamilyInfo] = &[\n");
    for unit in &table.units {
        let Some(d) = &unit.dsl else { continue };
        writeln!(
            src,
            "    crate::dsl::DslFamilyInfo {{ kernel: {:?}, target: {:?}, sm_count: {:?}, baked_heads: &{:?} }},",
            d.kernel, unit.targets[0], d.sm_count, d.baked_heads
        )
        .expect("write to String");
    }
    src.push_str("];\n");
    let embed = out.join("bundle_embed.rs");
    std::fs::write(&embed, src).map_err(io(&embed))
}

/// `cubin/<unit>.sm_<N>.cubin` -> (unit, N).
fn unit_and_sm(rel: &str) -> Option<(&str, u32)> {
    let (unit, sm) = rel
        .strip_prefix("cubin/")?
        .strip_suffix(".cubin")?
        .rsplit_once(".sm_")?;
    Some((unit, sm.parse().ok()?))
}

/// Why a DSL object's unwind table could not be detached.
#[derive(Debug)]
enum ElfProblem {
    NotElf64,
    Truncated,
    NoEhFrame,
}

impl fmt::Display for ElfProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElfProblem::NotElf64 => "not a little-endian ELF64 object",
            ElfProblem::Truncated => "truncated ELF section headers",
            ElfProblem::NoEhFrame => "no .eh_frame section (the DSL's object format changed?)",
        })
    }
}

/// The DSL's objects carry `.eh_frame` FDEs with 64-bit pc-relative
/// pointers (large code model, encoding 0x1c). Linked as they are, every Rust
/// panic in the binary aborts ("failed to initiate panic, error 5": the
/// unwinder finds no FDE for Rust frames; seen with GNU ld 2.40 + libgcc on
/// Debian 12). No exception or panic ever unwinds through the DSL's host
/// launch code (it is called from our C wrapper and returns a status), so
/// its unwind table is detached: the section is renamed `.dslframe` (same
/// length, so only the name bytes change), made non-allocated and typed
/// PROGBITS, and the linker no longer merges it into `.eh_frame`. The
/// verified object is otherwise the locked bytes.
fn detach_unwind_table(obj: &[u8]) -> Result<Vec<u8>, ElfProblem> {
    let rd16 = |o: usize| obj.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let rd32 = |o: usize| {
        obj.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let rd64 = |o: usize| {
        obj.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if obj.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err(ElfProblem::NotElf64);
    }
    let bad = || ElfProblem::Truncated;
    let shoff = rd64(0x28).ok_or_else(bad)? as usize;
    let shentsize = rd16(0x3a).ok_or_else(bad)? as usize;
    let shnum = rd16(0x3c).ok_or_else(bad)? as usize;
    let shstrndx = rd16(0x3e).ok_or_else(bad)? as usize;
    let strtab = rd64(shoff + shstrndx * shentsize + 0x18).ok_or_else(bad)? as usize;
    let mut out = obj.to_vec();
    let mut found = false;
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        let name = strtab + rd32(sh).ok_or_else(bad)? as usize;
        if obj.get(name..name + 10) == Some(b".eh_frame\0".as_slice()) {
            out[name..name + 9].copy_from_slice(b".dslframe");
            out[sh + 4..sh + 8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
            let flags = rd64(sh + 8).ok_or_else(bad)? & !0x2; // clear SHF_ALLOC
            out[sh + 8..sh + 16].copy_from_slice(&flags.to_le_bytes());
            found = true;
        }
    }
    if !found {
        return Err(ElfProblem::NoEhFrame);
    }
    Ok(out)
}

fn env(name: &'static str) -> Result<String, BuildError> {
    std::env::var(name).map_err(|_| BuildError::Env(name))
}

fn expect<T: PartialEq + fmt::Display>(
    what: &'static str,
    expected: T,
    actual: T,
) -> Result<(), BuildError> {
    if expected == actual {
        Ok(())
    } else {
        Err(BuildError::Expected {
            what,
            expected: expected.to_string(),
            actual: actual.to_string(),
        })
    }
}
