//! The artifact table: the one declarative description of what the bundle holds
//! and how each piece is compiled. The generator executes it; build.rs and
//! `gdn-gen check` read it to know which artifacts must exist.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::Sha256Hex;
pub use crate::error::TableRule;
use crate::error::{Error, Result};
use crate::{parse_versioned, read_capped};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactTable {
    pub schema_version: u32,
    /// Version of the C ABI in `gdn_abi.h`; the kernels crate refuses any other.
    pub abi_version: u32,
    /// The exact nvcc release the lock pins, as `nvcc --version` prints it (`V13.0.88`).
    pub nvcc_version: String,
    /// Downloaded inputs (PyPI wheels), resolved to hashes by `gdn-gen lock`.
    pub inputs: Vec<InputSpec>,
    /// Members of the kernel-source wheel that are staged for compilation.
    pub kernel_source_members: Vec<String>,
    /// Patches applied in order to the staged kernel sources (`patch -p1` semantics).
    pub patches: Vec<String>,
    /// Files of ours that are compiled or shipped (hashed into the lock).
    pub sources: Vec<String>,
    /// Header shipped in the bundle as the C ABI of the host launcher.
    pub abi_header: String,
    /// Static libraries copied from the toolkit into the bundle's `lib/` (the
    /// launcher needs cudart; linking the bundle's copy keeps build.rs free of
    /// any toolkit).
    pub toolkit_libraries: Vec<String>,
    /// Geometry and specializations the FlashInfer path supports.
    pub geometry: Geometry,
    pub units: Vec<Unit>,
    /// The CuTe DSL compiler (FlashInfer's Python kernels exported with
    /// `export_to_c`); required when a unit has `"compiler": "cute-dsl"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsl: Option<DslConfig>,
}

