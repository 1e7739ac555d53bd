"""The specref a learner's jailed kernel sees: an allow-list copy of the package, made per exercise.

The rule, at module granularity. The copy holds the modules the exercise's own kernel code imports from specref
(its setup and given cells, read statically with `ast`: `roots_for`), their import-time closure and specref's
package ``__init__``s, and nothing else of specref. Of that set the copy leaves out, to a fixpoint:

* every forbidden module (``FORBIDDEN`` of the exercise's check modules: each reference answer is a module of its
  own, and FORBIDDEN names modules only) and the grader (``specref_grading``, always);
* every module whose import-time imports need something left out (a ``from pkg import Name`` followed through
  the package's ``_LAZY`` map).

Each module in the copy is the package's own file, byte for byte: nothing is cut out of a module. A package's lazy
name map (PEP 562) may name a module the copy lacks; `specref._lazy` answers AttributeError for that name, so
``from specref import verify_chain`` raises ImportError where ``specref.chain_verify`` is absent and ``hasattr``
answers False. Imports inside functions are not import-time, and a module reached only through one is not in the
copy: what the exercise's kernel code does not import, the learner does not get.

`Selection.available` tells the plan which names the kernel can import; what the setup imports that the copy
lacks is served from the trusted process only when the exercise's check modules list it in ``ALLOWED``
(`servable`), and a given cell after an answer that uses what is neither there nor served is a "demo", not run
in grading (`prepare`). Authoring errors are refused (`AuthoringError`): a FORBIDDEN entry that is not a module of
specref, a FORBIDDEN or ALLOWED that is not a literal tuple of strings, a setup cell whose own statements use a
name the copy lacks and the exercise does not serve. The jail (specref_grading/jail.py) binds the copy read-only
at the real package's path.
"""

from __future__ import annotations

import ast
import compileall
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from specref_grading.scan import nodes_of

GRADER = Path(__file__).resolve().parents[1]  # the specref_grading folder
ALWAYS_FORBIDDEN = ("specref_grading",)
TOP_LEVELS = ("specref", "specref_grading")
LAZY_MAP = "_LAZY"  # the name -> module dict literal of a package's __init__


class AuthoringError(ValueError):
    """An exercise or check module asks for what the kernel's copy cannot be: the message says what to change."""


def specref_dir() -> Path:
    """The real specref package's folder (found without importing it)."""
    spec = importlib.util.find_spec("specref")
    if spec is None or not spec.origin:
        raise RuntimeError("specref is not importable")
    return Path(os.path.realpath(spec.origin)).parent


# -- what an exercise forbids and gives ----------------------------------------------------------------------------


def _constant(path: Path, name: str) -> tuple[str, ...]:
    """A module-level constant of a check module (FORBIDDEN, ALLOWED): a literal tuple of strings, read with
    `ast.literal_eval`, the module never run; () when the module has none."""
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                value = None
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise AuthoringError(f"{path.name}: {name} must be a literal tuple of strings (the grader reads it "
                                     "without running the module)")
            return value
    return ()


def check_modules(sources: list[str]) -> list[str]:
    """The specref_grading.checks modules the given code imports (dotted names)."""
    found: list[str] = []
    for node in nodes_of(sources):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        if isinstance(node, ast.ImportFrom) and node.module == "specref_grading.checks":
            names = [f"specref_grading.checks.{a.name}" for a in node.names]
        for n in names:
            if n.startswith("specref_grading.checks.") and n not in found:
                found.append(n)
    return found


def _union(sources: list[str], name: str, start: tuple[str, ...] = ()) -> tuple[str, ...]:
    out = set(start)
    for mod in check_modules(sources):
        path = GRADER.parent.joinpath(*mod.split(".")).with_suffix(".py")
        if path.is_file():
            out.update(_constant(path, name))
    return tuple(sorted(out))


def forbidden_for(sources: list[str]) -> tuple[str, ...]:
    """An exercise's forbidden set: the union of FORBIDDEN of the check modules its code imports, and the grader."""
    return _union(sources, "FORBIDDEN", ALWAYS_FORBIDDEN)


def allowed_for(sources: list[str]) -> tuple[str, ...]:
    """What an exercise gives on purpose (dotted names): the union of ALLOWED of the check modules its code imports.
    Of what the kernel's copy lacks, only these are served to the kernel (`servable`)."""
    return _union(sources, "ALLOWED")


