//! The manifest a bundle carries about itself.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::{Digests, Sha256Hex};
use crate::error::Result;
use crate::read_versioned;
use crate::table::Geometry;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema_version: u32,
    pub abi_version: u32,
    pub geometry: Geometry,
    pub toolchain: ToolchainIdentity,
    /// Every input by filename (wheels) or repository path (our sources), with its sha256.
    pub inputs: BTreeMap<String, Sha256Hex>,
    pub artifacts: BTreeMap<String, ManifestArtifact>,
    /// The interpreter that ran the CuTe DSL export (absent without DSL units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsl: Option<DslIdentity>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DslIdentity {
    /// `3.11.2`: the full interpreter version.
    pub python: String,
    /// `3.11`: which pinned wheel set was used.
    pub python_abi: String,
    /// File name of the wheel of that set the bundle's DSL runtime library
    /// (`lib/libcuda_dialect_runtime_static.a`) was copied from: unlike the
    /// DSL objects, its bytes differ between the wheel sets.
    pub runtime_wheel: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolchainIdentity {
    /// `V13.0.88`
    pub nvcc_version: String,
    /// The `Build ...` line of `nvcc --version`.
    pub nvcc_build: String,
    /// Where the toolkit came from (its path is not recorded: it would make
    /// the manifest depend on where the toolkit lives).
    pub toolkit: ToolkitKind,
    /// First line of `c++ --version` (the host compiler nvcc used).
    pub host_compiler: String,
}

/// Where a bundle's toolkit came from. A closed set: a manifest naming any
/// other kind was not written by gdn-gen and is refused when it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolkitKind {
    /// The pinned PyPI wheels: its libraries are the lock's bytes.
    PypiWheels,
    /// `gdn-gen --toolkit-root` (Nix, NVIDIA's installer) of the pinned nvcc
    /// version: nothing pins its libraries' bytes.
    ExternalRoot,
}

impl std::fmt::Display for ToolkitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolkitKind::PypiWheels => "pypi-wheels",
            ToolkitKind::ExternalRoot => "external-root",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactKind {
    DeviceCubin,
    HostObject,
    HostLibrary,
    Header,
    /// CuTe DSL export: host launch code with the fatbin embedded.
    DslObject,
    /// CuTe DSL export: the generated C header of one variant.
    DslHeader,
    /// The DSL's static CUDA-dialect runtime (`libcuda_dialect_runtime_static.a`).
    DslLibrary,
}

// No deny_unknown_fields here: serde does not support it together with flatten.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestArtifact {
    pub kind: ArtifactKind,
    #[serde(flatten)]
    pub digests: Digests,
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Self> {
        let m: Manifest = read_versioned(path)?;
        Ok(m)
    }
}
