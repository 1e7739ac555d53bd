"""What the trusted side hands the learner's code: declared wrappers, never the real objects.

The rule: every object the checks' process exports (an argument of a learner's function, a value returned to it,
an attribute read through a wrapper) leaves as the declared wrapper `DECLARED` names for its type (its class or
the nearest base listed). A wrapper states exactly what the learner may use: its calls, its methods (each handed
out as a `Call`), its attributes and its operators; anything else is an AttributeError or a TypeError. The real
object sits in a slot of the wrapper; the kernel only ever holds a `Remote` handle on the wrapper, and private
names are refused on both sides of the wall, so the slot is out of its reach. What a wrapper's call, method or
attribute returns is copied (values.py) or wrapped again by the same table. An object of a type the table does
not declare is refused with a TypeError naming its type: a check that passes something new fails loudly.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from itertools import islice

MAX_LISTED = 1 << 20  # items of a module's listing (parameters(), modules(), ...)
FUNCTION_HOMES = ("specref", "specref_grading.checks")  # whose plain functions may leave as a `Call`
METHOD_HOMES = FUNCTION_HOMES + ("torch",)  # whose methods (bound to an object the checks hold) may
CELL_FILE = re.compile(r"<(?:checks|setup|test) cell \d+>")  # how trusted.py names the solution's cells


class Declared:
    """A declared wrapper: the object in a slot, `_attrs` readable and `_methods` callable, nothing else."""

    __slots__ = ("_target",)
    _attrs: frozenset[str] = frozenset()
    _methods: frozenset[str] = frozenset()

    def __init__(self, target: object) -> None:
        object.__setattr__(self, "_target", target)

    def _names(self) -> frozenset[str]:
        return self._attrs | self._methods

    def _method(self, name: str):
        return getattr(self._target, name)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._names():
            raise AttributeError(f"{name!r} is not declared for the {type(self).__name__.lower()} the grader "
                                 f"passed ({', '.join(sorted(self._names())) or 'a call and nothing else'})")
        if name in self._methods:
            return Call(self._method(name), name)
        return getattr(self._target, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"cannot set {name!r} on what the grader passed")

    def __repr__(self) -> str:
        return f"<{type(self).__name__.lower()} passed by the grader>"


def readable(obj: object, name: str) -> bool:
    """Whether `name` is a declared attribute or method of the wrapper `obj`."""
    return isinstance(obj, Declared) and not name.startswith("_") and name in obj._names()


def real(obj: object) -> object:
    """The object behind a wrapper (for the trusted side itself), or `obj`."""
    return obj._target if isinstance(obj, Declared) else obj


class Call(Declared):
    """A call and nothing else: a course function, a method, a served name, a callable of the checks."""

    __slots__ = ("_name",)

    def __init__(self, target: object, name: str | None = None) -> None:
        super().__init__(target)
        object.__setattr__(self, "_name", name or str(getattr(target, "__qualname__", type(target).__name__)))

    def __call__(self, *args, **kwargs):
        return self._target(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self._name}, passed by the grader>"


class Served(Call):
    """A name the exercise serves the kernel (its setup's own tool, run here because the kernel's specref lacks it):
    called with no argument, so it computes on the exercise's own setting, never on one the kernel chooses; computed
    once per run, so a loop of calls costs this side one computation. Nothing else: no attribute, no argument."""

    __slots__ = ("_result",)

    def __call__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{self._name}() takes no arguments in grading: it computes on the exercise's own setting")
        if not hasattr(self, "_result"):  # an unset slot
            object.__setattr__(self, "_result", self._target())
        return self._result


class Fields(Declared):
    """A dataclass of settings (a model's config): its fields, read; nothing else."""

    __slots__ = ()

    def _names(self) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(self._target))


class Module(Declared):
    """A torch module's structure, read only: submodules, parameters and buffers by name (tensors arrive as copies),
    config, dtype, device, training; the listings as lists (never generators); a container's len, items, indexing.
    Not callable; no hooks, weights, state dicts, .to() or train(): nothing that changes it."""

    __slots__ = ()
    _attrs = frozenset({"config", "dtype", "device", "training"})
    _listings = frozenset({"parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
                           "modules", "named_modules"})
    _methods = _listings | {"num_parameters"}

    def _names(self) -> frozenset[str]:
        t = self._target
        return self._attrs | self._methods | t._modules.keys() | t._parameters.keys() | t._buffers.keys()

    def _method(self, name: str):
        fn = getattr(self._target, name)
        if name not in self._listings:
            return fn
        return lambda *args, **kwargs: list(islice(fn(*args, **kwargs), MAX_LISTED))

    def __len__(self) -> int:
        return len(self._target)

    def __iter__(self):
        return iter(self._target)

    def __getitem__(self, key):
        return self._target[key]

    def __bool__(self) -> bool:
        return True