# -- the static reading of specref ---------------------------------------------------------------------------------


class _Module:
    """One module of the package: its file, and its syntax tree and lazy map, read on first use."""

    def __init__(self, name: str, path: Path, is_pkg: bool):
        self.name, self.path, self.is_pkg = name, path, is_pkg
        self.deps: list[str | tuple[str, str]] | None = None  # its import-time dependencies (Reading.dependencies)
        self._tree: ast.Module | None = None
        self._lazy: dict[str, str] | None = None

    @property
    def tree(self) -> ast.Module:
        if self._tree is None:
            self._tree = ast.parse(self.path.read_text(encoding="utf-8"), str(self.path))
        return self._tree

    @property
    def lazy(self) -> dict[str, str]:
        """A package's ``_LAZY`` map (name -> the module that defines it); empty for a module."""
        if self._lazy is None:
            self._lazy = {}
            for node in self.tree.body if self.is_pkg else ():
                target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
                    node.target if isinstance(node, ast.AnnAssign) else None)
                if isinstance(target, ast.Name) and target.id == LAZY_MAP and isinstance(node.value, ast.Dict):
                    self._lazy = dict(ast.literal_eval(node.value))
        return self._lazy


def _bound(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    out: set[str] = set()
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) else []
    for t in targets:
        out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _loaded(stmt: ast.stmt) -> set[str]:
    """Every name a statement reads, its function bodies included."""
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _import_time(node: ast.AST):
    """The nodes Python runs when the module is imported: not function bodies, not `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in getattr(child, "decorator_list", []):
                yield d
                yield from _import_time(d)
            continue
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            continue
        yield child
        yield from _import_time(child)


def _with_parents(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


class Reading:
    """specref read from its source: its modules (found by their files), their lazy maps and import-time
    dependencies, each module parsed only when a selection first reaches it."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, _Module] = {}
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_pkg else parts)
            self.modules[name] = _Module(name, path, is_pkg)

    def resolve(self, mod: _Module, node: ast.ImportFrom) -> str:
        """The absolute module a `from ... import` of `mod` names."""
        if node.level == 0:
            return node.module or ""
        base = mod.name if mod.is_pkg else mod.name.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{node.module}" if node.module else base

    def symbol_of(self, module: str, name: str) -> tuple[str, str] | str:
        """What `from module import name` needs: a submodule (str) or a (module, name) symbol, through lazy maps."""
        if f"{module}.{name}" in self.modules:
            return f"{module}.{name}"
        seen = set()
        while module in self.modules and name in self.modules[module].lazy and (module, name) not in seen:
            seen.add((module, name))
            module = self.modules[module].lazy[name]
        return (module, name)

    def origin(self, module: str, name: str) -> tuple[str, str]:
        """Where `from module import name` finds the object first defined: (module, name), through re-exports."""
        seen: set[tuple[str, str]] = set()
        while (module, name) not in seen:
            seen.add((module, name))
            dep = self.symbol_of(module, name)
            if isinstance(dep, str):
                return module, name
            module, name = dep
            mod = self.modules.get(module)
            node = next((n for n in mod.tree.body if isinstance(n, ast.ImportFrom) and any(
                (a.asname or a.name) == name for a in n.names)), None) if mod is not None else None
            if node is None:
                break
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            module, name = self.resolve(mod, node), alias.name
        return module, name

    def dependencies(self, mod: _Module) -> list[str | tuple[str, str]]:
        """The specref modules and (module, name) symbols `mod` needs when it is imported (read once)."""
        if mod.deps is None:
            out: list[str | tuple[str, str]] = []
            for node in _import_time(mod.tree):
                if isinstance(node, ast.Import):
                    out += [p for a in node.names if a.name.split(".")[0] in TOP_LEVELS
                            for p in _with_parents(a.name)]
                elif isinstance(node, ast.ImportFrom):
                    source = self.resolve(mod, node)
                    if source.split(".")[0] in TOP_LEVELS:
                        out += _with_parents(source)
                        out += [self.symbol_of(source, a.name) for a in node.names if a.name != "*"]
            mod.deps = [d for d in out if d != mod.name]
        return mod.deps

    def available(self, forbidden: tuple[str, ...], dotted: str) -> bool:
        """Whether any exercise's copy under `forbidden` can hold `dotted` (module.name, or a module): whether
        the copy would hold it were it imported by the exercise's kernel code."""
        module, _, name = dotted.rpartition(".")
        source = f"import {dotted}" if dotted in self.modules else f"from {module} import {name}"
        return select(self, roots_for(self, [source]), forbidden).available(dotted)


