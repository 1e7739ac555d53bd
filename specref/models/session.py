"""A decoding session: one generation's KV caches and captured passes, and what a module keeps for the next one.

A decoding loop opens one `Session` per generation and takes every cache of the run from it, by module and
role (`Session.cache`). Where passes are captured (CUDA: `graphs.capturable`), a cache comes with its
`CapturedPasses` and the module keeps it, emptied, for the next generation that fits (same batch size, at
most its slots), so nothing is captured twice; weights that moved since drop it. Elsewhere (a CPU, or
``kept(module).enabled = False``) every cache is new and nothing is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import torch

from .._validate import check_int
from . import graphs
from .kvcache import KVCache

__all__ = ["Kept", "Session", "kept"]


@dataclass
class Kept:
    """What a module keeps between generations: its caches by role, each with the passes captured over it."""

    enabled: bool = True  # capture passes where the device can; False: eager passes, a new cache every generation
    caches: dict[str, KVCache] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)  # the roles an unfinished session holds
    weights: tuple = ()  # the weights' addresses the kept graphs were captured on


_KEPT: WeakKeyDictionary[torch.nn.Module, Kept] = WeakKeyDictionary()


def kept(module: torch.nn.Module) -> Kept:
    """What `module` keeps between generations (empty until a session on a capturing device keeps something)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    return _KEPT.setdefault(module, Kept())


class Session:
    """One generation's caches, for rows of at most `rows` tokens; a context manager that releases them at its end."""

    def __init__(self, rows: int) -> None:
        self.rows = check_int("rows", rows, 1, "tokens per row")
        self._held: list[tuple[Kept, str]] = []

    def cache(self, module: torch.nn.Module, role: str, batch_size: int, max_len: int, window: int) -> KVCache:
        """An empty cache of `module` (with `new_cache`) for `role`: at least `max_len` slots, at most `window` (a
        kept one is rounded up to 64); RuntimeError if an unfinished session (a nested generation) holds the role."""
        state = kept(module)
        if not (state.enabled and graphs.capturable(next(module.parameters()).device)):
            return module.new_cache(batch_size, max_len=max_len)
        if role in state.held:
            raise RuntimeError(
                f"this module's kept {role!r} cache is held by a generation that has not finished: a generation "
                f"nested inside another on the same module would empty it under the outer one. Run the inner "
                f"generation on a copy of the model (copy.deepcopy), or with capture switched off "
                f"(specref.models.session.kept(model).enabled = False), which gives it a cache of its own")
        weights = tuple((p.data_ptr(), p.dtype, p.device) for p in module.parameters())
        if weights != state.weights:  # moved, cast or reloaded: the graphs replay old addresses
            state.caches.clear()
            state.weights = weights
        cache = state.caches.get(role)
        if cache is not None and cache.batch_size == batch_size and max_len <= cache.max_len:
            cache.reset()
        else:
            cache = module.new_cache(batch_size, max_len=max(max_len, min(window, -(-max_len // 64) * 64)))
            cache.graphs = graphs.CapturedPasses()
            state.caches[role] = cache
        state.held.add(role)
        self._held.append((state, role))
        return cache

    def close(self) -> None:
        """The generation ended: its roles are free for the generations that follow (the kept caches stay kept)."""
        for state, role in self._held:
            state.held.discard(role)
        self._held.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
