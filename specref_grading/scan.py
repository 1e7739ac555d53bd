"""Read an answer cell before it runs: what in it needs an instructor's eyes.

An answer to these exercises is arithmetic on tensors, lists and numbers. Code that
reaches for the machinery around it (the interpreter, frames, files, processes, the
grader's objects, private or dunder attributes, other modules' attributes) is not needed
for that, and it is how a submission would tamper with the checks that run in the same
process. Such code is reported as "needs review" (it still runs; the instructor decides).

Using the reference implementation (specref) in an answer is reported too, per task:
an answer may use a name from the exercise's setup that comes from specref only where the
solution's own answer uses it (e.g. ``residual`` in chapter 6).
"""

from __future__ import annotations

import ast
import sys

# Modules an answer may import. Anything else (os, sys, subprocess, ctypes, gc, inspect,
# importlib, builtins, threading, signal, io, pickle, ...) is flagged.
ALLOWED_IMPORTS = {"torch", "numpy", "math", "cmath", "random", "itertools", "functools", "collections",
                   "typing", "dataclasses", "heapq", "bisect", "fractions", "statistics", "enum", "copy",
                   "decimal", "numbers", "string", "re", "time", "__future__", "abc"}
# torch/numpy parts that load or run code, write files, or change how every call behaves.
RISKY_SUBMODULES = {"utils", "hub", "jit", "ops", "multiprocessing", "distributed", "package", "library",
                    "overrides", "fx", "export", "compiler", "_dynamo", "_C", "ctypeslib", "lib", "testing",
                    "f2py", "distutils", "backends", "classes", "_inductor"}
RISKY_NAMES = {"exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "vars", "globals", "locals",
               "breakpoint", "input", "help", "exit", "quit", "memoryview", "__import__", "__builtins__",
               "get_ipython", "super_setattr",
               # attribute access by a computed name, under the names other modules re-export it by
               # (torch.autograd.profiler_util.attrgetter, torch.serialization.tarfile.bltn_open)
               "attrgetter", "methodcaller", "bltn_open"}
RISKY_ATTRS = {"load", "save", "loadtxt", "savetxt", "fromfile", "tofile", "memmap", "DataSource", "compile",
               # more ways to read a file: numpy's text and regex readers, torch's file-backed storage
               "genfromtxt", "fromregex", "from_file", "open_memmap", "recfromtxt", "recfromcsv", "read_text",
               "read_bytes", "load_state_dict_from_url",
               "gi_frame", "gi_code", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals", "f_builtins",
               "f_code", "tb_frame", "tb_next", "co_code", "mro", "register_forward_hook",
               "register_forward_pre_hook", "register_full_backward_hook", "register_hook",
               "set_default_dtype", "set_default_tensor_type", "set_grad_enabled", "manual_seed", "seed",
               "set_printoptions", "set_num_threads", "setstate", "set_rng_state", "with_traceback",
               # attribute access and eval driven by a string: string.Formatter().get_field("0.__globals__", ...);
               # typing.get_type_hints evaluates string annotations, and so does singledispatch's register()
               "get_field", "get_type_hints", "singledispatch", "singledispatchmethod",
               # writes through .data bypass a tensor's version counter, which is how the grader sees in-place edits
               "data",
               # hooks on every module at once (torch.nn.modules.module): they would rewrite the reference's outputs
               "register_module_forward_hook", "register_module_forward_pre_hook",
               "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
               "register_module_backward_hook", "register_module_module_registration_hook",
               "register_module_parameter_registration_hook", "register_module_buffer_registration_hook"}
# Modules that the allowed ones hand out as attributes (torch.sys, torch.os, torch.builtins, dataclasses.builtins,
# enum.bltns, typing.types, re.copyreg, ...): reaching one is importing it. Every standard-library module an
# answer may not import, but for the names of tensor and array methods, and a few aliases and packages.
TENSOR_METHODS = {"array", "chunk", "select", "trace"}
MODULE_ATTRS = (set(sys.stdlib_module_names) - ALLOWED_IMPORTS - TENSOR_METHODS) | {
    "bltns", "mp", "typing_extensions", "torchgen", "charset_normalizer"}
# Builtins that other modules re-export under the same name (io.open, builtins.getattr); model.eval() is honest.
RISKY_NAME_ATTRS = RISKY_NAMES - {"eval"}
# Harmless once the learner's code runs in a kernel of its own (the grading wall): they change only that kernel.
# The exercises' own cells use them (a smoke run seeds a private torch.Generator with .manual_seed).
IN_PROCESS_ONLY = {"manual_seed", "seed", "set_num_threads"}
# specref helpers an exercise hands the learner to run experiments with (random number generators, Monte Carlo
# and exact-distribution tests, toy chains): an answer may use those the exercise's own cells use.
HELPER_MODULES = ("specref.sampling", "specref.checks.rng", "specref.checks.montecarlo", "specref.checks.toy")
ALLOWED_DUNDERS = {"__init__", "__repr__", "__str__", "__name__", "__doc__", "__len__", "__iter__",
                   "__post_init__", "__future__"}