def roots_for(reading: Reading, sources: list[str]) -> tuple[str, ...]:
    """The specref modules the given code imports (anywhere in it): each module named, and for each name imported
    from one, the module that holds it and the module where it is first defined (ex06's Tree, imported from
    specref.trees, defined in specref.tree_shapes)."""
    out: set[str] = set()
    for node in nodes_of(sources):
        if isinstance(node, ast.Import):
            out.update(p for a in node.names if a.name.split(".")[0] == "specref" for p in _with_parents(a.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] == "specref":
            out.update(_with_parents(node.module))
            for a in node.names:
                if a.name == "*":
                    continue
                dep = reading.symbol_of(node.module, a.name)
                out.add(dep if isinstance(dep, str) else dep[0])
                out.add(reading.origin(node.module, a.name)[0])
    return tuple(sorted(m for m in out if m in reading.modules))


# -- what one exercise's copy holds ----------------------------------------------------------------------------


def _matches(dotted: str, forbidden: tuple[str, ...]) -> bool:
    return any(dotted == f or dotted.startswith(f + ".") for f in forbidden)


@dataclass
class Selection:
    """The kernel's copy for one exercise: the modules it holds (`kept`), each whole."""
    reading: Reading
    forbidden: tuple[str, ...]
    kept: set[str]

    def available(self, dotted: str) -> bool:
        """Whether `from module import name` (dotted: module.name) or `import module` works in the copy."""
        if dotted in self.reading.modules:
            return dotted in self.kept
        module, _, name = dotted.rpartition(".")
        dep = self.reading.symbol_of(module, name)
        return (dep if isinstance(dep, str) else dep[0]) in self.kept


def select(reading: Reading, roots: tuple[str, ...] | list[str], forbidden: tuple[str, ...]) -> Selection:
    """The copy for an exercise whose kernel code imports `roots`, under its forbidden set (module docstring);
    AuthoringError when a forbidden entry under the package is not one of its modules."""
    forbidden = tuple(sorted(set(forbidden) | set(ALWAYS_FORBIDDEN)))
    top = reading.root.name
    named = [f for f in forbidden if f.split(".")[0] == top and f not in reading.modules]
    if named:
        raise AuthoringError(f"FORBIDDEN names modules only, and {', '.join(named)} is not a module of {top}: keep "
                             "each reference answer in a module of its own and forbid that module")
    wanted = list(roots) + [n for n, m in reading.modules.items() if m.is_pkg]
    kept: set[str] = set()
    while wanted:  # the import-time closure
        name = wanted.pop()
        if name in kept or name not in reading.modules:
            continue
        kept.add(name)
        wanted += [d if isinstance(d, str) else d[0] for d in reading.dependencies(reading.modules[name])]
    kept = {n for n in kept if not _matches(n, forbidden)}
    changed = True
    while changed:  # what needs what is gone at import time goes too
        changed = False
        for name in sorted(kept):
            if any((d if isinstance(d, str) else d[0]) not in kept for d in reading.dependencies(reading.modules[name])):
                kept.discard(name)
                changed = True
    return Selection(reading, forbidden, kept)


# -- writing the copy --------------------------------------------------------------------------------------------


def write_tree(selection: Selection, dest: Path) -> None:
    """Write the kernel's copy of the package into `dest` (a folder named like the package): the kept modules, each
    the package's own file, and every file that is not Python (the bundled models and data) under a kept package."""
    reading = selection.reading
    root = reading.root
    by_path = {m.path: m for m in reading.modules.values()}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        package = by_path.get(here / "__init__.py")
        if package is not None and package.name not in selection.kept:  # a package the copy leaves out
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        out = dest / here.relative_to(root)
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o755)
        for fn in sorted(filenames):
            src, mod = here / fn, by_path.get(here / fn)
            if fn.endswith((".pyc", ".pyo")) or mod is not None and mod.name not in selection.kept:
                continue
            shutil.copy2(src, out / fn)  # copied with its time, never linked: the copy's modes are its own
            if mod is not None:
                _copy_compiled(src, out / fn)
            os.chmod(out / fn, 0o644)
    # Compiled here, named as the jail will see them (the copy is read-only there: nothing could be cached). A
    # module keeps the package's own compiled file where that is up to date for its source (compileall reads the
    # source's time and size in its header, and compiles again otherwise).
    compileall.compile_dir(str(dest), ddir=str(root), quiet=2, workers=1)
    for path in dest.rglob("__pycache__"):
        os.chmod(path, 0o755)
        for pyc in path.iterdir():
            os.chmod(pyc, 0o644)


