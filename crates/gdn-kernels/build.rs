//! Verifies the GDN bundle against the lock and links it. Fails closed: a
//! missing, stale or tampered bundle stops the build with the artifact, the
//! expected and the actual value. Needs no nvcc and no Python.

use std::fmt::Write as _;
use std::path::PathBuf;

use gdn_lock::{verify_bundle, ArtifactKind, HostPolicy, UnitOutput, LOCK_FILE, TABLE_FILE};

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
const REMEDY: &str = "build the bundle with `cargo run --release -p gdn-gen -- build` (or point GDN_BUNDLE_DIR at one)";

fn main() {
    if let Err(e) = run() {
        eprintln!("gdn-kernels build: {e}");
        println!("cargo:warning=gdn-kernels: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let crate_dir = PathBuf::from(env("CARGO_MANIFEST_DIR")?);
    let repo = std::fs::canonicalize(crate_dir.join("../.."))
        .map_err(|e| format!("repository root: {e}"))?;
    let out = PathBuf::from(env("OUT_DIR")?);
    println!("cargo:rerun-if-env-changed={BUNDLE_ENV}");
    // build.rs runs in the crate's directory; a relative GDN_BUNDLE_DIR means
    // the workspace root's (where gdn-gen writes and where people type it).
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
        return Err(format!(
            "no bundle at {} ({origin}); {REMEDY}",
            bundle.display()
        ));
    }

    // 1. Our sources must be the locked ones (the bundle was built from
    //    those), and every file of the bundle must match the table and the lock.
    let (table, lock) =
        gdn_lock::load_table_and_lock(&repo.join(TABLE_FILE), &repo.join(LOCK_FILE))
            .map_err(|e| e.to_string())?;
    for source in table.sources.iter().chain(&table.patches) {
        println!("cargo:rerun-if-changed={}", repo.join(source).display());
    }
    gdn_lock::check_sources_match_lock(&repo, &table, &lock).map_err(|e| e.to_string())?;
    println!("cargo:rerun-if-env-changed={FOREIGN_HOST_ENV}");
    let policy = if std::env::var(FOREIGN_HOST_ENV).is_ok_and(|v| v == "1") {
        HostPolicy::AllowForeignHostCompiler
    } else {
        HostPolicy::Locked
    };
    let verified = verify_bundle(&bundle, &table, &lock, policy)
        .map_err(|e| format!("{e} (bundle {})", bundle.display()))?;
    if !verified.host_matches_lock {
        println!(
            "cargo:warning=gdn-kernels: {FOREIGN_HOST_ENV}=1: linking host objects built by {:?}, not the lock's {:?} \
             (device code checked to be the locked cubins)",
            verified.manifest.toolchain.host_compiler, lock.host_artifacts.host_compiler
        );
    }

    // 2. The bundle must describe what these bindings were written for.
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
    )?;

    // 3. Write the verified bytes (read once by the verifier, never re-read
    //    from the bundle) of what we link or embed into fresh OUT_DIR
    //    directories, and use only those. cudart gets a search directory of
    //    its own, holding only that file.
    let copy = out.join("bundle");
    let cudart_dir = out.join("cudart");
    let dslrt_dir = out.join("dslrt");
    for dir in [&copy, &cudart_dir, &dslrt_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let mut objects = vec![];
    let mut dsl_objects = 0;
    let mut cubins = vec![];
    let mut cudart = false;
    let mut dsl_runtime = false;
    for (rel, art) in &verified.manifest.artifacts {
        println!("cargo:rerun-if-changed={}", bundle.join(rel).display());
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
                cudart = true;
                cudart_dir.join("libcudart_static.a")
            }
            ArtifactKind::DslObject => {
                dsl_objects += 1;
                copy.join(rel)
            }
            ArtifactKind::DslLibrary if rel == DSL_RUNTIME => {
                dsl_runtime = true;
                dslrt_dir.join("libcuda_dialect_runtime_static.a")
            }
            _ => continue,
        };
        std::fs::create_dir_all(to.parent().expect("artifact has a parent"))
            .map_err(|e| e.to_string())?;
        let bytes = &verified.files[rel];
        if art.kind == ArtifactKind::DslObject {
            let detached = detach_unwind_table(bytes).map_err(|e| format!("{rel}: {e}"))?;
            std::fs::write(&to, detached).map_err(|e| e.to_string())?;
        } else {
            std::fs::write(&to, bytes).map_err(|e| e.to_string())?;
        }
        match art.kind {
            ArtifactKind::HostObject | ArtifactKind::DslObject => objects.push(to),
            ArtifactKind::DeviceCubin => cubins.push((rel.clone(), to)),
            _ => {}
        }
    }
    if !cudart {
        return Err(format!("{CUDART} is not in the bundle; {REMEDY}"));
    }
    let host_units = table
        .units
        .iter()
        .filter(|u| u.output == UnitOutput::HostObject)
        .count();
    expect(
        "host objects in the bundle",
        host_units,
        objects.len() - dsl_objects,
    )?;
    let dsl_variants: usize = table.units.iter().map(|u| u.dsl_variants().len()).sum();
    expect("CuTe DSL objects in the bundle", dsl_variants, dsl_objects)?;
    if dsl_variants > 0 && !dsl_runtime {
        return Err(format!("{DSL_RUNTIME} is not in the bundle; {REMEDY}"));
    }

    // 4. Link: the launcher and DSL objects as one static library, then the
    //    DSL's dialect runtime, then the bundle's cudart (each needs the next).
    let mut build = cc::Build::new();
    for o in &objects {
        build.object(o);
    }
    build
        .cargo_metadata(true)
        .try_compile(LAUNCHER_LIB)
        .map_err(|e| format!("archive the launcher: {e}"))?;
    if dsl_runtime {
        println!("cargo:rustc-link-search=native={}", dslrt_dir.display());
        println!("cargo:rustc-link-lib=static=cuda_dialect_runtime_static");
    }
    println!("cargo:rustc-link-search=native={}", cudart_dir.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["stdc++", "dl", "pthread", "rt"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }

    // 5. Embed our cubins, by unit and SM version, and the bundle identity.
    let mut src =
        String::from("/// Our cubins from the verified bundle: (unit, SM version, bytes).\n");
    src.push_str("pub(crate) static CUBINS: &[(&str, u32, &[u8])] = &[\n");
    for (rel, path) in &cubins {
        let (unit, sm) = rel
            .strip_prefix("cubin/")
            .and_then(|r| r.strip_suffix(".cubin"))
            .and_then(|r| r.rsplit_once(".sm_"))
            .and_then(|(unit, sm)| Some((unit, sm.parse::<u32>().ok()?)))
            .ok_or_else(|| format!("cannot read unit and SM version from {rel}"))?;
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
    let ratios: Vec<String> = g.gva_ratios.iter().map(u32::to_string).collect();
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
    std::fs::write(out.join("bundle_embed.rs"), src).map_err(|e| e.to_string())?;
    Ok(())
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
fn detach_unwind_table(obj: &[u8]) -> Result<Vec<u8>, String> {
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
        return Err("not a little-endian ELF64 object".into());
    }
    let bad = || "truncated ELF section headers".to_string();
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
        return Err("no .eh_frame section (the DSL's object format changed?)".into());
    }
    Ok(out)
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set (build.rs runs under cargo)"))
}

fn expect<T: PartialEq + std::fmt::Display>(
    what: &str,
    expected: T,
    actual: T,
) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!(
            "{what}: expected {expected}, found {actual}; {REMEDY}"
        ))
    }
}
