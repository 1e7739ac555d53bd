"""The rules every exercise's checks share: a task not done yet, and the reference rule.

**Not done yet.** An unsolved answer raises ``NotImplementedError("Task N: write NAME (see the task
above)")`` (specref_grading/exercises.py writes that stub). `graded` makes a check say which task is not done
before anything else: the NotImplementedError it passes on starts with "Task N is not done yet".

**The reference rule.** Each exercise says which `specref` functions a task must not call: the ones it
asks the learner to write (ex05's `lookup` is Task 1's answer under another name). `reference_uses`
inspects a learner's function or class for such references: the code object, recursively through nested
code (inner functions, comprehensions, lambdas), the globals it names, closure cells, default values,
string constants that spell a forbidden module, a class's bases and methods, and the functions and
classes the learner defined that it reaches. `graded` fails the task (0 points) with a message that
says why, before grading anything.

The inspection is a help for the learner in their own kernel, not a security boundary: it only looks
at real Python functions and classes. In graded runs the checks receive proxies of the learner's
functions, served from the learner's jailed kernel; a proxy is not a function, so the inspection skips
it: there, the reference functions are simply absent from the specref the kernel sees
(specref_grading/trust/kernel_tree.py).
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from collections.abc import Callable, Iterable

# modules whose code is the course's: the trusted core (the trusted process, the handles on kernel objects: trust/remote.py)
_COURSE_OWN = ("specref.", "specref_grading.trust.")
# The graders' shared helpers (calling, messages, number reading) answer no task. Every grader module holds
# them under their public names, so a learner's `result.passed` reads a name such a module has too: never a use.
_NEVER_AN_ANSWER = ("specref_grading.checks.report",)
_FUNCTIONS = (types.FunctionType, types.MethodType, functools.partial, staticmethod, classmethod, property)


def _origin(obj: object) -> str | None:
    """The dotted name an object is defined under ("specref.drafts.prompt_lookup.lookup"), or None."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    return None


def _matches(dotted: str, forbidden: Iterable[str]) -> str | None:
    """The forbidden entry `dotted` is or lies under (a module forbids everything in it), else None."""
    for f in forbidden:
        if dotted == f or dotted.startswith(f + "."):
            return f
    return None


def _learner_defined(obj: object, home: dict) -> bool:
    """A function or class the learner wrote: defined in their notebook's namespace (`__main__`-like)."""
    if isinstance(obj, types.FunctionType):
        return obj.__globals__ is home or obj.__module__ in ("__main__", None)
    if isinstance(obj, type):
        return obj.__module__ == "__main__" or obj.__module__ == home.get("__name__", "__main__")
    return False


