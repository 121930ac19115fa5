//! Rules of the generator's code that the compiler does not enforce, read
//! from the sources themselves:
//! - its modules form layers: no two modules use each other, directly or
//!   through others, and no module outside `commands/` uses `commands`
//!   (a command runs the plan; the plan never calls back into a command);
//! - no `Result<_, String>` outside tests, in the generator, gdn-lock and the
//!   kernels crate's build.rs: errors are types that name what failed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The text before the file's `#[cfg(test)]` module (tests come last in
/// every file of these crates).
fn non_test_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The module a file of `generator/src` is (`plan`, `commands::lock`;
/// `main.rs` is the crate root, `commands/mod.rs` is `commands`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|p| p != "mod")
        .collect();
    if parts == ["main"] {
        "crate".into()
    } else {
        parts.join("::")
    }
}

/// The modules of `known` that `text` names through `crate::` paths (in
/// `use` lines, braces included, and inline).
fn crate_modules_used(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        // `crate::{a, b::c}` names several paths.
        let paths: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|s| s.trim().to_string())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            vec![rest[..end].to_string()]
        };
        for path in paths {
            // The longest prefix that is a module: `commands::lock::pin` is `commands::lock`.
            let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            if let Some(module) = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|m| known.contains(m))
            {
                used.insert(module);
            }
        }
    }
    used
}

/// module -> the modules it uses (itself and its own submodules left out).
fn generator_module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = repo().join("generator/src");
    let files = rust_files(&src);
    let known: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    files
        .iter()
        .map(|f| {
            let module = module_of(&src, f);
            let mut used = crate_modules_used(&non_test_code(f), &known);
            used.retain(|u| u != &module && !u.starts_with(&format!("{module}::")));
            (module, used)
        })
        .collect()
}

/// A cycle through `start`, if there is one (the modules in order).
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn generator_modules_use_each_other_in_one_direction_only() {
    let graph = generator_module_graph();
    assert!(
        graph.contains_key("plan") && graph.contains_key("bundle"),
        "{graph:?}"
    );
    let in_cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|c| format!("{} -> {}", c.join(" -> "), c[0]))
        .collect();
    assert!(
        in_cycles.is_empty(),
        "modules that use each other:\n{}",
        in_cycles.join("\n")
    );
}

#[test]
fn only_the_commands_use_the_commands() {
    let graph = generator_module_graph();
    let offenders: Vec<&String> = graph
        .iter()
        .filter(|(m, used)| {
            m.as_str() != "crate"
                && !m.starts_with("commands")
                && used.iter().any(|u| u.starts_with("commands"))
        })
        .map(|(m, _)| m)
        .collect();
    assert!(offenders.is_empty(), "{offenders:?} use commands/");
}

/// The second type argument of every `Result<A, B>` in `text`.
fn result_error_types(text: &str) -> Vec<String> {
    let mut out = vec![];
    for (i, _) in text.match_indices("Result<") {
        let args = &text[i + "Result<".len()..];
        let (mut depth, mut comma, mut end) = (0i32, None, None);
        for (j, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth == 0 => {
                    end = Some(j);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 && comma.is_none() => comma = Some(j),
                _ => {}
            }
        }
        if let (Some(c), Some(e)) = (comma, end) {
            out.push(args[c + 1..e].trim().to_string());
        }
    }
    out
}

#[test]
fn the_rule_reader_finds_string_errors() {
    let found = result_error_types(
        "fn a() -> Result<Vec<u8>, String> {}\nfn b() -> std::result::Result<(), std::string::String>\n\
         fn c() -> Result<u8> {}\nfn d() -> Result<BTreeMap<String, u8>, Error> {}",
    );
    assert_eq!(found, ["String", "std::string::String", "Error"]);
}

#[test]
fn errors_are_types_not_strings() {
    let r = repo();
    let mut files = rust_files(&r.join("generator/src"));
    files.extend(rust_files(&r.join("crates/gdn-lock/src")));
    files.push(r.join("crates/gdn-kernels/build.rs"));
    let mut offenders = vec![];
    for f in &files {
        for ty in result_error_types(&non_test_code(f)) {
            if ty == "String" || ty.ends_with("::String") || ty == "&str" || ty == "&'static str" {
                offenders.push(format!("{}: Result<_, {ty}>", f.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
