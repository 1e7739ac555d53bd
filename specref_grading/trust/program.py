"""The kernel's program: the trusted core's kernel-side modules, as one source the jail runs with ``python -c``.

The grader is not on the kernel's filesystem, so the kernel cannot import these modules: it runs their source.
The rule: `KERNEL_MODULES`, in order, each without its ``from __future__`` line and its imports of the other
trust modules (they share the program's one namespace, so those imports name nothing new), then the jail's main.
A kernel-side module imports another's names as they are (no ``as``), and no two define the same top-level name
(tests/grading/test_trust_core.py holds both). The trusted side's policy is not in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "specref_grading.trust"
KERNEL_MODULES = ("errors", "wire", "records", "remote", "values", "kernel_policy", "calls")


def _is_dropped(stmt: ast.stmt) -> bool:
    """A ``from __future__`` import, or an import of a trust module."""
    if isinstance(stmt, ast.ImportFrom):
        return stmt.module == "__future__" or stmt.level > 0 or (stmt.module or "").startswith(PACKAGE)
    return isinstance(stmt, ast.Import) and any(a.name.startswith(PACKAGE) for a in stmt.names)


def module_source(name: str) -> str:
    """One kernel-side module's source as the program holds it."""
    text = (HERE / f"{name}.py").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for stmt in reversed(ast.parse(text).body):
        if _is_dropped(stmt):
            lines[stmt.lineno - 1:stmt.end_lineno] = []
    return "".join(lines)


def kernel_program(main: str) -> str:
    """The whole program the jailed kernel runs: the kernel-side modules, then `main` (jail.py's KERNEL)."""
    parts = ["from __future__ import annotations\n"]
    parts += [f"\n# ---- specref_grading/trust/{name}.py ----\n" + module_source(name) for name in KERNEL_MODULES]
    return "".join(parts) + "\n" + main
