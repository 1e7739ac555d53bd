"""The specref a learner's jailed kernel sees: a copy of the package that holds no answer key of the exercise.

An exercise forbids some of specref (each check module's ``FORBIDDEN``: the reference answers) and always
the grader itself (``specref_grading``). Importing a module of specref hands out its whole namespace, and
from there every other module's, so a deny-list inside the kernel leaks; instead the kernel gets a copy of
specref (`build`) from which, read statically with `ast`,

* every forbidden module is absent (a forbidden package: all of it);
* a forbidden name inside an otherwise allowed module (``specref.perf.costs.forward_flops``) is cut out of
  the copy's source (its top-level def, class or assignment), and so is every other top-level statement of
  that module that names it (a helper calling the answer would only fail later, with a NameError);
* every module whose import-time imports need something removed is absent too, to a fixpoint. A
  ``from pkg import Name`` is followed through the package's lazy map (``_LAZY`` in specref's
  ``__init__``s, PEP 562), and those maps and ``__all__`` in the copy lose the names that are gone, so
  ``from specref import verify_chain`` raises ImportError and ``hasattr`` answers False. Imports inside
  functions are not import-time: ``load_draft("model")`` works in a kernel without prompt lookup.

`available` tells the plan which names the kernel can import. What the setup (or the checks cell) gives the
learner that the copy lacks is served from the trusted process only when the exercise's check modules list it in
their ``ALLOWED`` (ex04's sampling_power, given on purpose, whose module needs what ex04 forbids); anything else the copy
lacks is the answer key or needs it (ex06's tree_attention_mask, ex03's toy_reference) and is never served, and
the exercise's given cells after an answer that use it (demos comparing with the reference) are marked "demo"
and not run in grading (`prepare`). Built trees are cached per (specref's sources,
forbidden set) under ``$XDG_CACHE_HOME/specref-grading`` (or ``~/.cache/specref-grading``, mode 0700),
built in a temporary folder and renamed into place, so two grading workers may build at once. Building one
removes the trees of other keys unused for a day (`sweep`).
The jail (specref_grading/jail.py) binds the tree read-only at the real package's path.
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from specref_grading.scan import nodes_of

HERE = Path(__file__).resolve().parent
ALWAYS_FORBIDDEN = ("specref_grading",)
LAZY_MAPS = ("_LAZY",)  # the name -> module dict literal of a package's __init__
SUBPACKAGE_LISTS = ("_SUBPACKAGES",)  # a tuple literal of subpackage names a package's __getattr__ imports


def specref_dir() -> Path:
    """The real specref package's folder (found without importing it)."""
    spec = importlib.util.find_spec("specref")
    if spec is None or not spec.origin:
        raise RuntimeError("specref is not importable")
    return Path(os.path.realpath(spec.origin)).parent


# -- what an exercise forbids -----------------------------------------------------------------------------------


def _strings(node: ast.expr) -> tuple[str, ...]:
    """A tuple of strings written as a literal, or as ``tuple(f"prefix.{n}" for n in (literal, ...))`` (how the
    check modules write ALLOWED), or a sum of those; ValueError for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.left) + _strings(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("tuple", "list") and \
            len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp)):
        gen = node.args[0]
        comp = gen.generators[0] if len(gen.generators) == 1 else None
        if comp is None or comp.ifs or comp.is_async or not isinstance(comp.target, ast.Name) or \
                not isinstance(gen.elt, ast.JoinedStr):
            raise ValueError("not a tuple of strings")
        out = []
        for value in ast.literal_eval(comp.iter):
            text = ""
            for part in gen.elt.values:
                if isinstance(part, ast.Constant):
                    text += str(part.value)
                elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and \
                        part.value.id == comp.target.id and part.conversion == -1 and part.format_spec is None:
                    text += str(value)
                else:
                    raise ValueError("not a tuple of strings")
            out.append(text)
        return tuple(out)
    return tuple(str(v) for v in ast.literal_eval(node))


def _literal(path: Path, name: str) -> tuple[str, ...]:
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return _strings(node.value)
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
    out = list(start)
    for mod in check_modules(sources):
        path = HERE.parent.joinpath(*mod.split(".")).with_suffix(".py")
        if path.is_file():
            for item in _literal(path, name):
                if item not in out:
                    out.append(item)
    return tuple(sorted(out))


def forbidden_for(sources: list[str]) -> tuple[str, ...]:
    """An exercise's forbidden set: the union of FORBIDDEN of the check modules its code imports, and the grader."""
    return _union(sources, "FORBIDDEN", ALWAYS_FORBIDDEN)


