//! The lock: pinned inputs and the device code they must produce.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::{Digests, Sha256Hex};
use crate::error::{Error, Result, REMEDY_RELOCK};
use crate::read_versioned;
use crate::table::InputRole;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub schema_version: u32,
    /// sha256 of `generator/artifacts.json` when the lock was written: a table
    /// edited since then makes the lock stale.
    pub table_sha256: Sha256Hex,
    pub abi_version: u32,
    pub nvcc_version: String,
    pub inputs: Vec<LockedInput>,
    /// Our own sources and patches, by repository-relative path.
    pub sources: BTreeMap<String, Sha256Hex>,
    /// The cross-machine identity: raw cubins, by bundle-relative path.
    pub device_artifacts: BTreeMap<String, Digests>,
    /// Host code as built by the recording machine. Host objects are only
    /// reproducible for the same host compiler and toolkit, so a bundle built
    /// with another is checked against these only when its identity matches.
    pub host_artifacts: HostArtifacts,
    /// Toolchain variants and whether their outputs are recorded here.
    pub variants: BTreeMap<String, VariantStatus>,
    /// CuTe DSL objects and headers, by bundle path. Produced by the pinned
    /// DSL (its own LLVM, for a pinned host CPU), not the host compiler, and
    /// the same for every supported interpreter, so always compared byte for
    /// byte. Their cubins are in `device_artifacts`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dsl_artifacts: BTreeMap<String, Digests>,
    /// The Python interpreter (`sys.version`, first word) that recorded `dsl_artifacts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsl_recorded_with_python: Option<String>,
    /// The static CUDA-dialect runtime (`lib/<file name of dsl.runtime_library>`),
    /// one pin per wheel set, by Python `major.minor`: it is copied out of a
    /// CPython-ABI-specific wheel, and the cp311 and cp312 wheels carry
    /// different bytes of it. Hashed from the wheels themselves by `gdn-gen lock`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dsl_runtime: BTreeMap<String, DslRuntimePin>,
}

/// Where one wheel set's DSL runtime library comes from, and its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DslRuntimePin {
    /// File name of the input wheel the library is copied from.
    pub wheel: String,
    pub digests: Digests,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedInput {
    pub name: String,
    pub version: String,
    pub role: InputRole,
    pub filename: String,
    pub url: String,
    pub sha256: Sha256Hex,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_revision: Option<String>,
    /// For CPython-ABI-specific wheels: the `major.minor` version they are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

impl LockedInput {
    /// Whether a build with Python `python` (`major.minor`) uses this input.
    pub fn used_with_python(&self, python: &str) -> bool {
        self.python.as_deref().is_none_or(|p| p == python)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostArtifacts {
    pub host_compiler: String,
    pub toolkit: String,
    pub artifacts: BTreeMap<String, Digests>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantStatus {
    /// `recorded`: the lock's device artifacts are this variant's bytes.
    /// `unrecorded`: nobody has built it on a machine with that toolkit yet.
    pub status: String,
    pub nvcc_version: String,
    pub note: String,
}

impl Lock {
    pub fn load(path: &Path) -> Result<Self> {
        let lock: Lock = read_versioned(path)?;
        Ok(lock)
    }

    pub fn input(&self, filename: &str) -> Option<&LockedInput> {
        self.inputs.iter().find(|i| i.filename == filename)
    }

    /// The DSL runtime pin of the wheel set for Python `python_abi`, or an
    /// error naming the wheel sets the lock does pin.
    pub fn dsl_runtime_for(&self, python_abi: &str) -> Result<&DslRuntimePin> {
        self.dsl_runtime.get(python_abi).ok_or_else(|| Error::Missing {
            what: format!(
                "a DSL runtime pin for the Python {python_abi} wheel set in the lock (it pins {:?})",
                self.dsl_runtime.keys().collect::<Vec<_>>()
            ),
            remedy: REMEDY_RELOCK,
        })
    }
}
