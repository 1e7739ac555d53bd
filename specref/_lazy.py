"""A package's public names, each imported from its module on first use (PEP 562).

A package `__init__` keeps a plain dict literal `_LAZY = {name: "the.module.that.defines.it"}` and asks
`lazy_names` for its `__getattr__` and `__dir__`. Importing the package then imports none of its modules:
`import specref.checks.rng` loads what rng needs and nothing more. The grader reads `_LAZY` with `ast` to
build the copy of specref a learner's graded kernel sees (specref_grading/trust/kernel_tree.py).
That copy holds some modules only: a name whose module it lacks is an AttributeError (`hasattr` answers
False, `from specref import name` raises ImportError), as for a name the package never had.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, lazy: dict[str, str],
               subpackages: tuple[str, ...] = ()) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: a name of `lazy` is imported from its module and kept; a name of
    `subpackages` is imported as `package.name`."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        if name in lazy or name in subpackages:
            where = lazy.get(name, f"{package}.{name}")
            try:
                module = importlib.import_module(where)
            except ModuleNotFoundError as e:  # a copy of the package without that module: the name is not there
                if e.name is None or not (where == e.name or where.startswith(e.name + ".")):
                    raise  # a module it imports is missing: a broken install, said as it is
                raise AttributeError(f"module {package!r} has no attribute {name!r} ({where} is not in this "
                                     "copy of the package)") from None
            if name in subpackages:
                return module
            value = getattr(module, name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(lazy) | set(subpackages))

    return __getattr__, __dir__
