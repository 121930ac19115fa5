//! Content keys of the compile units: a unit is compiled again when
//! something it reads changed, and only then.
//!
//! Why narrow keys: the key used to hash every source of ours, so an edit of
//! one kernel file recompiled every unit, FlashInfer's three included, the
//! slowest by far (docs/reproducibility.md, "Cost on 2 cores"). A unit
//! reads:
//! - its description in the table (flags, targets, include directories);
//! - its source and, transitively, the sources of ours that it includes by a
//!   quoted name (all of them are staged side by side in `src/`);
//! - the staged kernel source and our patches to it, if it has include
//!   directories into that tree or is a DSL export;
//! - the DSL environment and the key of every DSL unit, if it includes the
//!   headers the DSL exports write;
//! - the toolchain and the generator's version.
//!
//! The keys only decide what the unit cache reuses: a key that missed an
//! input would reuse stale outputs, which the lock comparison of a fresh
//! build (CI builds with an empty cache) would then report.

use std::collections::{BTreeMap, BTreeSet};

use gdn_lock::{ArtifactTable, Sha256Hex, Unit};

use crate::error::Result;
use crate::stage::staged_source;

/// Everything the keys hash besides the table.
pub struct KeyInputs<'a> {
    pub table: &'a ArtifactTable,
    /// Our sources and patches by repository path, with their hashes.
    pub sources: &'a BTreeMap<String, Sha256Hex>,
    pub kernel_source: &'a Sha256Hex,
    /// The toolchain identity and the host compiler.
    pub toolchain: serde_json::Value,
    /// The DSL environment's key, where there is one.
    pub dsl: Option<serde_json::Value>,
}

/// One key per unit, in table order. `read_source` returns the text of one
/// of our sources (by repository path) as it is compiled.
pub fn unit_keys(
    inputs: &KeyInputs,
    read_source: impl Fn(&str) -> Result<String>,
) -> Result<Vec<Sha256Hex>> {
    let table = inputs.table;
    let dsl_header_dir = table.dsl.as_ref().map(|d| d.header_dir.as_str());
    let mut dsl_keys = vec![];
    for unit in table.units.iter().filter(|u| u.dsl.is_some()) {
        dsl_keys.push(key_of(unit, inputs, &read_source, &[])?);
    }
    table
        .units
        .iter()
        .map(|unit| {
            let reads_dsl_headers = unit
                .includes
                .iter()
                .any(|d| Some(d.as_str()) == dsl_header_dir);
            let upstream: &[Sha256Hex] = if reads_dsl_headers { &dsl_keys } else { &[] };
            key_of(unit, inputs, &read_source, upstream)
        })
        .collect()
}

fn key_of(
    unit: &Unit,
    inputs: &KeyInputs,
    read_source: &impl Fn(&str) -> Result<String>,
    dsl_units: &[Sha256Hex],
) -> Result<Sha256Hex> {
    let dsl_header_dir = inputs.table.dsl.as_ref().map(|d| d.header_dir.as_str());
    let reads_kernel_source = unit.dsl.is_some()
        || !unit.system_includes.is_empty()
        || unit
            .includes
            .iter()
            .any(|d| Some(d.as_str()) != dsl_header_dir);
    let own: Vec<(&String, &Sha256Hex)> = sources_read(unit, inputs, read_source)?
        .into_iter()
        .map(|p| (p, &inputs.sources[p]))
        .collect();
    let kernel_source = reads_kernel_source.then(|| {
        let patches: Vec<(&String, Option<&Sha256Hex>)> = inputs
            .table
            .patches
            .iter()
            .map(|p| (p, inputs.sources.get(p)))
            .collect();
        serde_json::json!({
            "sha256": inputs.kernel_source,
            "members": inputs.table.kernel_source_members,
            "patches": patches,
        })
    });
    let uses_dsl = unit.dsl.is_some() || !dsl_units.is_empty();
    let doc = serde_json::json!({
        "unit": unit,
        "sources": own,
        "kernel_source": kernel_source,
        "dsl": if uses_dsl { inputs.dsl.clone() } else { None },
        "dsl_units": dsl_units,
        "toolchain": inputs.toolchain,
        "generator": env!("CARGO_PKG_VERSION"),
    });
    Ok(Sha256Hex::of_bytes(doc.to_string().as_bytes()))
}

