"""Read an answer cell before it runs: notes for the instructor, never a gate on points.

The answers run in a jailed kernel of their own, apart from the tests (the wall: specref_grading/trust/wall.py), so
nothing an answer does there can change a grade: a read-only ``.data``, a ``global`` counter, a class that
derives from ``typing.NamedTuple`` or ``object``, the word "specref" in a docstring change only the learner's
own kernel. What this module finds is therefore written into the report's notes, for the instructor's eyes
("answer cell 'x', line 3: uses getattr"); it never withholds a point and never makes a grading "needs review"
(that exit status is left to what the trusted side sees, e.g. a function that modified its inputs).

It notes what an answer to these exercises (arithmetic on tensors, lists and numbers) has no need of: code run
from a string, the interpreter's frames and special attributes, files, modules outside the usual numeric ones,
hooks on every module at once, and uses of the reference implementation (specref) beyond the names the
exercise hands out (the kernel holds no reference implementation to call: another layer makes that impossible,
so such a note says only what the answer tried).

The rest of the module reads which names a cell binds and uses (`names_bound`, `names_used`, `binds_unknown`):
the plan follows them to know which answers each test depends on.
"""

from __future__ import annotations

import ast

# Modules an answer may import without a note; anything else (os, sys, subprocess, inspect, ...) is noted.
ALLOWED_IMPORTS = {"torch", "numpy", "math", "cmath", "random", "itertools", "functools", "collections",
                   "typing", "dataclasses", "heapq", "bisect", "fractions", "statistics", "enum", "copy",
                   "decimal", "numbers", "string", "re", "time", "__future__", "abc"}
# torch/numpy parts that load or run code, or change how every call behaves.
RISKY_SUBMODULES = {"utils", "hub", "jit", "multiprocessing", "distributed", "package", "library", "overrides",
                    "_C", "ctypeslib", "_dynamo", "_inductor"}
# Builtins that run code from a string, reach namespaces or attributes by a computed name, or read files.
RISKY_NAMES = {"exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "vars", "globals", "locals",
               "breakpoint", "__import__", "__builtins__", "get_ipython"}
# Attributes that walk frames or tracebacks, read files, or hook every module at once.
RISKY_ATTRS = {"gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals", "f_builtins", "tb_frame",
               "load", "fromfile", "genfromtxt", "fromregex", "from_file", "memmap", "read_text", "read_bytes",
               "register_module_forward_hook", "register_module_forward_pre_hook",
               "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
               "register_module_backward_hook"}
# specref helpers an exercise hands the learner to run experiments with (random number generators, Monte Carlo
# and exact-distribution tests, toy chains): an answer may use those the exercise's own cells use.
HELPER_MODULES = ("specref.sampling", "specref.checks.rng", "specref.checks.montecarlo", "specref.checks.toy")
ALLOWED_DUNDERS = {"__init__", "__repr__", "__str__", "__name__", "__doc__", "__len__", "__iter__",
                   "__post_init__", "__future__", "__getitem__", "__call__", "__eq__", "__hash__", "__lt__",
                   "__contains__", "__next__", "__enter__", "__exit__", "__class__"}


# What ast.parse raises for source it cannot read, besides SyntaxError: null bytes (ValueError), and
# expressions nested too deeply for the parser (RecursionError, MemoryError), which must not crash the grader.
UNREADABLE = (ValueError, RecursionError, MemoryError)


class Finding:
    """One note: `kind` is "interference" (reaches the machinery around the answer) or "reference" (uses specref)."""

    def __init__(self, kind: str, line: int, text: str):
        self.kind, self.line, self.text = kind, line, text

    def __repr__(self) -> str:
        return f"Finding({self.kind!r}, {self.line}, {self.text!r})"


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def scan(source: str, specref_names: set[str] = frozenset(), allowed_specref: set[str] = frozenset()) -> list[Finding]:
    """Notes on one answer cell; raises SyntaxError when it does not parse.

    specref_names: names the exercise's setup imports from specref; allowed_specref: those of
    them that the solution's answer itself uses (and the exercise's helpers, `helper_names`).
    """
    tree = ast.parse(source)
    found: list[Finding] = []

    def add(kind: str, node: ast.AST, text: str) -> None:
        if not any(f.text == text for f in found):
            found.append(Finding(kind, getattr(node, "lineno", 0), text))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                top = m.split(".")[0]
                if top == "specref":
                    add("reference", node, f"imports {m} (the reference implementation)")
                elif top not in ALLOWED_IMPORTS or any(part in RISKY_SUBMODULES for part in m.split(".")[1:]):
                    add("interference", node, f"imports {m}")
        elif isinstance(node, ast.Name):
            if node.id == "specref":
                add("reference", node, "uses specref (the reference implementation)")
            elif node.id in RISKY_NAMES or (_dunder(node.id) and node.id not in ALLOWED_DUNDERS):
                add("interference", node, f"uses {node.id}")
            elif node.id in specref_names and node.id not in allowed_specref and isinstance(node.ctx, ast.Load):
                add("reference", node, f"calls {node.id} from specref (the reference implementation)")
        elif isinstance(node, ast.Attribute):
            if _dunder(node.attr) and node.attr not in ALLOWED_DUNDERS:
                add("interference", node, f"uses the attribute {node.attr}")
            elif node.attr in RISKY_ATTRS or node.attr in RISKY_SUBMODULES:
                add("interference", node, f"uses .{node.attr}")
    return found


