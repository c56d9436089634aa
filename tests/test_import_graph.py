"""The import graph of our four packages: no cycles (module-level or lazy imports inside
functions alike), and the layers as the README's architecture draws them: the core
(`unbiased/`) imports neither ray nor the packages above it, analysis never imports
trainables or sweeps."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("unbiased", "trainables", "sweeps", "analysis")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _ours(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Module -> our modules it imports, and module -> top-level names of all it imports.
    `from pkg import sub` counts as an import of pkg.sub where sub is a module."""
    mods = _modules()
    graph, external = {}, {}
    for module, path in mods.items():
        ours, names = set(), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" in mods]
                targets = subs + ([node.module] if len(subs) < len(node.names) else [])
            else:
                continue
            for target in targets:
                names.add(target.split(".")[0])
                resolved = _ours(target, mods)
                if resolved and resolved != module:
                    ours.add(resolved)
        graph[module], external[module] = ours, names
    return graph, external


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph, _ = import_graph()
    assert len(graph) > 40  # the walk found our modules
    assert cycles(graph) == []


def test_each_layer_imports_only_below_it():
    graph, external = import_graph()
    for module, imported in graph.items():
        if module.startswith("unbiased"):
            assert "ray" not in external[module], module
            assert not [m for m in imported if m.split(".")[0] != "unbiased"], module
        if module.startswith("analysis"):
            assert not [m for m in imported if m.split(".")[0] in ("trainables", "sweeps")], module
            assert not {"torch", "ray"} & external[module], module
