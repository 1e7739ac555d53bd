"""The trusted side's policy: what the checks' process hands to the learner's code, and what it asks of it.

The rules:

* exports: what the exercise serves the kernel on purpose goes out as a declared wrapper (`serve` makes one
  `Served` per name the plan declares: a call and nothing else; the real object never crosses); otherwise never
  a module or a class, and a callable only when it is the course's own code
  (`course_callable`): a function of specref, specref_grading or torch or of the solution's cells, a method
  bound to such an object, a builtin method of such an object, or a callable object of such a class.
  functools.partial, operator.attrgetter, a module-level builtin (open, eval, os.system) and every other
  callable of the standard library are refused: they would run what they wrap, or read what they name, here;
* attributes: only of objects of specref, specref_grading and torch, never a function's, and never a model's
  mutators (hooks, weights, dtype, device, mode);
* operators: the checks' own code may not let an object of the submission answer an operator or its own truth
  (its answer would come from the kernel, which can say anything: an object whose __sub__ gives 0 passes
  `abs(got - want) < tol`). Only what copies plain data stays: len, iteration, indexing, float(), int(),
  index(). While this side answers a call of the kernel (the course's code the submission called), what that
  code computes goes back to the submission, which could have computed it itself: there operators are asked;
* changes: a call whose callee changed an array in place is recorded (`Peer.changed`) for the test's flags.
"""

from __future__ import annotations

import re
import sys
import types

COURSE_MODULES = ("specref", "specref_grading", "torch")  # specref_grading: the checks' model wrappers
MODEL_MUTATORS = {"add_module", "apply", "to", "to_empty", "cuda", "cpu", "xpu", "ipu", "mtia", "type", "float",
                  "double", "half", "bfloat16", "train", "requires_grad_", "zero_grad", "share_memory", "compile"}
CELL_FILE = re.compile(r"<(?:checks|setup|test) cell \d+>")  # how trusted.py names the solution's cells


def _course_module(mod: object) -> bool:
    return type(mod) is str and mod.split(".")[0] in COURSE_MODULES


def course_callable(x, depth: int = 0) -> bool:
    """A callable the trusted side may hand to the submission: the course's own code (module docstring)."""
    if depth > 8:
        return False
    if isinstance(x, types.FunctionType):
        return _course_module(x.__module__) or (x.__module__ == "__main__" and CELL_FILE.fullmatch(
            x.__code__.co_filename) is not None)
    if isinstance(x, types.MethodType):
        return course_callable(x.__func__, depth + 1)
    if isinstance(x, types.BuiltinFunctionType):  # builtin functions and builtin methods alike
        owner = getattr(x, "__self__", None)  # a module-level builtin's __self__ is its module
        if owner is None or isinstance(owner, (types.ModuleType, type)):
            return False
        return _course_module(getattr(type(owner), "__module__", None))
    t = type(x)
    if t.__module__ == "__main__":  # a class of the solution's cells; never one of trusted.py's own callables
        return all(not isinstance(v, types.FunctionType) or course_callable(v, depth + 1)
                   for v in t.__dict__.values())
    return _course_module(t.__module__) and not isinstance(
        x, (types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType,
            types.ClassMethodDescriptorType))


def _origin(x) -> str:
    mod, name = getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    if type(mod) is not str:
        owner = getattr(x, "__self__", None)
        mod = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
    if type(name) is not str:
        name = getattr(type(x), "__qualname__", "object")
    return repr(f"{mod}.{name}" if type(mod) is str else str(name))


class Served:
    """What the kernel gets for a name the exercise serves it: a call of the object, nothing else (no attribute,
    no operator, no truth value of its own; the object behind it is never exported)."""

    __slots__ = ("_name", "_target")

    def __init__(self, name: str, target) -> None:
        self._name, self._target = name, target

    def __call__(self, *args, **kwargs):
        return self._target(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self._name}, served by the grader>"


class TrustedPolicy:
    """The checks' process's side of the wall (trusted.py)."""

    flags_changes = True

    def __init__(self) -> None:
        self._served: dict[int, Served] = {}  # id -> the wrappers this side declared (held alive)

    def serve(self, table: dict[str, object]) -> dict[str, Served]:
        """The declared wrappers of what the exercise gives the kernel on purpose (the setup's served names): one
        `Served` per name, the only form in which those objects leave this process."""
        wrappers = {name: Served(name, value) for name, value in table.items()}
        for w in wrappers.values():
            self._served[id(w)] = w
        return wrappers

    def plain_copy(self, x):
        """Nothing is sent as a copy that is not plain already."""
        return None

    def check_export(self, x) -> None:
        if self._served.get(id(x)) is x:
            return
        if isinstance(x, (types.ModuleType, type)):
            raise TypeError("the grader passes no modules or classes to the submission")
        if callable(x) and not course_callable(x):
            raise TypeError(f"the grader passes no {type(x).__name__} {_origin(x)} to the submission: only the "
                            "course's own functions, and methods of its objects")

    def check_getattr(self, obj, name: str) -> None:
        mod = (getattr(type(obj), "__module__", "") or "").split(".")[0]
        if mod not in COURSE_MODULES or isinstance(obj, (types.FunctionType, types.MethodType, Served)):
            raise AttributeError(f"the attributes of a {type(obj).__name__} the grader passed are not readable; "
                                 "call it instead")
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.nn.Module) and (
                name.startswith(("register_", "load_", "set_")) or name in MODEL_MUTATORS):
            raise AttributeError(f"{name!r}: a model the grader passed cannot be changed (hooks, weights, dtype, "
                                 "device, mode)")

    def check_operator(self, peer, remote, what: str) -> None:
        if not peer.answering:
            raise TypeError(f"the checks cannot use {what} of a value of the submission's own type "
                            f"({remote._kind}): return plain data (numbers, strings, lists, dicts, tensors, arrays)")
