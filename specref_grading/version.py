"""The grader's version key: a hash of every file whose change can change a grade.

A resumed class run (`classrun`) regrades a submission whose key changed. The key covers this package
whole (the wall, the plan, the protocol, the per-exercise checks, the exercise generator) and the specref
modules an exercise can reach: those its solution's cells import, and everything they and the checks import
in turn, read from the source with `ast` (nothing is imported to compute it).
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent


def _module_file(name: str, root: Path) -> Path | None:
    """The source file of a module of specref or of this package under `root`, by dotted name, or None."""
    top = name.split(".")[0]
    if top not in ("specref", "specref_grading"):
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(source: str, module: str, is_package: bool) -> set[str]:
    """The dotted names a module's source imports (relative imports resolved against `module`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    parts = module.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # a submodule imported by name
    return out


def reachable(sources: list[str], root: Path = ROOT) -> list[Path]:
    """The files of specref and of this package under `root` that `sources` (code cells) import, directly or in
    turn."""
    todo = [(name, None) for src in sources for name in _imports(src, "__main__", False)]
    seen: dict[Path, None] = {}
    while todo:
        name, _ = todo.pop()
        parts = name.split(".")
        for n in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            path = _module_file(".".join(parts[:n]), root)
            if path is None or path in seen:
                continue
            seen[path] = None
            mod = ".".join(parts[:n])
            todo += [(m, None) for m in _imports(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py")]
    return sorted(seen)


def _code_cells(solution: Path) -> list[str]:
    try:
        nb = json.loads(solution.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    cells = nb.get("cells", []) if isinstance(nb, dict) else []
    return ["".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))
            for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"]


def grader_files(solution: Path | None = None, root: Path = ROOT) -> list[Path]:
    """Every file the key hashes: this package, and the specref modules `solution`'s cells can reach."""
    files = set((root / PACKAGE.name).rglob("*.py"))
    if solution is not None:
        files.update(reachable(_code_cells(Path(solution)), root))
    return sorted(f for f in files if "__pycache__" not in f.parts)


def grader_version(solution: Path | None = None, root: Path = ROOT) -> str:
    """A hash of the grader's code for grading against `solution`: a run graded by another grader is regraded.

    `root` is the folder that holds specref/ and specref_grading/ (this checkout's, unless a test names another).
    """
    h = hashlib.sha256()
    for f in grader_files(solution, root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]