def _code_objects(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _local_imports(code: types.CodeType) -> list[tuple[str, list[str]]]:
    """The imports a function makes in its own body: (module, names taken from it) per import statement."""
    found: list[tuple[str, list[str]]] = []
    for c in _code_objects(code):
        for ins in dis.get_instructions(c):
            if ins.opname == "IMPORT_NAME":
                found.append((ins.argval, []))
            elif ins.opname == "IMPORT_FROM" and found and ins.argval not in found[-1][0].split(".")[1:]:
                found[-1][1].append(ins.argval)  # (`import a.b.c as m` reads b and c the same way: not taken)
    return found


def reference_uses(obj: object, forbidden: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """The forbidden references a learner's function or class makes, as dotted names (empty: none).

    `forbidden`: dotted names of functions, classes or modules (a module forbids all it holds);
    `allowed`: dotted names under a forbidden module that stay allowed (an exercise's own setup imports).
    Anything that is not a real function, method or class (a grader's proxy) is not inspected: [].
    """
    forbidden, allowed = tuple(forbidden), tuple(allowed)
    found: list[str] = []
    seen: set[int] = set()

    def flag(dotted: str | None) -> bool:
        if dotted is None or dotted in allowed or _matches(dotted, _NEVER_AN_ANSWER) is not None:
            return False
        hit = _matches(dotted, forbidden)
        if hit is not None and dotted not in found:
            found.append(dotted)
        return hit is not None

    def value(v: object, names: set[str], home: dict) -> None:
        """A value the learner's code reaches: flag it, follow the learner's own code, resolve module paths."""
        if id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, types.ModuleType):
            if _matches(v.__name__, forbidden) is not None:
                # Names the code may read from the module (co_names does not tell `m.x` from a global `x`).
                used = [n for n in sorted(names) if hasattr(v, n)]
                if not used:
                    flag(v.__name__)  # the module itself, handed on or searched by name
                for n in used:
                    attr = getattr(v, n)
                    if isinstance(attr, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)):
                        value(attr, names, home)  # judged by where it is defined (imports into it are not its own)
                    elif home.get(n) is not attr:  # a setting or table of the module, not the exercise's own
                        flag(f"{v.__name__}.{n}")
                return
            for f in forbidden:  # `import specref` then specref.drafts.prompt_lookup.lookup(...)
                if f.startswith(v.__name__ + ".") and set(f[len(v.__name__) + 1 :].split(".")) <= names:
                    flag(f)
            return
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        if isinstance(v, property):
            for part in (v.fget, v.fset, v.fdel):
                if part is not None:
                    value(part, names, home)
            return
        if isinstance(v, functools.partial):
            value(v.func, names, home)
            for a in list(v.args) + list(v.keywords.values()):
                value(a, names, home)
            return
        if isinstance(v, types.MethodType):
            value(v.__func__, names, home)
            value(v.__self__, names, home)
            return
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type)) and flag(_origin(v)):
            return
        if isinstance(v, types.FunctionType):
            if _learner_defined(v, home) or _origin(v) is None:
                function(v)
            return
        if isinstance(v, type):
            if _learner_defined(v, home):
                cls(v, home)
            return
        if not isinstance(v, (int, float, str, bytes, bool, complex, type(None))):
            t = type(v)  # an instance: of a forbidden class, or of a class the learner wrote
            if not flag(_origin(t)) and _learner_defined(t, home):
                value(t, names, home)

    def cls(c: type, home: dict) -> None:
        for base in c.__mro__[1:]:
            if base is not object:
                flag(_origin(base))
        for attr in vars(c).values():
            if isinstance(attr, _FUNCTIONS):
                value(attr, set(), home)

    def function(f: types.FunctionType) -> None:
        home = f.__globals__
        names: set[str] = set()
        for code in _code_objects(f.__code__):
            names.update(code.co_names)
            for const in code.co_consts:
                if isinstance(const, str) and "." in const and " " not in const:
                    flag(const)  # importlib.import_module("specref.drafts.prompt_lookup")
        for module, taken in _local_imports(f.__code__):  # imports inside the function: not in its globals
            loaded = sys.modules.get(module)
            if not taken:  # `import specref.checks.montecarlo`: judged as the module it names
                if loaded is None:
                    flag(module)
                else:
                    value(loaded, names, home)
            for n in taken:  # `from m import x`: x judged by where it is defined (an allowed name stays allowed)
                if flag(f"{module}.{n}"):
                    continue
                if loaded is not None and hasattr(loaded, n):
                    value(getattr(loaded, n), names, home)
        builtins = home.get("__builtins__", {})
        for name in sorted(names):
            if name in home:
                value(home[name], names, home)
            elif isinstance(builtins, dict) and name in builtins:
                continue
        for cell in f.__closure__ or ():
            try:
                value(cell.cell_contents, names, home)
            except ValueError:  # an empty cell
                pass
        for d in list(f.__defaults__ or ()) + list((f.__kwdefaults__ or {}).values()):
            value(d, names, home)

    if not isinstance(obj, (types.FunctionType, types.MethodType, functools.partial, type)):
        return found  # a proxy, a value, an object: nothing to inspect (and no attribute of it is read)
    if isinstance(obj, (types.FunctionType, type)) and flag(_origin(obj)):
        return found  # the reference itself handed in as the answer (lookup_proposal = lookup)
    if str(getattr(obj, "__module__", "") or "").startswith(_COURSE_OWN):
        return found  # the course's own code (a grader's wrapper), not a learner's
    if isinstance(obj, type):
        seen.add(id(obj))
        flag(_origin(obj))
        cls(obj, getattr(__import__("sys").modules.get(obj.__module__), "__dict__", {}))
    elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
        if isinstance(obj, types.FunctionType) and flag(_origin(obj)):
            return found
        value(obj, set(), getattr(obj, "__globals__", {}))
    return found


def reference_message(task: int, what: str, uses: list[str]) -> str:
    """Why a task scores 0: it calls the reference it asks the learner to write."""
    return (f"Task {task}: your {what} uses {', '.join(uses)}, which this task asks you to write yourself "
            f"(the task says which specref functions it must not call). This task scores 0 until it does not.")


def not_done(task: int, error: NotImplementedError) -> NotImplementedError:
    """The NotImplementedError a check passes on: it starts by saying which task is not done yet."""
    text = str(error).strip()
    if text.startswith("Task ") and ":" in text:
        said = text.split(":", 1)[0]  # the stub names its own task (a check may call an earlier task's answer)
        return NotImplementedError(f"{said} is not done yet: {text.split(':', 1)[1].strip()}")
    return NotImplementedError(f"Task {task} is not done yet" + (f": {text}" if text else
                                                                  ": an answer still raises NotImplementedError"))


def graded(task: int, grader: str, forbidden: Iterable[str], allowed: Iterable[str] = (),
           learner_args: int = 1) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorate a check: the reference rule on its first `learner_args` arguments, then the check.

    A forbidden reference fails the task with `reference_message` (AssertionError, so 0 points); a
    NotImplementedError from an unsolved answer becomes `not_done`'s, which names the task first.
    """
    forbidden, allowed = tuple(forbidden), tuple(allowed)

    def wrap(check: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check)
        def run(*args: object, **kwargs: object) -> None:
            for learner in args[:learner_args]:
                uses = reference_uses(learner, forbidden, allowed)
                if uses:
                    what = getattr(learner, "__name__", "answer")
                    raise AssertionError(f"{grader}: " + reference_message(task, f"{what}", uses))
            try:
                return check(*args, **kwargs)
            except NotImplementedError as e:
                raise not_done(task, e) from None

        return run

    return wrap