class Model(Module):
    """A language model: called on token ids with its cache (`model(ids, cache=c)`), `new_cache`, and its structure
    as a `Module`."""

    __slots__ = ()
    _methods = Module._methods | {"new_cache"}

    def __call__(self, *args, **kwargs):
        return self._target(*args, **kwargs)


class Cache(Declared):
    """A KV cache: its lengths and sizes, read; truncate(new_lengths) and capacity(n_new), as a learner calls them (no
    keyword of the cache's own callers: truncate's check and bound stay the cache's)."""

    __slots__ = ()
    _attrs = frozenset({"lengths", "max_len", "batch_size", "n_layer"})
    _methods = frozenset({"truncate", "capacity"})

    def _method(self, name: str):
        fn = getattr(self._target, name)
        return (lambda new_lengths: fn(new_lengths)) if name == "truncate" else (lambda n_new: fn(n_new))


class Rng(Declared):
    """The symbolic rng of an exact enumeration: uniform() and categorical(probs)."""

    __slots__ = ()
    _methods = frozenset({"uniform", "categorical"})


class Uniform(Declared):
    """A symbolic uniform: its comparisons and affine arithmetic (what it refuses, it explains)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]


_UNIFORM_OPS = ("lt", "le", "gt", "ge", "eq", "ne", "add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv",
                "neg", "abs", "pow", "rpow", "floordiv", "mod", "float", "int", "index", "bool", "round")


def _forward(op: str):
    def method(self, *args):
        return getattr(self._target, f"__{op}__")(*args)
    method.__name__ = f"__{op}__"
    return method


for _op in _UNIFORM_OPS:
    setattr(Uniform, f"__{_op}__", _forward(_op))

# The declaration table: a type (module, name; the nearest listed base counts) -> its wrapper. Types are looked up in
# sys.modules, never imported here: an object of a module nobody imported cannot exist.
DECLARED: dict[tuple[str, str], type[Declared]] = {
    ("specref.models.gpt2", "GPT2"): Model,  # GrownGPT2 too (a subclass)
    ("specref_grading.checks.gpt2_pair", "_Memo"): Model,  # the pair check's counting wrapper
    ("torch.nn.modules.module", "Module"): Module,  # every other module: structure only
    ("specref.models.gpt2", "GPT2Config"): Fields,
    ("specref.models.kvcache", "KVCache"): Cache,
    ("specref.checks.rng", "_SymbolicRNG"): Rng,
    ("specref.checks.rng", "SymbolicUniform"): Uniform,
    ("specref_grading.checks.speedup", "VerifyCost"): Call,
    ("types", "FunctionType"): Call,  # a course function or one of the solution's cells (`course_code`)
    ("types", "MethodType"): Call,  # a method of a course function (`course_code`)
}


def course_code(fn: object) -> bool:
    """A Python function of specref or of the checks (FUNCTION_HOMES), a method of one of those or of torch
    (METHOD_HOMES), or one compiled from a solution's cell; never a builtin, a partial, a function of the grader's
    machinery (processes, trust, grade) or of trusted.py itself, nor a plain torch function (torch.load runs what it
    unpickles)."""
    homes = FUNCTION_HOMES
    if isinstance(fn, types.MethodType):
        fn, homes = fn.__func__, METHOD_HOMES
    if not isinstance(fn, types.FunctionType):
        return False
    mod = fn.__module__
    if mod == "__main__":
        return CELL_FILE.fullmatch(fn.__code__.co_filename) is not None
    return type(mod) is str and any(mod == h or mod.startswith(h + ".") for h in homes)


def _cells_callable(x: object) -> bool:
    """An instance of a class a solution's cell defines (every class of its MRO but object), callable, every
    function, staticmethod and classmethod of them from the cells."""
    def own(v: object) -> bool:
        v = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
        return not callable(v) or isinstance(v, type) or (isinstance(v, types.FunctionType) and course_code(v))
    mro = type(x).__mro__[:-1]
    return callable(x) and all(c.__module__ == "__main__" and all(own(v) for v in vars(c).values()) for c in mro)


def _table() -> dict[type, type[Declared]]:
    out = {}
    for (mod, name), wrapper in DECLARED.items():
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type):
            out[cls] = wrapper
    return out


def declare(x: object) -> Declared:
    """The wrapper `x` leaves the trusted process as; TypeError naming its type if it is not declared."""
    if isinstance(x, Declared):
        return x
    table = _table()
    for t in type(x).__mro__:
        wrapper = table.get(t)
        if wrapper is not None:
            if t in (types.FunctionType, types.MethodType) and not course_code(x):
                break
            return wrapper(x)
    if _cells_callable(x):
        return Call(x)
    mod = getattr(type(x), "__module__", "?")
    name = getattr(x, "__qualname__", None) if isinstance(x, (types.FunctionType, types.BuiltinFunctionType,
                                                                type, types.MethodType)) else None
    raise TypeError(f"the grader passes no {mod}.{type(x).__qualname__}{f' {name!r}' if name else ''} to the "
                    "submission: not a declared kind (specref_grading/trust/exports.py, DECLARED)")
