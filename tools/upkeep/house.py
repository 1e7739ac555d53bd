"""The package as a house: its import graph read from the source, its wings, their floors and circles.

`import_graph(package)` reads every import statement with `ast` (imports inside functions count;
relative imports are resolved), so a lazy import cannot hide a circle or a reach upwards. A wing is
a top-level entry of the package (`specref/drafts/` is one wing, `specref/trees.py` another); a
wing's floor is its height in the graph of wings. tests/test_layering.py and walk.py read the house
through these functions.
"""

from __future__ import annotations

import ast
from pathlib import Path


def _module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path) -> dict[str, set[str]]:
    """{module: the modules of the package it imports}, from every import statement anywhere in its source."""
    modules = {_module_name(package, p): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                # `import specref.trees.x` or a name inside a module: the longest known module prefix.
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def wing_of(module: str) -> str:
    """The top-level entry a module is in: specref.drafts.model -> drafts, specref.trees -> trees, specref -> __init__."""
    return (module.split(".") + ["__init__"])[1]


def wing_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """{wing: the other wings it imports}, from a module graph."""
    wings: dict[str, set[str]] = {}
    for m, targets in graph.items():
        wings.setdefault(wing_of(m), set()).update(wing_of(t) for t in targets if wing_of(t) != wing_of(m))
    return wings


def cycles_in(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk of `graph` meets, as 'a -> b -> a'."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def heights(graph: dict[str, set[str]]) -> dict[str, int]:
    """{node: floor}: 0 for a node that imports nothing, else 1 + the highest it imports.

    An import that closes a circle is left out (`cycles_in` reports it), so a house with a circle
    still gets floors.
    """
    floors: dict[str, int] = {}

    def floor(r: str, seen: tuple[str, ...]) -> int:
        if r in seen:
            return -1
        if r not in floors:
            floors[r] = 1 + max((floor(o, seen + (r,)) for o in sorted(graph.get(r, ()))), default=-1)
        return floors[r]

    for r in sorted(graph):
        floor(r, ())
    return floors
