"""specref's records: frozen dataclasses that cross the wall by value (a Markov chain, a recorded step).

The rule: a record is sent as its type's name and its init fields; the receiver rebuilds it only when the name
is a public frozen dataclass of a specref module that the receiving process has already imported (a name never
imports anything), and its fields are decoded like any other value. Anything else is refused.
"""

from __future__ import annotations

import sys
import types


def record_name(t: type) -> str:
    """'module:qualname' of a frozen dataclass defined in specref (sent by value), else ''."""
    params = t.__dict__.get("__dataclass_params__") if isinstance(t.__dict__, types.MappingProxyType) else None
    mod = getattr(t, "__module__", "")
    if params is None or not getattr(params, "frozen", False) or type(mod) is not str or not mod.startswith("specref."):
        return ""
    return f"{mod}:{t.__qualname__}"


def record_type(name: str) -> type:
    """The record type `name` ('module:qualname') names, under the rule above; ValueError otherwise."""
    mod, _, qual = name.partition(":")
    if not mod.startswith("specref.") or not qual or "<" in qual or any(p.startswith("_") for p in qual.split(".")):
        raise ValueError("refused record type")
    obj = sys.modules.get(mod)
    if obj is None:
        raise ValueError("refused record type")
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type) or record_name(obj) != name:
        raise ValueError("refused record type")
    return obj