/// The unit's source and the sources of ours it includes by a quoted name,
/// transitively (sorted repository paths).
fn sources_read<'a>(
    unit: &Unit,
    inputs: &'a KeyInputs,
    read_source: &impl Fn(&str) -> Result<String>,
) -> Result<BTreeSet<&'a String>> {
    let by_staged_name: BTreeMap<String, &String> = inputs
        .sources
        .keys()
        .map(|p| (staged_source(p), p))
        .collect();
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&String> = by_staged_name
        .get(&staged_source(&unit.source))
        .into_iter()
        .copied()
        .collect();
    while let Some(path) = todo.pop() {
        if !seen.insert(path) {
            continue;
        }
        let text = read_source(path)?;
        // A Python driver (the DSL export) reads the modules of ours it
        // imports: they are staged beside it in `src/` and on its path.
        let read: Vec<String> = if path.ends_with(".py") {
            python_imports(&text).map(|m| format!("{m}.py")).collect()
        } else {
            quoted_includes(&text).map(str::to_string).collect()
        };
        for name in read {
            if let Some(p) = by_staged_name.get(&format!("src/{name}")) {
                todo.push(p);
            }
        }
    }
    Ok(seen)
}

/// The top-level module names of `import a, b` and `from a import x` lines,
/// at any indentation (imports inside functions count too). Relative imports
/// and anything not at the start of a line are not followed; a name that is
/// not one of our sources is ignored by the caller.
fn python_imports(text: &str) -> impl Iterator<Item = &str> {
    text.lines().flat_map(|line| {
        let line = line.trim_start();
        let names: Vec<&str> = if let Some(rest) = line.strip_prefix("import ") {
            rest.split('#').next().unwrap_or("").split(',').collect()
        } else if let Some(rest) = line.strip_prefix("from ") {
            rest.split_whitespace().next().into_iter().collect()
        } else {
            vec![]
        };
        names.into_iter().filter_map(|n| {
            let module = n.split_whitespace().next()?.split('.').next()?;
            let ok = !module.is_empty()
                && module
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            ok.then_some(module)
        })
    })
}