def allowed_for(sources: list[str]) -> tuple[str, ...]:
    """What an exercise gives on purpose (dotted names): the union of ALLOWED of the check modules its code imports.
    Of what the kernel's copy lacks, only these are served to the kernel (`kernel_setup`, `prepare`)."""
    return _union(sources, "ALLOWED")


# -- the static reading of specref ---------------------------------------------------------------------------------


@dataclass
class _Module:
    name: str
    path: Path
    is_pkg: bool
    tree: ast.Module
    lazy: dict[str, str] = field(default_factory=dict)


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


class Reading:
    """specref read from its source: modules, their import-time dependencies, and what a forbidden set removes."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, _Module] = {}
        self._removals: dict[tuple[str, ...], tuple[set[str], dict[str, set[str]]]] = {}
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root.parent).with_suffix("")
            parts = list(rel.parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join(parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            mod = _Module(name, path, is_pkg, tree)
            for node in tree.body:
                target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
                    node.target if isinstance(node, ast.AnnAssign) else None)
                if isinstance(target, ast.Name) and target.id in LAZY_MAPS and isinstance(node.value, ast.Dict):
                    mod.lazy = {k: v for k, v in ast.literal_eval(node.value).items()}
            self.modules[name] = mod

    def _resolve(self, mod: _Module, node: ast.ImportFrom) -> str:
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

    def dependencies(self, mod: _Module) -> list[str | tuple[str, str]]:
        """The specref modules and (module, name) symbols `mod` needs when it is imported."""
        out: list[str | tuple[str, str]] = []

        def with_parents(dotted: str) -> None:
            parts = dotted.split(".")
            for i in range(1, len(parts) + 1):
                out.append(".".join(parts[:i]))

        for node in _import_time(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ("specref", "specref_grading"):
                        with_parents(a.name)
            elif isinstance(node, ast.ImportFrom):
                source = self._resolve(mod, node)
                if source.split(".")[0] not in ("specref", "specref_grading"):
                    continue
                with_parents(source)
                for a in node.names:
                    if a.name != "*":
                        out.append(self.symbol_of(source, a.name))
        return [d for d in out if d != mod.name]

    def removal(self, forbidden: tuple[str, ...]) -> tuple[set[str], dict[str, set[str]]]:
        """(modules absent from the kernel's copy, {module: names cut from it}) for a forbidden set."""
        forbidden = tuple(sorted(set(forbidden)))
        if forbidden not in self._removals:
            self._removals[forbidden] = self._removal(forbidden)
        return self._removals[forbidden]

    def _removal(self, forbidden: tuple[str, ...]) -> tuple[set[str], dict[str, set[str]]]:
        gone: set[str] = set()
        cut: dict[str, set[str]] = {}

        def matches(dotted: str) -> bool:
            return any(dotted == f or dotted.startswith(f + ".") for f in forbidden)

        for name in self.modules:
            if matches(name):
                gone.add(name)
        for f in forbidden:
            if f in self.modules or f.split(".")[0] != "specref":
                continue
            parts = f.split(".")
            for i in range(len(parts) - 1, 0, -1):
                owner = ".".join(parts[:i])
                if owner in self.modules:
                    cut.setdefault(owner, set()).add(parts[i])
                    break

        def missing(dep: str | tuple[str, str]) -> bool:
            if isinstance(dep, tuple):
                module, name = dep
                return module in gone or module not in self.modules and module.split(".")[0] == "specref" \
                    or name in cut.get(module, set()) or matches(f"{module}.{name}")
            return dep in gone or (dep.split(".")[0] in ("specref", "specref_grading") and dep not in self.modules)

        changed = True
        while changed:
            changed = False
            for name, mod in self.modules.items():
                if name in gone:
                    continue
                if any(missing(d) for d in self.dependencies(mod)):
                    gone.add(name)
                    changed = True
                    continue
                names = cut.get(name)
                if not names:
                    continue
                for stmt in mod.tree.body:  # within the module: what names a cut name goes too
                    bound = _bound(stmt)
                    if bound and bound <= names or isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        continue
                    if _loaded(stmt) & names and not _is_map(stmt):
                        new = bound - names
                        if new or not bound:
                            names |= bound or {f"<statement {stmt.lineno}>"}
                            changed = True
        return gone, cut

    def available(self, forbidden: tuple[str, ...], dotted: str) -> bool:
        """Whether `from module import name` (dotted: module.name) or `import module` works in the kernel's copy."""
        gone, cut = self.removal(forbidden)
        if dotted in self.modules:
            return dotted not in gone
        module, _, name = dotted.rpartition(".")
        dep = self.symbol_of(module, name)
        if isinstance(dep, str):
            return dep not in gone
        module, name = dep
        return module in self.modules and module not in gone and name not in cut.get(module, set()) and \
            not any(f"{module}.{name}" == f or f"{module}.{name}".startswith(f + ".") for f in forbidden)


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


_SHARED: dict[str, tuple[tuple, Reading, str]] = {}  # root -> (its signature, its Reading, its sources_hash)


def _shared(root: Path) -> tuple[Reading, str]:
    sig = _signature(root)
    got = _SHARED.get(str(root))
    if got is None or got[0] != sig:
        got = (sig, Reading(root), sources_hash(root))
        _SHARED[str(root)] = got
    return got[1], got[2]


def shared_reading(root: Path | None = None) -> Reading:
    """One `Reading` of `root` (default: the real specref) per process, read again only when a file under it
    changes (its size or time): the plan and every kernel of a grading share it."""
    return _shared(root or specref_dir())[0]


def _is_map(stmt: ast.stmt) -> bool:
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
        stmt.target if isinstance(stmt, ast.AnnAssign) else None)
    return isinstance(target, ast.Name) and target.id in LAZY_MAPS + SUBPACKAGE_LISTS + ("__all__",)