def nodes_of(sources: list[str]):
    """Every AST node of each source that parses (a cell that does not is skipped: it binds and imports nothing)."""
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        yield from ast.walk(tree)


def imported_specref_names(sources: list[str]) -> set[str]:
    """Names that code cells bind to something from specref (``from specref... import x``, ``import specref``)."""
    names: set[str] = set()
    for node in nodes_of(sources):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "specref":
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "specref"}
    return names


def helper_names(sources: list[str]) -> set[str]:
    """Names the cells import from specref's helper modules (HELPER_MODULES): allowed in answers."""
    names: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except (SyntaxError, *UNREADABLE):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "") in HELPER_MODULES:
                names |= {a.asname or a.name for a in node.names}
    return names


def names_used(source: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except (SyntaxError, *UNREADABLE):
        return set()


def _module_scope(node: ast.AST):
    """The nodes of `node` that run in the cell's own (module) scope, at any depth of if/try/with/for/while/match:
    not the bodies of functions, classes, lambdas and comprehensions, but their decorators, defaults and bases."""
    for child in ast.iter_child_nodes(node):
        yield child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = child.args
            parts = [*getattr(child, "decorator_list", []), *a.defaults, *[d for d in a.kw_defaults if d]]
        elif isinstance(child, ast.ClassDef):
            parts = [*child.decorator_list, *child.bases, *[k.value for k in child.keywords]]
        elif isinstance(child, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            parts = [child.generators[0].iter]
        else:
            yield from _module_scope(child)
            continue
        for part in parts:
            yield part
            yield from _module_scope(part)


def names_bound(source: str) -> set[str]:
    """Every name a cell binds in its own scope, at any depth of its blocks: functions, classes, imports,
    assignment, for, with and except targets, match captures, del; walrus targets and `global` names anywhere.

    Names bound by means no reading of the source settles (exec, globals(), ...) are `binds_unknown`'s.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, *UNREADABLE):
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):  # these reach the cell's scope from inside a function or a comprehension too
        if isinstance(node, ast.Global):
            out.update(node.names)
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    for node in _module_scope(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.add(node.rest)
    return out


# What binds names that no reading of the source settles: code run from a string, the namespaces written
# as dicts, attributes set by a computed name, modules that hand out the interpreter's own tables.
DYNAMIC_NAMES = {"exec", "eval", "compile", "globals", "vars", "locals", "setattr", "delattr", "__import__",
                 "__builtins__", "get_ipython", "__dict__", "__main__"}
DYNAMIC_ATTRS = {"__dict__", "__builtins__", "__globals__", "__setattr__", "__delattr__", "modules", "f_globals",
                 "f_locals", "f_builtins", "setattr", "__import__"}


def binds_unknown(source: str) -> bool:
    """Whether a cell may bind names that `names_bound` cannot see: exec/eval, globals()/vars()/locals(),
    setattr or an attribute store on an object it did not create (a module), sys.modules, ``__dict__``,
    ``__builtins__``, a star import, an import of a module an answer may not import. A cell that does not
    parse binds nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, *UNREADABLE):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in DYNAMIC_NAMES:
            return True
        if isinstance(node, ast.Attribute):
            if node.attr in DYNAMIC_ATTRS:
                return True
            root = _root(node)
            if isinstance(node.ctx, (ast.Store, ast.Del)) and not (isinstance(root, ast.Name)
                                                                   and root.id in ("self", "cls")):
                return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in (
                DYNAMIC_NAMES | DYNAMIC_ATTRS):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] not in ALLOWED_IMPORTS | {"specref"} for m in mods):
                return True
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return True
    return False