/// The names in `#include "name"` lines (preprocessor spacing allowed).
fn quoted_includes(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix('#')?.trim_start();
        let rest = rest.strip_prefix("include")?.trim_start();
        let rest = rest.strip_prefix('"')?;
        rest.split('"').next()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn table() -> ArtifactTable {
        ArtifactTable::load(&repo().join("generator/artifacts.json")).unwrap()
    }

    /// Keys of the real table with made-up hashes, one source's hash
    /// replaced by `changed` (when given).
    fn keys(table: &ArtifactTable, changed: Option<&str>) -> BTreeMap<String, Sha256Hex> {
        let sources: BTreeMap<String, Sha256Hex> = table
            .sources
            .iter()
            .chain(&table.patches)
            .map(|p| {
                let tag = if Some(p.as_str()) == changed {
                    "new"
                } else {
                    "old"
                };
                (
                    p.clone(),
                    Sha256Hex::of_bytes(format!("{p} {tag}").as_bytes()),
                )
            })
            .collect();
        let kernel_source = Sha256Hex::of_bytes(b"wheel");
        let inputs = KeyInputs {
            table,
            sources: &sources,
            kernel_source: &kernel_source,
            toolchain: serde_json::json!("nvcc 13.0.88"),
            dsl: Some(serde_json::json!("python 3.12.3")),
        };
        let read = |p: &str| Ok(std::fs::read_to_string(repo().join(p)).unwrap());
        let keys = unit_keys(&inputs, read).unwrap();
        table
            .units
            .iter()
            .map(|u| u.name.clone())
            .zip(keys)
            .collect()
    }

    /// Units whose key changes when `source` changes.
    fn recompiled_by(source: &str) -> BTreeSet<String> {
        recompiled_in(&table(), source)
    }

    fn recompiled_in(table: &ArtifactTable, source: &str) -> BTreeSet<String> {
        let listed = table.sources.iter().chain(&table.patches);
        assert!(
            listed.clone().any(|s| s == source),
            "{source} is not listed"
        );
        let (before, after) = (keys(table, None), keys(table, Some(source)));
        before
            .into_iter()
            .filter(|(name, key)| &after[name] != key)
            .map(|(name, _)| name)
            .collect()
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_kernel_file_recompiles_its_unit_only() {
        for unit in ["model_kernels", "skinny_linear", "sampling", "gdn_portable"] {
            let source = format!("crates/gdn-kernels/cuda/{unit}.cu");
            assert_eq!(recompiled_by(&source), names(&[unit]), "{source}");
        }
        assert_eq!(
            recompiled_by("crates/gdn-kernels/cuda/flashinfer_sm90_inst.cu"),
            names(&["flashinfer_sm90_gva", "flashinfer_sm90_mha"])
        );
    }

    #[test]
    fn an_included_header_recompiles_every_unit_that_includes_it() {
        assert_eq!(
            recompiled_by("crates/gdn-kernels/cuda/gdn_abi.h"),
            names(&[
                "gdn_abi",
                "gdn_dsl_abi",
                "gdn_swiglu_abi",
                "flashinfer_sm90_gva_vsplit"
            ])
        );
        assert_eq!(
            recompiled_by("crates/gdn-kernels/cuda/gdn_vsplit_abi.h"),
            names(&["flashinfer_sm90_gva_vsplit"])
        );
        assert_eq!(
            recompiled_by("crates/gdn-kernels/cuda/gdn_attention_abi.h"),
            names(&["flashinfer_attention_sm90"])
        );
        assert_eq!(
            recompiled_by("crates/gdn-kernels/cuda/gdn_swiglu_abi.h"),
            names(&["gdn_swiglu_abi"])
        );
        // model_kernels.cu's parts: one unit includes them.
        for part in ["model_common", "model_deltanet_conv", "model_attention"] {
            assert_eq!(
                recompiled_by(&format!("crates/gdn-kernels/cuda/{part}.cuh")),
                names(&["model_kernels"]),
                "{part}"
            );
        }
    }

    #[test]
    fn the_dsl_driver_recompiles_the_exports_and_the_units_that_include_their_headers() {
        let table = table();
        let mut expected: BTreeSet<String> = table
            .units
            .iter()
            .filter(|u| u.dsl.is_some())
            .map(|u| u.name.clone())
            .collect();
        assert!(expected.len() >= 2, "the table lost its DSL units");
        expected.insert("gdn_dsl_abi".into());
        expected.insert("gdn_swiglu_abi".into());
        assert_eq!(recompiled_by("generator/cute_dsl/export_gdn.py"), expected);
    }

    #[test]
    fn a_patch_recompiles_every_unit_that_reads_the_kernel_source() {
        let mut table = table();
        table.patches.push("patches/example.patch".into());
        let own_code = names(&[
            "gdn_abi",
            "gdn_portable",
            "model_kernels",
            "sampling",
            "skinny_linear",
        ]);
        let expected: BTreeSet<String> = table
            .units
            .iter()
            .map(|u| u.name.clone())
            .filter(|n| !own_code.contains(n))
            .collect();
        assert!(expected.contains("flashinfer_sm90_gva") && expected.contains("gdn_dsl_abi"));
        assert_eq!(recompiled_in(&table, "patches/example.patch"), expected);
    }

    #[test]
    fn a_module_the_dsl_driver_imports_recompiles_what_the_driver_does() {
        let expected = recompiled_by("generator/cute_dsl/export_gdn.py");
        assert!(expected.contains("dsl_quack_sm90"));
        assert_eq!(
            recompiled_by("generator/cute_dsl/quack_swiglu.py"),
            expected
        );
    }

    #[test]
    fn python_imports_are_read_at_any_indentation() {
        let text =
            "import os, sys as system\nfrom a.b import c\n    from quack_swiglu import variants\n\
                    x = 1  # import y\nfrom . import z\nimport json  # why\n";
        assert_eq!(
            python_imports(text).collect::<Vec<_>>(),
            ["os", "sys", "a", "quack_swiglu", "json"]
        );
    }

    #[test]
    fn quoted_includes_are_read_with_preprocessor_spacing() {
        let text =
            "#include \"a.h\"\n  #  include \"b.h\" // x\n#include <c.h>\n#define X \"d.h\"\n";
        assert_eq!(quoted_includes(text).collect::<Vec<_>>(), ["a.h", "b.h"]);
    }
}