# -- writing the copy --------------------------------------------------------------------------------------------


def _rewrite(reading: Reading, mod: _Module, gone: set[str], cut: dict[str, set[str]], forbidden) -> str | None:
    """The copy's source of `mod`, or None when it is unchanged."""
    names = cut.get(mod.name, set())
    source = mod.path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line, replacement), 1-based inclusive
    for stmt in mod.tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        bound = _bound(stmt)
        if bound and bound <= names and not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            edits.append((first, stmt.end_lineno, ""))
            continue
        if not _is_map(stmt):
            if not bound and _loaded(stmt) & names:
                edits.append((first, stmt.end_lineno, ""))
            continue
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
        value = stmt.value
        new = None
        if target.id in LAZY_MAPS and isinstance(value, ast.Dict):
            lazy = ast.literal_eval(value)
            keep = {k: v for k, v in lazy.items() if reading.available(forbidden, f"{mod.name}.{k}")}
            if keep != lazy:
                new = "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in keep.items()) + "}"
        elif target.id in SUBPACKAGE_LISTS + ("__all__",) and isinstance(value, (ast.Tuple, ast.List)):
            items = ast.literal_eval(value)
            if target.id == "__all__":
                keep = [k for k in items if k not in names and (k not in mod.lazy or reading.available(
                    forbidden, f"{mod.name}.{k}"))]
            else:
                keep = [k for k in items if f"{mod.name}.{k}" not in gone]
            if list(keep) != list(items):
                new = repr(type(items)(keep))
        if new is not None:
            head = ast.get_source_segment(source, stmt).split("=", 1)[0]
            edits.append((first, stmt.end_lineno, f"{head.rstrip()} = {new}\n"))
    if not edits:
        return None
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1:last] = [text] if text else []
    return "".join(lines)