def _copy_compiled(src: Path, dst: Path) -> None:
    cached = Path(importlib.util.cache_from_source(str(src)))
    if cached.is_file():
        target = Path(importlib.util.cache_from_source(str(dst)))
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(cached, target)


_SHARED: dict[str, tuple[tuple, Reading]] = {}  # root -> (the stat of its files, its Reading)


def _signature(root: Path) -> tuple:
    """The names, sizes and times of the files under `root`: a stat of each, no read."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            try:
                st = os.stat(os.path.join(dirpath, fn))
            except OSError:
                continue
            out.append((dirpath, fn, st.st_size, st.st_mtime_ns))
    return tuple(out)


def shared_reading(root: Path | None = None) -> Reading:
    """One `Reading` of `root` (default: the real specref) per process, read again only when a file under it
    changes (its size or time): the plan and every kernel of a grading share it, each module parsed once."""
    root = root or specref_dir()
    sig = _signature(root)
    got = _SHARED.get(str(root))
    if got is None or got[0] != sig:
        got = _SHARED[str(root)] = (sig, Reading(root))
    return got[1]


def build(forbidden: tuple[str, ...], roots: tuple[str, ...] | list[str], into: Path,
          root: Path | None = None) -> Path:
    """Write the kernel's specref for an exercise (its kernel code's `roots`, its `forbidden` set) under `into`
    (a folder of the grading run, removed with it); the copied package folder."""
    root = root or specref_dir()
    selection = select(shared_reading(root), roots, forbidden)
    dest = into / root.name
    write_tree(selection, dest)
    os.chmod(into, 0o755)
    return dest


# -- the setup the kernel runs -------------------------------------------------------------------------------------


def servable(dotted: list[str], allowed: tuple[str, ...]) -> bool:
    """Whether a name the kernel's copy lacks may be served to the kernel: only when the exercise gives it on
    purpose (its check modules' ALLOWED lists it, by where it is imported from or where it is defined). What the
    copy lacks is forbidden (the answer key, the grader) or needs what is: never served otherwise."""
    return any(d in allowed for d in dotted)


def kernel_setup(selection: Selection, source: str, needed: set[str],
                 allowed: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """(the setup cell as the kernel runs it, the names the trusted process serves it).

    An import of a name the kernel's copy lacks is taken out; the name is imported from where it is defined
    when that module is there (ex06's Tree, from specref.tree_shapes), else served when kernel code uses it
    (`needed`) and the exercise gives it on purpose (`allowed`: `servable`), else dropped (ex06's
    tree_attention_mask, the reference of its Task 6.1).
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    served: list[str] = []
    edits: list[tuple[int, int, str]] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.ImportFrom) or stmt.level or not stmt.module or \
                stmt.module.split(".")[0] not in TOP_LEVELS:
            continue
        keep, moved = [], []
        for a in stmt.names:
            if a.name == "*" or selection.available(f"{stmt.module}.{a.name}"):
                keep.append(a)
                continue
            module, name = selection.reading.origin(stmt.module, a.name)
            if selection.available(f"{module}.{name}"):
                moved.append((module, ast.alias(name, a.asname or (a.name if a.name != name else None))))
            elif (a.asname or a.name) in needed and servable([f"{stmt.module}.{a.name}", f"{module}.{name}"],
                                                             allowed):
                served.append(a.asname or a.name)
        if len(keep) == len(stmt.names):
            continue
        text = [ast.unparse(ast.ImportFrom(stmt.module, keep, 0))] if keep else []
        text += [ast.unparse(ast.ImportFrom(m, [al], 0)) for m, al in moved]
        edits.append((stmt.lineno, stmt.end_lineno, "".join(t + "\n" for t in text)))
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1:last] = [text] if text else []
    return "".join(lines), served