# What ast.parse raises for source it cannot read, besides SyntaxError: null bytes (ValueError), and
# expressions nested too deeply for the parser (RecursionError, MemoryError), which must not crash the grader.
UNREADABLE = (ValueError, RecursionError, MemoryError)


class Finding:
    """One reason for review: `kind` is "interference" (touches the checks) or "reference" (uses specref)."""

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


def scan(source: str, specref_names: set[str] = frozenset(), allowed_specref: set[str] = frozenset(),
         wall: bool = False) -> list[Finding]:
    """Findings in one answer cell; raises SyntaxError when it does not parse.

    specref_names: names the exercise's setup imports from specref; allowed_specref: those of
    them that the solution's answer itself uses (and the exercise's helpers, `helper_names`).
    wall: the answer runs in a kernel apart from the checks, so what changes only its own
    process (IN_PROCESS_ONLY) is not flagged.
    """
    risky_attrs = RISKY_ATTRS - IN_PROCESS_ONLY if wall else RISKY_ATTRS
    tree = ast.parse(source)
    found: list[Finding] = []

    def add(kind: str, node: ast.AST, text: str) -> None:
        line = getattr(node, "lineno", 0)
        if not any(f.text == text for f in found):
            found.append(Finding(kind, line, text))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                add("interference", node, "a relative import")
            for m in mods:
                top = m.split(".")[0]
                if top == "specref":
                    add("reference", node, f"imports {m} (the reference implementation)")
                elif top not in ALLOWED_IMPORTS:
                    add("interference", node, f"imports {m}")
                elif any(part in RISKY_SUBMODULES for part in m.split(".")[1:]):
                    add("interference", node, f"imports {m}")
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if (a.name in RISKY_SUBMODULES or a.name in risky_attrs or a.name in RISKY_NAMES or a.name == "*"
                            or a.name in MODULE_ATTRS or (a.name.startswith("_") and node.module != "__future__")):
                        add("interference", node, f"imports {a.name} from {node.module}")
        elif isinstance(node, ast.Name):
            if node.id == "specref":
                add("reference", node, "uses specref (the reference implementation)")
            elif node.id in RISKY_NAMES or (_dunder(node.id) and node.id not in ALLOWED_DUNDERS):
                add("interference", node, f"uses {node.id}")
            elif node.id in specref_names and node.id not in allowed_specref and isinstance(node.ctx, ast.Load):
                add("reference", node, f"calls {node.id} from specref (the reference implementation or the grader)")
        elif isinstance(node, ast.Attribute):
            if _dunder(node.attr) and node.attr not in ALLOWED_DUNDERS:
                add("interference", node, f"uses the attribute {node.attr}")
            elif node.attr.startswith("_") and not _dunder(node.attr):
                add("interference", node, f"uses the private attribute .{node.attr}")
            elif node.attr in risky_attrs or node.attr in RISKY_SUBMODULES or node.attr in RISKY_NAME_ATTRS:
                add("interference", node, f"uses .{node.attr}")
            elif node.attr in MODULE_ATTRS:
                add("interference", node,
                    f"uses .{node.attr} (the module {node.attr}, which an answer may not import)")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                root = _root(node)
                if not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
                    add("interference", node, f"assigns to an attribute (.{node.attr}) of an object it did not create")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _dunder(node.name) and node.name not in ALLOWED_DUNDERS:
                add("interference", node, f"defines the special method {node.name} (an object can lie in comparisons)")
        elif isinstance(node, ast.ClassDef):
            if node.bases or node.keywords:
                add("interference", node, f"defines a class {node.name} that derives from another class")
        elif isinstance(node, ast.Global):
            add("interference", node, f"declares global {', '.join(node.names)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if "specref" in v:
                add("reference", node, "names specref in a string")
            elif _dunder(v.strip()) or v.strip() in risky_attrs or v.strip() in RISKY_NAMES:
                add("interference", node, f"names {v.strip()!r} in a string")
        elif isinstance(node, ast.MatchClass):  # case C(attr=...) reads attributes by name, like C.attr
            for name in node.kwd_attrs:
                if name.startswith("_"):
                    add("interference", node, f"reads the attribute {name} in a match pattern")
                elif name in risky_attrs or name in RISKY_SUBMODULES or name in RISKY_NAME_ATTRS or name in MODULE_ATTRS:
                    add("interference", node, f"reads .{name} in a match pattern")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3:
            add("interference", node, "creates a class with type(name, bases, dict)")
    return found


def imported_specref_names(sources: list[str]) -> set[str]:
    """Names that code cells bind to something from specref (``from specref... import x``, ``import specref``)."""
    names: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
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
