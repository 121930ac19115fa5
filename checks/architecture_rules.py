#!/usr/bin/env python3
"""Rules of the workspace's layout that the compiler does not enforce (issue:
"folders that are the design"), read from the sources:

1. no `#[path]` attribute anywhere: no source file compiles into two crates
   or hides under another module's name;
2. no `Result<_, String>` in non-test code: errors are types;
3. no import circle between the modules of one crate: module A naming B
   (through `crate::`, `super::` or `self::` paths) while B names A, directly
   or through others, is a circle. A parent that only declares and
   re-exports its children (`mod x; pub use x::...`) does not count as
   naming them;
4. the HTTP library (crates/http) depends on the engine only, never on the
   model or kernel crates.

Exit status 1 with every violation named; 0 when the tree keeps the rules.
"""
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [p for p in sorted((ROOT / "crates").glob("**/src")) if "target" not in p.parts]
SOURCE_DIRS.append(ROOT / "generator" / "src")


def non_test_code(text: str) -> str:
    """The text before the file's first `#[cfg(test)]` (tests come last)."""
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def module_of(src: Path, file: Path) -> tuple:
    rel = file.relative_to(src).with_suffix("")
    parts = [p for p in rel.parts if p != "mod"]
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def is_test_file(src: Path, file: Path) -> bool:
    name = file.stem
    return name == "tests" or name.endswith("_tests")


def resolve(path: list, here: tuple, is_mod_file: bool, modules: set) -> tuple | None:
    """The longest known module a `crate::`/`super::`/`self::` path names."""
    if not path:
        return None
    if path[0] == "crate":
        base, rest = (), path[1:]
    elif path[0] in ("super", "self"):
        # In a file `a/b.rs` (module a::b) `self` is a::b, `super` is a; in
        # `a/mod.rs` (module a) the same.
        base = here
        rest = path
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None
    best = None
    cur = base
    if cur in modules:
        best = cur
    for seg in rest:
        cur = cur + (seg,)
        if cur in modules:
            best = cur
        else:
            break
    return best


PATH_RE = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def names_used(text: str) -> list:
    """Every path rooted at crate/super/self, with `use a::{b, c::d}` groups
    expanded one level."""
    paths = []
    for m in USE_GROUP_RE.finditer(text):
        prefix = m.group(1)
        for item in re.split(r",(?![^{]*\})", m.group(2)):
            item = item.strip()
            head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", item)
            if head and head.group(0) != "self":
                paths.append(prefix + "::" + head.group(0))
            else:
                paths.append(prefix)
    for m in PATH_RE.finditer(text):
        paths.append(re.sub(r"\s+", "", m.group(1)))
    return [p.split("::") for p in paths]


def circles(src: Path) -> list:
    files = [f for f in sorted(src.rglob("*.rs"))]
    modules = {module_of(src, f) for f in files}
    edges = {m: set() for m in modules}
    for f in files:
        if is_test_file(src, f):
            continue
        here = module_of(src, f)
        text = strip_comments(non_test_code(f.read_text()))
        # A parent re-exporting its children is declaration, not use.
        children = {m[-1] for m in modules if len(m) == len(here) + 1 and m[:-1] == here}
        text = re.sub(r"\bpub(\([^)]*\))?\s+use\s+(?:self::)?([a-z_][a-z0-9_]*)::[^;]*;",
                      lambda m: "" if m.group(2) in children else m.group(0), text)
        for path in names_used(text):
            target = resolve(path, here, f.name == "mod.rs", modules)
            # The crate root only wires modules together: a path to one of
            # its re-exports is not counted as a use of the root.
            if target is not None and target != here and target != ():
                edges[here].add(target)
    # Tarjan's strongly connected components.
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted("::".join(c) or "crate" for c in comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    problems = []
    for src in SOURCE_DIRS:
        crate = src.parent.relative_to(ROOT)
        for f in sorted(src.parent.rglob("*.rs")):
            if "target" in f.parts:
                continue
            text = f.read_text()
            if re.search(r"#\[path\s*=", strip_comments(text)):
                problems.append(f"{f.relative_to(ROOT)}: #[path] attribute")
            # Test kits are dev-only crates: test code.
            if f.is_relative_to(src) and not is_test_file(src, f) and "testkits" not in f.parts:
                code = strip_comments(non_test_code(text))
                for m in re.finditer(r"Result<[^;{]*?,\s*String\s*>", code):
                    line = code[: m.start()].count("\n") + 1
                    problems.append(f"{f.relative_to(ROOT)}:{line}: Result<_, String> in non-test code")
        for comp in circles(src):
            problems.append(f"{crate}: import circle between modules {', '.join(comp)}")
    http = ROOT / "crates/http/Cargo.toml"
    manifest = tomllib.loads(http.read_text()) if http.exists() else {}
    if not http.exists():
        problems.append("crates/http: missing (the HTTP library must be a crate of its own, apart from the binary)")
    for table in ("dependencies", "dev-dependencies", "build-dependencies"):
        for dep in manifest.get(table, {}):
            if dep in ("qwen35", "gdn-kernels", "gdn-server", "qwen35-testkit", "gdn-kernels-testkit"):
                problems.append(f"crates/http/Cargo.toml: [{table}] {dep}: the HTTP library depends on the engine only")
    for p in problems:
        print(p)
    print(f"architecture rules: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
