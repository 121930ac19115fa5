//! The lock: pinned inputs and the device code they must produce.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::{Digests, Sha256Hex};
use crate::error::{Error, Result, REMEDY_LOCK_EDITED};
use crate::manifest::ToolkitKind;
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
    pub toolkit: ToolkitKind,
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

    /// The inputs one build uses, in lock order: the kernel source always;
    /// the toolchain wheels when the pinned toolkit is used (not an existing
    /// toolkit root); the DSL kernel source and the runtime wheels for
    /// `dsl_python` (`major.minor` of the interpreter that ran the export)
    /// when there is one. The one place this is decided: gdn-gen's plan and
    /// manifest and every bundle check ask here.
    pub fn used_inputs(&self, toolkit: ToolkitKind, dsl_python: Option<&str>) -> Vec<&LockedInput> {
        self.inputs
            .iter()
            .filter(|i| match i.role {
                InputRole::KernelSource => true,
                InputRole::Toolchain => toolkit == ToolkitKind::PypiWheels,
                InputRole::DslKernelSource | InputRole::DslRuntime => {
                    dsl_python.is_some_and(|p| i.used_with_python(p))
                }
            })
            .collect()
    }

    /// The DSL runtime pin of the wheel set for Python `python_abi`, or an
    /// error naming the wheel sets the lock does pin.
    pub fn dsl_runtime_for(&self, python_abi: &str) -> Result<&DslRuntimePin> {
        self.dsl_runtime.get(python_abi).ok_or_else(|| Error::Missing {
            what: format!(
                "a DSL runtime pin for the Python {python_abi} wheel set in the lock (it pins {:?})",
                self.dsl_runtime.keys().collect::<Vec<_>>()
            ),
            remedy: REMEDY_LOCK_EDITED,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> Lock {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(crate::LOCK_FILE);
        Lock::load(&p).unwrap()
    }

    fn names(inputs: Vec<&LockedInput>) -> Vec<String> {
        inputs.iter().map(|i| i.filename.clone()).collect()
    }

    #[test]
    fn used_inputs_follow_the_toolkit_and_the_interpreter() {
        let lock = lock();
        let all = names(lock.used_inputs(ToolkitKind::PypiWheels, Some("3.11")));
        // The pinned toolkit: every toolchain wheel; Python 3.11: the cp311
        // wheels and no cp312 one; the kernel sources always.
        for i in &lock.inputs {
            let expected = match (i.role, i.python.as_deref()) {
                (InputRole::DslRuntime, Some(p)) => p == "3.11",
                _ => true,
            };
            assert_eq!(all.contains(&i.filename), expected, "{}", i.filename);
        }
        assert!(all.iter().any(|f| f.contains("cp311")));
        assert!(!all.iter().any(|f| f.contains("cp312")));
        let py312 = names(lock.used_inputs(ToolkitKind::PypiWheels, Some("3.12")));
        assert!(
            py312.iter().any(|f| f.contains("cp312")) && !py312.iter().any(|f| f.contains("cp311"))
        );
        // An existing toolkit root: no toolchain wheel. No DSL export: no DSL input.
        let bare = lock.used_inputs(ToolkitKind::ExternalRoot, None);
        assert!(
            bare.iter().all(|i| i.role == InputRole::KernelSource),
            "{:?}",
            names(bare)
        );
        assert_eq!(lock.used_inputs(ToolkitKind::ExternalRoot, None).len(), 1);
    }
}