/// How the CuTe DSL units are built: which Python interpreters have a pinned
/// wheel set, what of the kernel-source wheel is put on the path, and the
/// static runtime the exported objects link against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DslConfig {
    /// Python `major.minor` versions with a complete wheel set among the
    /// inputs (inputs with `python` set are for that version only).
    pub pythons: Vec<String>,
    /// Members of the `dsl-kernel-source` wheels extracted for the export
    /// (FlashInfer's `flashinfer/gdn_kernels/`, quack-kernels' `quack/`);
    /// every such wheel is filtered by the whole list.
    pub kernel_source_members: Vec<String>,
    /// Path of the static CUDA-dialect runtime inside the extracted DSL
    /// wheels; shipped as `lib/<file name>` and linked by the kernels crate.
    pub runtime_library: String,
    /// Directory of the staging tree the exported headers are copied to, for
    /// the nvcc units that include them (our C ABI wrapper).
    pub header_dir: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    pub name: String,
    pub version: String,
    pub role: InputRole,
    pub filename: String,
    pub url: String,
    /// Upstream git revision the artifact was built from, where it records one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_revision: Option<String>,
    /// For CPython-ABI-specific wheels: the `major.minor` version they are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputRole {
    /// Part of the CUDA toolchain; unused when an existing toolkit root is given.
    Toolchain,
    /// Kernel sources (FlashInfer); always needed.
    KernelSource,
    /// Kernel sources of the CuTe DSL units (FlashInfer's and quack-kernels'
    /// Python kernels); one or more.
    DslKernelSource,
    /// The CuTe DSL compiler and the Python packages it imports.
    DslRuntime,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Geometry {
    pub target_arch: String,
    pub head_dim: u32,
    pub qkv_dtype: String,
    pub state_dtype: String,
    /// Supported Hv / Hqk ratios; 1 means Hv == Hqk.
    pub gva_ratios: Vec<u32>,
    pub specializations: Vec<Specialization>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Specialization {
    pub is_gva: bool,
    pub initial_state: bool,
    pub alpha: bool,
    pub beta: bool,
    pub checkpointing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compiler {
    Nvcc,
    /// NVIDIA's CuTe DSL (nvidia-cutlass-dsl) run by `generator/cute_dsl/export_gdn.py`.
    CuteDsl,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitOutput {
    /// `nvcc -c`: a host object with an uncompressed fatbin, plus the raw cubin
    /// of every target (kept from nvcc's intermediate files).
    HostObject,
    /// `nvcc -cubin` once per target: device code loaded at run time.
    Cubin,
    /// CuTe DSL `export_to_c`: per variant a header, an object (host launch
    /// code with the fatbin embedded) and the cubin cut out of it.
    DslObjects,
}

/// What a CuTe DSL unit exports: one FlashInfer kernel family, its variants,
/// and what the kernel bakes in at compile time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DslUnit {
    /// The driver's `--kernel`: `sm90`, `sm90_cp`, `sm100`, `sm120` or
    /// `quack_swiglu_sm90`.
    pub kernel: String,
    /// Every variant the driver exports for this family (checked after the export).
    pub variants: Vec<String>,
    /// SM count baked into the kernel (SM100's persistent scheduler); `None`
    /// when the kernel takes it at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u32>,
    /// Head counts baked in (SM100: static tensor extents), as `[Hqk, Hv]`
    /// per variant pair; empty when the kernel takes them at run time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baked_heads: Vec<[u32; 2]>,
}

/// One compilation unit: one source, one compiler invocation per unit
/// (`HostObject`) or per target (`Cubin`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unit {
    pub name: String,
    pub compiler: Compiler,
    pub output: UnitOutput,
    pub source: String,
    /// `sm_90a`, `sm_80`, ...
    pub targets: Vec<String>,
    /// Include directories, relative to the staged kernel-source root (`-I`, before the toolkit).
    #[serde(default)]
    pub includes: Vec<String>,
    /// Include directories relative to the staged kernel-source root (`-isystem`).
    #[serde(default)]
    pub system_includes: Vec<String>,
    pub flags: Vec<String>,
    /// Rough peak memory of one compile, used to decide how many run at once.
    pub peak_memory_mib: u64,
    /// Why this unit exists (free text for reviewers).
    pub why: String,
    /// Only for `"compiler": "cute-dsl"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsl: Option<DslUnit>,
}

impl Unit {
    /// Bundle-relative path of the raw cubin for `target`.
    pub fn cubin_path(&self, target: &str) -> String {
        format!("cubin/{}.{target}.cubin", self.name)
    }
    /// Bundle-relative path of the host object (only for `HostObject` units).
    pub fn object_path(&self) -> String {
        format!("obj/{}.o", self.name)
    }
    /// The DSL variants of this unit (empty for nvcc units).
    pub fn dsl_variants(&self) -> &[String] {
        self.dsl
            .as_ref()
            .map(|d| d.variants.as_slice())
            .unwrap_or(&[])
    }
    /// Bundle-relative path of a DSL variant's object.
    pub fn dsl_object_path(variant: &str) -> String {
        format!("obj/dsl/{variant}.o")
    }
    /// Bundle-relative path of a DSL variant's generated header.
    pub fn dsl_header_path(variant: &str) -> String {
        format!("include/dsl/{variant}.h")
    }
    /// Bundle-relative path of the cubin cut out of a DSL variant's object.
    pub fn dsl_cubin_path(&self, variant: &str, target: &str) -> String {
        format!("cubin/{}.{variant}.{target}.cubin", self.name)
    }
    /// (bundle path, cubin path) of every DSL variant's object.
    pub fn dsl_objects(&self) -> Vec<(String, String)> {
        let target = self.targets.first().map(String::as_str).unwrap_or("");
        self.dsl_variants()
            .iter()
            .map(|v| (Self::dsl_object_path(v), self.dsl_cubin_path(v, target)))
            .collect()
    }
}

impl ArtifactTable {
    pub fn load(path: &Path) -> Result<Self> {
        Ok(Self::load_with_sha256(path)?.0)
    }

    /// The table and the sha256 of the very bytes it was parsed from (the lock
    /// records that hash to detect a table edited since locking).
    pub fn load_with_sha256(path: &Path) -> Result<(Self, Sha256Hex)> {
        let bytes = read_capped(path)?;
        let table: ArtifactTable = parse_versioned(path, &bytes)?;
        table.validate().map_err(|rule| Error::InvalidTable {
            path: path.to_owned(),
            rule,
        })?;
        Ok((table, Sha256Hex::of_bytes(&bytes)))
    }

    /// Structural rules that serde cannot express.
    pub fn validate(&self) -> std::result::Result<(), TableRule> {
        let mut names = BTreeMap::new();
        let mut dsl_variants = BTreeMap::new();
        for unit in &self.units {
            if names.insert(unit.name.as_str(), ()).is_some() {
                return Err(TableRule::DuplicateUnit(unit.name.clone()));
            }
            if unit.targets.is_empty() && unit.output == UnitOutput::Cubin {
                return Err(TableRule::NoTargets(unit.name.clone()));
            }
            if !unit
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(TableRule::UnitName(unit.name.clone()));
            }
            if unit.output == UnitOutput::HostObject && unit.targets.len() > 1 {
                return Err(TableRule::HostObjectTargets(unit.name.clone()));
            }
            let is_dsl = unit.compiler == Compiler::CuteDsl;
            if is_dsl != (unit.output == UnitOutput::DslObjects) || is_dsl != unit.dsl.is_some() {
                return Err(TableRule::DslTogether(unit.name.clone()));
            }
            if let Some(d) = &unit.dsl {
                if unit.targets.len() != 1 {
                    return Err(TableRule::DslTargets(unit.name.clone()));
                }
                if self.dsl.is_none() {
                    return Err(TableRule::DslSection(unit.name.clone()));
                }
                if d.variants.is_empty() {
                    return Err(TableRule::DslNoVariants(unit.name.clone()));
                }
                for v in &d.variants {
                    let ok = !v.is_empty()
                        && v.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                    if !ok || dsl_variants.insert(v.as_str(), ()).is_some() {
                        return Err(TableRule::DslVariant {
                            unit: unit.name.clone(),
                            variant: v.clone(),
                        });
                    }
                }
            }
            for t in &unit.targets {
                let digits = t
                    .strip_prefix("sm_")
                    .map(|r| r.strip_suffix('a').unwrap_or(r))
                    .unwrap_or("");
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(TableRule::Target {
                        unit: unit.name.clone(),
                        target: t.clone(),
                    });
                }
            }
        }
        if self
            .inputs
            .iter()
            .filter(|i| i.role == InputRole::KernelSource)
            .count()
            != 1
        {
            return Err(TableRule::KernelSourceCount);
        }
        if let Some(dsl) = &self.dsl {
            let sources = self
                .inputs
                .iter()
                .filter(|i| i.role == InputRole::DslKernelSource)
                .count();
            if sources == 0 {
                return Err(TableRule::NoDslKernelSource);
            }
            for i in &self.inputs {
                if let Some(p) = &i.python {
                    if !dsl.pythons.contains(p) {
                        return Err(TableRule::InputPython {
                            input: i.filename.clone(),
                            python: p.clone(),
                            pythons: dsl.pythons.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Every bundle-relative path of device code the table produces.
    pub fn device_artifact_paths(&self) -> Vec<String> {
        self.units
            .iter()
            .flat_map(|u| -> Vec<String> {
                if u.dsl.is_some() {
                    u.dsl_objects().into_iter().map(|(_, c)| c).collect()
                } else {
                    u.targets.iter().map(|t| u.cubin_path(t)).collect()
                }
            })
            .collect()
    }

    /// Every bundle-relative object and header the CuTe DSL units produce:
    /// pinned byte for byte by the lock's `dsl_artifacts`, whatever the host
    /// compiler or interpreter.
    pub fn dsl_artifact_paths(&self) -> Vec<String> {
        let mut out = vec![];
        for u in &self.units {
            for v in u.dsl_variants() {
                out.push(Unit::dsl_object_path(v));
                out.push(Unit::dsl_header_path(v));
            }
        }
        out
    }

    /// The bundle path of the DSL's static runtime when the table has DSL
    /// units: pinned per wheel set by the lock's `dsl_runtime`.
    pub fn dsl_runtime_path(&self) -> Option<String> {
        self.dsl
            .as_ref()
            .filter(|_| self.has_dsl_units())
            .map(|dsl| format!("lib/{}", file_name(&dsl.runtime_library)))
    }

    pub fn has_dsl_units(&self) -> bool {
        self.units.iter().any(|u| u.dsl.is_some())
    }
}

/// The last `/`-separated component of a path.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ArtifactTable {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(crate::TABLE_FILE);
        ArtifactTable::load(&p).unwrap()
    }

    #[test]
    fn the_repository_table_is_valid() {
        assert!(table().validate().is_ok());
    }

    #[test]
    fn target_names_cannot_smuggle_paths_or_junk() {
        // A cubin unit (several targets allowed), found by kind, not index.
        let cubin_unit = |t: &ArtifactTable| {
            t.units
                .iter()
                .position(|u| u.output == UnitOutput::Cubin)
                .unwrap()
        };
        for bad in ["sm_90/../x", "sm_", "sm_a", "compute_90", "sm_9x0"] {
            let mut t = table();
            let i = cubin_unit(&t);
            t.units[i].targets = vec![bad.to_string()];
            let err = t.validate().unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        let mut t = table();
        let i = cubin_unit(&t);
        t.units[i].targets = vec!["sm_90a".into(), "sm_100".into()];
        assert!(t.validate().is_ok());
    }

    #[test]
    fn a_dsl_section_needs_at_least_one_dsl_kernel_source() {
        let t = table();
        let sources = |t: &ArtifactTable| {
            t.inputs
                .iter()
                .filter(|i| i.role == InputRole::DslKernelSource)
                .count()
        };
        assert!(sources(&t) >= 2, "FlashInfer's and quack's wheels");
        // Keep only the first one: still valid.
        let mut one = t.clone();
        let mut kept = false;
        one.inputs.retain(|i| {
            i.role != InputRole::DslKernelSource || !std::mem::replace(&mut kept, true)
        });
        assert_eq!(sources(&one), 1);
        assert!(one.validate().is_ok());
        let mut none = one;
        none.inputs.retain(|i| i.role != InputRole::DslKernelSource);
        assert!(none
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at least one input must have role dsl-kernel-source"));
    }

    #[test]
    fn host_object_units_have_at_most_one_target() {
        let mut t = table();
        let i = t
            .units
            .iter()
            .position(|u| u.output == UnitOutput::HostObject)
            .unwrap();
        t.units[i].targets = vec!["sm_90a".into(), "sm_100a".into()];
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at most one target"));
    }
}