def sources_hash(root: Path) -> str:
    """A digest of specref's sources (and the names, sizes and times of its other files) and of this builder."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file() or path.suffix == ".pyc":
            continue
        rel = str(path.relative_to(root)).encode()
        if path.suffix == ".py":
            h.update(rel + b"\0" + path.read_bytes() + b"\0")
        else:
            st = path.stat()
            h.update(rel + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def cache_dir() -> Path:
    """Where built trees are kept: $XDG_CACHE_HOME/specref-grading or ~/.cache/specref-grading (mode 0700)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "specref-grading"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_tree(root: Path, dest: Path, forbidden: tuple[str, ...], reading: Reading | None = None) -> None:
    """Write the kernel's copy of the package at `root` into `dest` (a folder named like the package)."""
    reading = reading or shared_reading(root)
    gone, cut = reading.removal(forbidden)
    gone_paths = {reading.modules[m].path.parent if reading.modules[m].is_pkg else reading.modules[m].path
                  for m in gone}
    dest.mkdir(parents=True, exist_ok=True)
    by_path = {m.path: m for m in reading.modules.values()}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and here / d not in gone_paths)
        out = dest / here.relative_to(root)
        out.mkdir(exist_ok=True)
        os.chmod(out, 0o755)
        for fn in sorted(filenames):
            src = here / fn
            if src in gone_paths or fn.endswith((".pyc", ".pyo")):
                continue
            mod = by_path.get(src)
            text = _rewrite(reading, mod, gone, cut, forbidden) if mod is not None else None
            if text is not None:
                (out / fn).write_text(text, encoding="utf-8")
                os.chmod(out / fn, 0o644)
            elif mod is not None:
                shutil.copyfile(src, out / fn)
                os.chmod(out / fn, 0o644)
            else:
                _link_or_copy(src, out / fn)
    # Compiled here, named as the jail will see them (the copy is read-only there: nothing could be cached).
    compileall.compile_dir(str(dest), ddir=str(root), quiet=2, workers=1)
    for path in dest.rglob("__pycache__"):
        os.chmod(path, 0o755)
        for pyc in path.iterdir():
            os.chmod(pyc, 0o644)


def build(forbidden: tuple[str, ...], root: Path | None = None, cache: Path | None = None) -> Path:
    """The kernel's specref for `forbidden` (built once per sources and forbidden set): the copied package folder."""
    root = root or specref_dir()
    forbidden = tuple(sorted(set(forbidden) | set(ALWAYS_FORBIDDEN)))
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    reading, digest = _shared(root)
    key = hashlib.sha256((digest + "\0" + "\0".join(forbidden)).encode()).hexdigest()[:24]
    final = cache / f"tree-{key}"
    with _cache_lock(cache, fcntl.LOCK_SH):  # a sweep (`sweep`) never removes a tree between this look and its touch
        if (final / root.name).is_dir():
            _touch(final)
            return final / root.name
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    try:
        write_tree(root, tmp / root.name, forbidden, reading)
        os.chmod(tmp, 0o755)
        with _cache_lock(cache, fcntl.LOCK_SH):
            try:
                os.rename(tmp, final)
            except OSError:  # another worker renamed its build first
                if not (final / root.name).is_dir():
                    raise
            _touch(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sweep(cache, keep=final.name)
    return final / root.name


MAX_AGE_S = 24 * 3600  # a tree (or a build left by a killed worker) unused for this long is removed by `sweep`


@contextlib.contextmanager
def _cache_lock(cache: Path, mode: int):
    """flock on the cache's lock file: shared while a tree is looked up and touched or put in place, exclusive
    while `sweep` chooses what to remove. Yields whether the lock was taken (never, with LOCK_NB, when busy)."""
    try:
        fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, mode)
        except OSError:  # LOCK_NB and held by another worker (or no flock on this filesystem)
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _touch(tree: Path) -> None:
    """Mark a tree used now: its folder's mtime is its last use, which `sweep` reads."""
    try:
        os.utime(tree)
    except OSError:
        pass


def sweep(cache: Path, keep: str = "", max_age_s: float = MAX_AGE_S) -> list[str]:
    """Remove the cache's trees other than `keep` unused for `max_age_s` (and builds left that long by a killed
    worker); the names removed.

    Two workers may build and grade at once: a tree is found and touched (`build`) under a shared lock and chosen
    for removal here under the exclusive one (not waited for: a busy cache is swept by the next build), and is
    renamed out of the way before its files go, so a worker never finds a half-removed tree. A grading in
    progress uses a tree for minutes, far less than `max_age_s` after its touch.
    """
    removed: list[str] = []
    doomed: list[Path] = []
    with _cache_lock(cache, fcntl.LOCK_EX | fcntl.LOCK_NB) as locked:
        if not locked:
            return removed
        now = time.time()
        for entry in cache.iterdir():
            if entry.name == keep or not entry.name.startswith(("tree-", "building-", "removing-")):
                continue
            try:  # a fresh building- is another worker's build in progress, a fresh removing- another sweep's
                if now - entry.stat().st_mtime <= max_age_s:
                    continue
                if entry.name.startswith("removing-"):
                    doomed.append(entry)  # a sweep's leftover (its worker was killed while removing)
                    continue
                gone = Path(tempfile.mkdtemp(prefix="removing-", dir=cache))
                os.rename(entry, gone / entry.name)
                doomed.append(gone)
                removed.append(entry.name)
            except OSError:
                continue
    for path in doomed:
        _make_removable(path)
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _make_removable(path: Path) -> None:
    for dirpath, _, _ in os.walk(path):
        try:
            os.chmod(dirpath, 0o700)
        except OSError:
            pass


