"""Lists the import circles among the modules of `src/` (a module is a file; `mod.rs` is its
folder's module), read from `use crate::...`, `use super::...` and `crate::a::b` paths in the
code. Exits 1 if a circle is found that is not in the allowed list given with --allow
(`a<->b` pairs of module paths), else 0.

    python3 tools/module_cycles.py [--allow cuda::context<->cuda::stream ...]
"""

import argparse
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PATH = re.compile(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)+)")


def module_of(file):
    parts = list(file.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def resolve(here, kind, tail, modules):
    """The module a `crate::...` or `super::...` path names (its longest known prefix)."""
    base = [] if kind == "crate" else here[:-1]
    names = base + tail.strip(":").split("::")
    for n in range(len(names), 0, -1):
        if "::".join(names[:n]) in modules:
            return "::".join(names[:n])
    return None


def graph():
    files = sorted(SRC.rglob("*.rs"))
    modules = {"::".join(module_of(f)): f for f in files}
    edges = {m: set() for m in modules}
    for name, file in modules.items():
        here = module_of(file)
        if file.name == "mod.rs":
            here = here + ["mod"]
        text = file.read_text()
        text = re.split(r"#\[cfg\(test\)\]\s*mod ", text)[0]  # test modules may use anything
        text = re.sub(r"//.*", "", text)
        for kind, tail in PATH.findall(text):
            target = resolve(here, kind, tail, modules)
            if target and target != name and not target.startswith(name + "::") and target:
                if not name.startswith(target + "::") or target == "":
                    edges[name].add(target)
    edges.pop("", None)
    for e in edges.values():
        e.discard("")
    return edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--allow", nargs="*", default=[])
    allowed = {frozenset(a.split("<->")) for a in parser.parse_args().allow}
    found = cycles(graph())
    bad = [c for c in found if frozenset(c) not in allowed]
    for c in found:
        print(("allowed: " if frozenset(c) in allowed else "circle: ") + " <-> ".join(c))
    print(f"{len(found)} circle(s), {len(bad)} not allowed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
