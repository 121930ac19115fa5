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
   model or kernel crates;
5. source comments carry no dates, session numbers or measured figures:
   Rust comments (`//`, `///`, `//!`, `/* */`) in every crate's src, tests,
   examples and build.rs, and in generator/src, name no date (2026-12-07,
   2026-12, "Dec 3", "December 2026"), no session ("session", "the
   fourteenth session", "since s14") and no measured time, ratio, share or
   rate ("3.4 ms", "250 us", "1.38x", "1.4-1.9x", "2x faster than cuBLAS",
   "71% of the bandwidth", "GB/s", "tok/s", "TFLOP/s" after a number). A
   comment states the rule and points at the measurement, whose
   docs/results/<run>/README.md keeps the figures and the date: a comment
   line naming `docs/results/` is exempt. A setting is not a measurement: a
   time or share in backticks (a flag's value) passes, and so does a time
   that the words around it call a setting (timeout, keep-alive, default,
   every, within, at most, at least, up to, limit, budget, retry,
   deadline).

Warning (printed, not a violation): a function over 120 lines in non-test
code (crates/*/src and generator/src, before the file's `#[cfg(test)]`):
split it at its numbered steps.

Exit status 1 with every violation named; 0 when the tree keeps the rules.
"""
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [p for p in sorted((ROOT / "crates").glob("**/src")) if "target" not in p.parts]
SOURCE_DIRS.append(ROOT / "generator" / "src")
LONGEST_FN_LINES = 120


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


def rust_comments(text: str) -> list:
    """(line, text) of every comment line of a Rust source, its markers
    (`//`, `///`, `//!`, `/*`, `*`, `*/`) stripped; string, raw string and
    char literals are skipped, so a `//` inside a string is not a comment."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((line, re.sub(r"^//[/!]?", "", text[i:end])))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            for k, part in enumerate(text[i:j].split("\n")):
                out.append((line + k, re.sub(r"^\s*(/\*+!?|\*(?!/))|\*/$", "", part)))
            line += text[i:j].count("\n")
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i : i + 260])) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            end = text.find(close, i + len(m.group(0)))
            end = n if end < 0 else end + len(close)
            line += text[i:end].count("\n")
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            line += text[i:j].count("\n")
            i = j + 1
        elif c == "'" and (m := CHAR_LITERAL.match(text, i)):
            i = m.end()
        else:
            i += 1
    return out


CHAR_LITERAL = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")
MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
         r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
NUMBER = r"(?<![\w.])\d+(?:\.\d+)?"
# What a comment must not carry, by kind. Each is searched in a comment
# block's lines joined by spaces, so a figure split over two lines is found.
DATED_OR_MEASURED = [
    ("a date", re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])\b")),
    ("a date", re.compile(rf"\b{MONTH}\.? (?:\d{{1,2}}(?:st|nd|rd|th)?\b|20\d\d\b)|\b\d{{1,2}} {MONTH}\b")),
    ("a session", re.compile(r"(?i)\bsessions?\b")),
    ("a session", re.compile(r"\b(?:in|since|from|before|after|until|of|at|by) s\d{1,2}\b|\(s\d{1,2}\)|(?<=\w)-s\d{1,2}\b")),
    # 3.4 ms, 250us, 1.2 s (a bare `s` only after a space: "400s" is a plural).
    ("a measured time", re.compile(rf"{NUMBER}(?:\s*-\s*\d+(?:\.\d+)?)?"
                                   r"(?:\s*(?:ns|us|µs|ms)|\s+(?:s|sec|seconds|min|minutes))\b")),
    # 1.38x, 1.4-1.9x; a whole 2x only beside what it was measured against.
    ("a measured ratio", re.compile(r"(?<![\w.])\d+\.\d+x\b|(?<![\w.])\d+(?:\.\d+)?\s*-\s*\d+(?:\.\d+)?x\b")),
    ("a measured ratio", re.compile(rf"{NUMBER}x (?:faster|slower|speed-?up|of (?:the |its )?(?:floor|roofline)"
                                    r"|cuBLAS|FLA|FlashInfer|vLLM)\b")),
    ("a measured share", re.compile(rf"(?:within|faster by|slower by|lost|gained|off by) (?:about )?{NUMBER}\s*%"
                                    rf"|{NUMBER}\s*% (?:of (?:the |its |their )?(?:copy |memory |DRAM |HBM |peak )?"
                                    r"(?:bandwidth|roofline|peak|floor|time|step|runtime)|faster|slower|lower|higher|lost|off)\b")),
    ("a measured rate", re.compile(rf"{NUMBER}\s*(?:[KMGT]i?B/s|tok(?:ens)?/s|[GT]FLOP/?s|[GT]FLOPS)(?!\w)")),
]
# A time that is a setting, not a measurement: the words around it say so.
SETTING = re.compile(r"(?i)timeout|keep-alive|default|\bevery\b|\bwithin\b|at most|at least|up to|\blimit|budget"
                     r"|retry|deadline")


def comment_problems(text: str) -> list:
    """(line, what, excerpt) for each comment line that carries a date, a
    session or a measured figure (rule 5)."""
    blocks = []
    for ln, body in rust_comments(text):
        if blocks and ln == blocks[-1][-1][0] + 1:
            blocks[-1].append((ln, body))
        else:
            blocks.append([(ln, body)])
    found = {}
    for block in blocks:
        joined, starts = "", []
        for ln, body in block:
            starts.append((len(joined), ln, body))
            joined += body.strip() + " "
        for what, pattern in DATED_OR_MEASURED:
            for m in pattern.finditer(joined):
                _, ln, body = max(s for s in starts if s[0] <= m.start())
                if "docs/results/" in body:
                    continue
                quoted = joined[: m.start()].count("`") % 2 == 1
                if what in ("a measured time", "a measured share") and quoted:
                    continue
                if what == "a measured time" and SETTING.search(joined[max(0, m.start() - 40) : m.end() + 20]):
                    continue
                found.setdefault((ln, what), m.group(0).strip())
    return [(ln, what, excerpt) for (ln, what), excerpt in sorted(found.items())]


def comment_files() -> list:
    """The Rust files rule 5 reads: every crate's src, tests, examples and
    build.rs, and the generator's src."""
    files = []
    for crate in sorted({p.parent for p in (ROOT / "crates").glob("**/Cargo.toml")}):
        if "target" in crate.relative_to(ROOT).parts:
            continue
        for sub in ("src", "tests", "examples"):
            files += sorted((crate / sub).rglob("*.rs"))
        if (crate / "build.rs").exists():
            files.append(crate / "build.rs")
    files += sorted((ROOT / "generator" / "src").rglob("*.rs"))
    return files


def blank_comments_and_literals(text: str) -> str:
    """The text with comments, strings and chars turned to spaces (line
    breaks kept), so that their braces do not count."""
    code = list(text)
    literal = re.compile(r'//[^\n]*|/\*.*?\*/|b?r(#*)".*?"\1|"(?:\\.|[^"\\])*"', re.S)
    for m in list(literal.finditer(text)) + list(CHAR_LITERAL.finditer(text)):
        for k in range(m.start(), m.end()):
            if code[k] != "\n":
                code[k] = " "
    return "".join(code)


def long_functions(text: str) -> list:
    """(name, line, length) of each `fn` item whose text, from its `fn` line
    to its closing brace, is over LONGEST_FN_LINES lines."""
    code = blank_comments_and_literals(text)
    out = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        # The body opens at the first `{` outside the signature's brackets; a
        # `;` first is a declaration without a body (a trait's).
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                break
            elif ch == "{" and depth == 0:
                break
            j += 1
        if j >= len(code) or code[j] != "{":
            continue
        depth, k = 0, j
        while k < len(code):
            depth += {"{": 1, "}": -1}.get(code[k], 0)
            if depth == 0:
                break
            k += 1
        length = code[m.start() : k + 1].count("\n") + 1
        if length > LONGEST_FN_LINES:
            out.append((m.group(1), code[: m.start()].count("\n") + 1, length))
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
    for f in comment_files():
        for line, what, excerpt in comment_problems(f.read_text()):
            problems.append(f"{f.relative_to(ROOT)}:{line}: comment carries {what} ({excerpt!r}); "
                            "state the rule and point at docs/results/<run>/README.md")
    warnings = []
    for src in SOURCE_DIRS:
        for f in sorted(src.rglob("*.rs")):
            if "target" in f.parts or is_test_file(src, f) or "testkits" in f.parts:
                continue
            for name, line, length in long_functions(non_test_code(f.read_text())):
                warnings.append(f"warning: fn {name} in {f.relative_to(ROOT)}:{line} is {length} lines "
                                f"(over {LONGEST_FN_LINES})")
    for w in warnings:
        print(w)
    for p in problems:
        print(p)
    print(f"architecture rules: {len(problems)} violation(s), {len(warnings)} warning(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