# -- the setup the kernel runs -------------------------------------------------------------------------------------


def origin(reading: Reading, module: str, name: str) -> tuple[str, str]:
    """Where `from module import name` finds the object first defined: (module, name), through re-exports."""
    seen: set[tuple[str, str]] = set()
    while (module, name) not in seen:
        seen.add((module, name))
        dep = reading.symbol_of(module, name)
        if isinstance(dep, str):
            return module, name
        module, name = dep
        mod = reading.modules.get(module)
        if mod is None:
            break
        for node in mod.tree.body:
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                alias = next(a for a in node.names if (a.asname or a.name) == name)
                module, name = reading._resolve(mod, node), alias.name
                break
        else:
            break
    return module, name


def servable(dotted: list[str], allowed: tuple[str, ...]) -> bool:
    """Whether a name the kernel's copy lacks may be served to the kernel: only when the exercise gives it on
    purpose (its check modules' ALLOWED lists it, by where it is imported from or where it is defined). What the
    copy lacks is forbidden (the answer key, the grader) or needs what is: never served otherwise."""
    return any(d in allowed for d in dotted)


def kernel_setup(reading: Reading, source: str, forbidden: tuple[str, ...],
                 needed: set[str], allowed: tuple[str, ...] = ()) -> tuple[str, list[str]]:
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
                stmt.module.split(".")[0] not in ("specref", "specref_grading"):
            continue
        keep, moved = [], []
        for a in stmt.names:
            if a.name == "*" or reading.available(forbidden, f"{stmt.module}.{a.name}"):
                keep.append(a)
                continue
            module, name = origin(reading, stmt.module, a.name)
            if reading.available(forbidden, f"{module}.{name}"):
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


def _needs_absent(reading: Reading, forbidden: tuple[str, ...], body: list[ast.stmt], absent: set[str]) -> list[str]:
    """What of the kernel's absent names (`absent`, or an import of specref or the grader its copy lacks) a given
    cell uses."""
    out = set()
    for stmt in body:
        out |= _loaded(stmt) & absent
        for node in ast.walk(stmt):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".")[0] in ("specref", "specref_grading"):
                out |= {f"{node.module}.{a.name}" for a in node.names
                        if not reading.available(forbidden, f"{node.module}.{a.name}" if a.name != "*" else node.module)}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] in ("specref", "specref_grading")
                        and not reading.available(forbidden, a.name)}
    return sorted(out)


def prepare(cells: list[dict], needed: set[str], reading: Reading | None = None,
            defined: set[str] = frozenset()) -> tuple[str, ...]:
    """Mark a plan's cells for the wall (in place) and return the exercise's forbidden set.

    A "checks" cell (the checks' imports: ``metadata.specref.side == "checks"``) runs only in the trusted
    process; its names that kernel code uses (`needed`) and the exercise gives on purpose (`allowed_for`: its
    check modules' ALLOWED) are served to the kernel ("serve"). A setup cell gets "kernel_source" (`kernel_setup`)
    and "serve". Both get "forbidden" (the exercise's forbidden set, for the wall's `build`). A given cell after an
    answer ("other") that uses a name the kernel lacks and is not served (a demo comparing the learner's result
    with the reference, as in ex06) would fail there: it becomes "demo", with "absent" (what it
    uses), and is not run in grading; names the exercise's own answers define (`defined`) do not count.
    """
    reading = reading or shared_reading()
    sources = [c["source"] for c in cells if c.get("role") in ("checks", "setup")]
    forbidden, allowed = forbidden_for(sources), allowed_for(sources)
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
                c["kernel_source"], c["serve"] = kernel_setup(reading, c["source"], forbidden, needed, allowed)
            except SyntaxError:
                c["serve"] = []
            kept = {n for s in _parse(c.get("kernel_source", c["source"])) for n in _bound(s)}
            absent |= set(_imported(_parse(c["source"]))) - kept - set(c["serve"])
        else:
            continue
        c["forbidden"] = list(forbidden)
    absent -= set(defined)
    for c in cells:
        if c.get("role") == "other":
            uses = _needs_absent(reading, forbidden, _parse(c["source"]), absent)
            if uses:
                c["role"], c["absent"] = "demo", uses
    return forbidden