def _imported(body: list[ast.stmt]) -> dict[str, list[str]]:
    """{name a top-level import binds: the dotted names it is imported as}."""
    out: dict[str, list[str]] = {}
    for stmt in body:
        if isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
            for a in stmt.names:
                if a.name != "*":
                    out.setdefault(a.asname or a.name, []).append(f"{stmt.module}.{a.name}")
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                out.setdefault(a.asname or a.name.split(".")[0], []).append(a.asname and a.name or
                                                                            a.name.split(".")[0])
    return out


def _parse(source: str) -> list[ast.stmt]:
    try:
        return ast.parse(source).body
    except (SyntaxError, ValueError):
        return []


def _needs_absent(selection: Selection, body: list[ast.stmt], absent: set[str]) -> list[str]:
    """What of the kernel's absent names (`absent`, or an import of specref or the grader its copy lacks) a given
    cell uses."""
    out = set()
    for stmt in body:
        out |= _loaded(stmt) & absent
        for node in ast.walk(stmt):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".")[0] in TOP_LEVELS:
                out |= {f"{node.module}.{a.name}" for a in node.names
                        if not selection.available(f"{node.module}.{a.name}" if a.name != "*" else node.module)}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] in TOP_LEVELS
                        and not selection.available(a.name)}
    return sorted(out)


def prepare(cells: list[dict], needed: set[str], reading: Reading | None = None,
            defined: set[str] = frozenset()) -> tuple[str, ...]:
    """Mark a plan's cells for the wall (in place) and return the exercise's forbidden set.

    A "checks" cell (the checks' imports: ``metadata.specref.side == "checks"``) runs only in the trusted
    process; its names that kernel code uses (`needed`) and the exercise gives on purpose (`allowed_for`: its
    check modules' ALLOWED) are served to the kernel ("serve"). A setup cell gets "kernel_source" (`kernel_setup`)
    and "serve". Both get "forbidden" (the exercise's forbidden set) and "roots" (what the exercise's kernel code
    imports: `roots_for`), from which the wall builds the copy (`build`). A given cell after an answer ("other")
    that uses a name the kernel lacks and is not served (a demo comparing the learner's result with the
    reference, as in ex06) would fail there: it becomes "demo", with "absent" (what it uses), and is not run in
    grading; names the exercise's own answers define (`defined`) do not count. A setup cell whose own statements
    use a name the kernel lacks and is not served would fail in every grading: AuthoringError.
    """
    reading = reading or shared_reading()
    sources = [c["source"] for c in cells if c.get("role") in ("checks", "setup")]
    forbidden, allowed = forbidden_for(sources), allowed_for(sources)
    roots = roots_for(reading, [c["source"] for c in cells if c.get("role") in ("setup", "other")])
    selection = select(reading, roots, forbidden)
    absent: set[str] = set()  # what the setup and checks cells bind in the trusted process but not in the kernel
    for c in cells:
        if c.get("role") == "checks":
            body = _parse(c["source"])
            imported = _imported(body)
            c["serve"] = sorted(n for n in {n for s in body for n in _bound(s)} & needed
                                if servable(imported.get(n, []), allowed))
            absent |= {n for s in body for n in _bound(s)} - set(c["serve"])
        elif c.get("role") == "setup":
            try:
                c["kernel_source"], c["serve"] = kernel_setup(selection, c["source"], needed, allowed)
            except SyntaxError:
                c["serve"] = []
            body = _parse(c.get("kernel_source", c["source"]))
            dropped = set(_imported(_parse(c["source"]))) - {n for s in body for n in _bound(s)} - set(c["serve"])
            used = {n for s in body if not isinstance(s, (ast.Import, ast.ImportFrom)) for n in _loaded(s)} & dropped
            if used:
                raise AuthoringError(
                    f"cell {c['n']}: the setup uses {', '.join(sorted(used))}, which the exercise's kernel lacks (a "
                    "forbidden module, or one that needs a forbidden module at import time) and its check modules' "
                    "ALLOWED does not give: use it after the answers (a demo), or give it in ALLOWED if it is no "
                    "answer key")
            absent |= dropped
        else:
            continue
        c["forbidden"], c["roots"] = list(forbidden), list(roots)
    absent -= set(defined)
    for c in cells:
        if c.get("role") == "other":
            uses = _needs_absent(selection, _parse(c["source"]), absent)
            if uses:
                c["role"], c["absent"] = "demo", uses
    return forbidden
