"""A static, preallocated key/value cache with one length per sequence.

Rejecting drafts costs nothing: the length moves back (``truncate``) and the stale slots past it are
never attended to, then overwritten. Each row has its own length (``lengths`` ``[B]``); after tree
verification ``compact`` moves the kept path's slots to consecutive positions.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from .._validate import as_int_tuple, check_int
from .graphs import CapturedPasses

__all__ = ["KVCache", "attended_slots"]


def attended_slots(need: int, max_len: int) -> int:
    """`KVCache.capacity`'s rule, checked (for a cost model): `need` rounded up to a power of two, in [16, max_len]."""
    check_int("max_len", max_len, 1, "slots")
    check_int("need", need, 1, "slots in use")
    if need > max_len:
        raise ValueError(f"need must be <= max_len={max_len}, got {need}")
    return _bucket(need, max_len)


def _bucket(need: int, max_len: int) -> int:  # the rule, unchecked (every pass calls it)
    return min(max_len, max(16, 1 << (need - 1).bit_length()))


class KVCache:
    """Per-layer keys and values, ``k[layer]`` and ``v[layer]`` of shape ``[B, n_head, max_len, head_dim]``.

    Slot ``s`` of row ``b`` is valid iff ``s < lengths[b]``; a pass writes its ``T`` new tokens at slots
    ``lengths[b] ..`` and advances ``lengths`` by ``T``. The cache is the one owner of ``lengths`` and
    changes it in place (a captured graph needs its address). ``bound``, a host-side int, is always
    ``>= max(lengths)``: a pass chooses its shapes from it and never reads ``lengths`` back.
    ``graphs``: the passes captured over this cache (from a `Session`), which a pass replays; None: eager.
    """

    def __init__(self, n_layer: int, batch_size: int, n_head: int, head_dim: int, max_len: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("n_layer", n_layer), ("batch_size", batch_size), ("n_head", n_head),
                            ("head_dim", head_dim), ("max_len", max_len)):
            check_int(name, value, 1, "a positive size", ValueError)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        shape = (n_layer, batch_size, n_head, max_len, head_dim)
        # zeros, not empty: masked stale slots holding NaN would still poison 0 * NaN in some kernels.
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, H, S, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, H, S, D]
        self.n_layer, self.batch_size, self.max_len = n_layer, batch_size, max_len
        self.device, self.dtype = self.k.device, dtype
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # [B]
        self.bound = 0  # host-side: >= max(lengths), never read from the device
        self.graphs: CapturedPasses | None = None  # the passes captured over these addresses

    def __repr__(self) -> str:
        return (f"KVCache(n_layer={self.n_layer}, batch_size={self.batch_size}, max_len={self.max_len}, "
                f"lengths={self.lengths.tolist()}, dtype={self.dtype}, device={self.device})")

    def advance(self, n: int) -> None:
        """Every row took ``n`` more tokens (what a pass over ``T = n`` new tokens does); no read back."""
        self.lengths += n
        self.bound += n

    def set(self, new_lengths: torch.Tensor, bound: int | None = None) -> None:  # [B]
        """Copy ``new_lengths`` into ``lengths``, unchecked; ``bound``: their max, from the host (None: read back)."""
        self.lengths.copy_(new_lengths)
        self.bound = self.tighten() if bound is None else bound

    def reset(self) -> None:
        """Empty every row in place (lengths 0, ``bound`` 0): the cache keeps its storage and addresses."""
        self.lengths.zero_()
        self.bound = 0

    def tighten(self) -> int:
        """Make ``bound`` exact: ``max(lengths)``, one read back (for checked calls, never inside a pass)."""
        self.bound = int(self.lengths.max())
        return self.bound

    def _as_lengths(self, new_lengths: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(new_lengths, bool):
            raise TypeError("new_lengths must be an int or a [B] integer tensor, got bool")
        if isinstance(new_lengths, int):
            return torch.full((self.batch_size,), new_lengths, dtype=torch.long, device=self.device)
        out = torch.as_tensor(new_lengths, device=self.device)
        if out.dtype.is_floating_point or out.dtype == torch.bool or out.is_complex():
            raise TypeError(f"new_lengths must hold integers, got dtype {out.dtype}")
        out = out.to(torch.long)
        if out.ndim == 0:
            out = out.expand(self.batch_size)
        if out.shape != (self.batch_size,):
            raise ValueError(f"new_lengths must have shape [{self.batch_size}], got {tuple(out.shape)}")
        return out

    def truncate(self, new_lengths: int | Sequence[int] | torch.Tensor, check: bool = True,
                 bound: int | None = None) -> None:
        """Roll back to ``new_lengths`` (an int for all rows or a ``[B]`` tensor), in place; growing is refused.

        Dropped tokens stay as stale slots. ``check=False`` (a caller that guarantees it) skips the check and its
        read back; ``bound``, a host-side upper bound of ``new_lengths``, tightens the host bound."""
        new = self._as_lengths(new_lengths)
        if check and not bool(((new >= 0) & (new <= self.lengths)).all()):
            raise ValueError(f"new_lengths must satisfy 0 <= new_lengths <= lengths={self.lengths.tolist()}, "
                             f"got {new.tolist()}")
        self.lengths.copy_(new)
        if bound is not None:
            self.bound = min(self.bound, bound)

    def check_room(self, n_new: int, what: str) -> None:
        """Raise unless `n_new` more tokens per row (`what`) fit the free slots, max_len - bound (no read back)."""
        if self.bound + n_new > self.max_len:
            raise ValueError(f"{what} needs {n_new} new cache slots after up to {self.bound} cached tokens, "
                             f"but the cache holds at most max_len={self.max_len}: use a smaller tree near the end "
                             "of the window")

    def capacity(self, n_new: int) -> int:
        """The slots a pass of ``n_new`` tokens attends over: ``bound + n_new`` rounded up to a power of two.

        In [16, max_len]: at most about twice the K/V needed, and the shapes (a captured graph) change only when
        the bound crosses a power of two. Raises if ``bound + n_new`` does not fit.
        """
        need = self.bound + n_new
        if need > self.max_len:
            raise ValueError(f"total length {need} exceeds the cache's max_len={self.max_len}")
        return _bucket(need, self.max_len)

    def compact(self, kept_slots: Sequence[Sequence[int] | torch.Tensor]) -> None:
        """Keep only ``kept_slots[b]`` of each sequence ``b`` (after tree verification: the prefix and the accepted
        path), moved to slots ``0..len-1`` in order. Positions are baked into K/V, so the kept tokens must have been
        written at their compacted positions (a node at depth d: prefix + d)."""
        if len(kept_slots) != self.batch_size:
            raise ValueError(f"kept_slots must have one entry per sequence ({self.batch_size}), got {len(kept_slots)}")
        old = self.lengths.tolist()  # one read back: the slots are checked on the host
        new_lengths = []
        for b, slots in enumerate(kept_slots):
            kept = as_int_tuple(f"kept_slots[{b}]", slots)  # host ints (a tensor's are read back)
            if any(s < 0 or s >= old[b] for s in kept):
                raise ValueError(f"kept_slots[{b}] must index valid slots in [0, {old[b]}), got {kept}")
            if len(set(kept)) != len(kept):
                raise ValueError(f"kept_slots[{b}] has repeated slots: {kept}")
            if kept:
                idx = torch.tensor(kept, dtype=torch.long, device=self.device)
                # index_select copies first, so overlapping source/destination slots are safe.
                self.k[:, b, :, : len(kept)] = self.k[:, b].index_select(2, idx)
                self.v[:, b, :, : len(kept)] = self.v[:, b].index_select(2, idx)
            new_lengths.append(len(kept))
        self.set(torch.tensor(new_lengths, dtype=torch.long, device=self.device), max(new_lengths))

    def clone(self) -> KVCache:
        """An independent copy, without graphs (they belong to addresses)."""
        out = copy.copy(self)
        out.k, out.v, out.lengths, out.graphs = self.k.clone(), self.v.clone(), self.lengths.clone(), None
        return out

