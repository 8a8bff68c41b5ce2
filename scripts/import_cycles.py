#!/usr/bin/env python3
"""Import circles between the crate's modules.

A module `a` imports `b` when a non-test line of a file under `a` names `crate::b` (in a `use` or
in a path; a file that is a `#[cfg(test)] mod` is all test). The nodes are the top-level modules of src/ and, one level down, the children of
`ops`, `device` and `nn` (`ops/mod.rs` is the node `ops` itself; a parent's `mod`/`pub use` of
its own children is structure, not an import; a name a `mod.rs` re-exports counts as its
child's).
Prints every circle found, with the files behind each edge, and exits 1 if there is one.

    python3 scripts/import_cycles.py              # every circle
    python3 scripts/import_cycles.py --only ops,device,nn   # circles among their children
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
SPLIT = {"ops", "device", "nn"}  # modules whose children are nodes of their own


def node_of_file(path):
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[0] in ("lib", "main", "bin"):
        return None
    if parts[0] in SPLIT and len(parts) > 1 and parts[1] != "mod":
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def node_of_path(segments):
    """The node a `crate::...` path names (its segments after `crate`)."""
    if not segments:
        return None
    top = segments[0]
    if not ((SRC / f"{top}.rs").exists() or (SRC / top).is_dir()):
        return None  # an item re-exported from lib.rs: resolved by name below
    if top in SPLIT and len(segments) > 1:
        child = segments[1]
        if (SRC / top / f"{child}.rs").exists() or (SRC / top / child).is_dir():
            return f"{top}/{child}"
    return top


def strip(text):
    """The file without its tests, comments and string literals (strings become `""`)."""
    text = re.split(r"\n#\[cfg\(test\)\]\s*\nmod tests", text)[0]
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (raw := re.match(r'b?r(#*)"', text[i:i + 260])) and not re.match(r"\w", text[i - 1:i]):
            end = text.find('"' + raw.group(1), i + len(raw.group(0)))
            i = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""')
        elif text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif text[i] == "'" and (ch := re.match(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])):
            i += len(ch.group(0))  # a char literal such as '"'; a lifetime is kept
            out.append("' '")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def paths(text):
    """Every `crate::a::b` path, `use crate::{a::x, b}` groups expanded one level."""
    for m in re.finditer(r"\bcrate::((?:\w+::)*)(\{[^;]*?\}|\w+)", text):
        prefix = [s for s in m.group(1).split("::") if s]
        tail = m.group(2)
        if tail.startswith("{"):
            for item in re.split(r",(?![^{]*\})", tail[1:-1]):
                item = item.strip()
                if item:
                    yield prefix + re.findall(r"\w+", item.split("{")[0])[:2]
        else:
            yield prefix + [tail]


def lib_reexports():
    """Names `lib.rs` re-exports, mapped to the node they come from."""
    out = {}
    lib = strip((SRC / "lib.rs").read_text())
    for m in re.finditer(r"pub use (?:crate::)?((?:\w+::)+)(\{[^;]*\}|\w+)", lib):
        node = node_of_path([s for s in m.group(1).split("::") if s])
        for name in re.findall(r"\b\w+\b", m.group(2)):
            if node and name not in ("self", "as"):
                out.setdefault(name, node)
    return out


def child_reexports(parent):
    """Names `parent/mod.rs` re-exports from its children, mapped to the child's node."""
    out = {}
    text = strip((SRC / parent / "mod.rs").read_text())
    for m in re.finditer(r"pub(?:\(crate\))? use (?:crate::%s::|self::)?(\w+)::(\{[^;]*\}|\*|\w+)" % parent, text):
        child = m.group(1)
        files = [SRC / parent / f"{child}.rs"] + list((SRC / parent / child).rglob("*.rs"))
        if not any(f.exists() for f in files):
            continue
        names = re.findall(r"\b\w+\b", m.group(2))
        if m.group(2) == "*":
            names = []
            for f in files:
                if f.exists():
                    names += re.findall(
                        r"^pub(?:\([^)]*\))? (?:const |async |unsafe )*(?:fn|struct|enum|trait|const|type|static) (\w+)",
                        strip(f.read_text()), flags=re.M)
        for name in names:
            out.setdefault(name, f"{parent}/{child}")
    return out


def test_files():
    """Files that are test-only modules: declared `#[cfg(test)] mod name;` by their parent."""
    out = set()
    for f in SRC.rglob("*.rs"):
        here = f.parent if f.name == "mod.rs" else f.with_suffix("")
        for name in re.findall(r"#\[cfg\(test\)\]\s*mod (\w+);", f.read_text()):
            out |= {here / f"{name}.rs", here / name / "mod.rs"}
    return out


def graph():
    tests = test_files()
    reexp = lib_reexports()
    child = {p: child_reexports(p) for p in SPLIT}
    edges = {}
    for f in sorted(SRC.rglob("*.rs")):
        src = node_of_file(f)
        if src is None or f in tests:
            continue
        for segs in paths(strip(f.read_text())):
            dst = node_of_path(segs) or reexp.get(segs[0] if segs else "")
            if dst in SPLIT and len(segs) > 1:
                dst = child[dst].get(segs[1], dst)  # an item the parent re-exports
            if not dst or dst == src:
                continue
            # A parent naming its own children (mod.rs re-exports) is structure.
            if "/" in dst and dst.split("/")[0] == src:
                continue
            if "/" in src and "/" not in dst and src.split("/")[0] == dst:
                continue  # a child naming its parent's items: same module
            # Across top-level modules only the top-level names count.
            a, b = src.split("/")[0], dst.split("/")[0]
            if a != b:
                src_, dst_ = a, b
            else:
                src_, dst_ = src, dst
            edges.setdefault(src_, {}).setdefault(dst_, set()).add(f.relative_to(SRC).as_posix())
    return edges


def cycles(edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    edges = graph()
    found = cycles(edges)
    if len(sys.argv) == 3 and sys.argv[1] == "--only":
        parents = set(sys.argv[2].split(","))
        found = [c for c in found if all(n.split("/")[0] in parents and "/" in n for n in c)]
    for comp in found:
        print("import circle:", " <-> ".join(comp))
        for a in comp:
            for b in comp:
                if b in edges.get(a, {}):
                    print(f"  {a} -> {b}: {', '.join(sorted(edges[a][b]))}")
    if not found:
        print("no import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
