"""A static, preallocated key/value cache with one length per sequence.

The rule speculative decoding needs from a cache: the target writes K/V entries
for every drafted token, and *rejecting* drafts costs nothing -- we only move
the length back (``truncate``).  Slots past a sequence's length hold stale
values, but the model never attends to them, so they are simply overwritten by
the next forward pass.

Sequences in a batch may accept different numbers of drafts, so each sequence
has its own length: ``lengths`` is a ``[B]`` long tensor.  Tree verification
writes a whole flattened tree into the cache and then keeps only the accepted
path: ``compact`` copies the kept slots to consecutive positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validate import check_int


class KVCache:
    """Per-layer keys and values, ``k[layer]`` and ``v[layer]`` of shape ``[B, n_head, max_len, head_dim]``.

    Slot ``s`` of sequence ``b`` is valid iff ``s < lengths[b]``.  The model
    writes ``T`` new tokens of sequence ``b`` at slots ``lengths[b] .. lengths[b]+T-1``
    and then advances ``lengths`` by ``T``.
    """

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_head: int,
        head_dim: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (("n_layer", n_layer), ("batch_size", batch_size), ("n_head", n_head),
                            ("head_dim", head_dim), ("max_len", max_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        shape = (n_layer, batch_size, n_head, max_len, head_dim)
        # zeros, not empty: stale slots are masked out anyway, but NaN garbage in
        # uninitialised memory would still poison 0 * NaN in some kernels.
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, H, S, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, H, S, D]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.k.device)  # [B]

    # -- shape information -------------------------------------------------------------
    @property
    def n_layer(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    def __repr__(self) -> str:
        return (f"KVCache(n_layer={self.n_layer}, batch_size={self.batch_size}, max_len={self.max_len}, "
                f"lengths={self.lengths.tolist()}, dtype={self.dtype}, device={self.device})")

    # -- rollback ----------------------------------------------------------------------
    def _as_lengths(self, new_lengths: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(new_lengths, bool):
            raise TypeError("new_lengths must be an int or a [B] integer tensor, got bool")
        if isinstance(new_lengths, int):
            out = torch.full((self.batch_size,), new_lengths, dtype=torch.long, device=self.device)
        else:
            out = torch.as_tensor(new_lengths, device=self.device)
            if out.dtype.is_floating_point or out.dtype == torch.bool or out.is_complex():
                raise TypeError(f"new_lengths must hold integers, got dtype {out.dtype}")
            out = out.to(torch.long)
            if out.ndim == 0:
                out = out.expand(self.batch_size)
            if out.shape != (self.batch_size,):
                raise ValueError(f"new_lengths must have shape [{self.batch_size}], got {tuple(out.shape)}")
            out = out.clone()  # never alias the caller's tensor
        return out

    def truncate(self, new_lengths: int | Sequence[int] | torch.Tensor) -> None:
        """Roll back to ``new_lengths`` (an int for all sequences or a ``[B]`` tensor).

        Only moves lengths back: the entries of dropped tokens stay in memory as
        stale slots that will be overwritten.  Growing is refused, because slots
        past the current length were never computed for this prefix.
        """
        new = self._as_lengths(new_lengths)
        if not bool(((new >= 0) & (new <= self.lengths)).all()):
            raise ValueError(f"new_lengths must satisfy 0 <= new_lengths <= lengths={self.lengths.tolist()}, "
                             f"got {new.tolist()}")
        self.lengths = new

    def reserve(self, n_slots: int, limit: int) -> None:
        """Grow the storage to hold ``n_slots`` tokens per sequence (doubling, at most ``limit``); contents kept.

        For caches allocated small and grown as decoding goes (the drafts', and the target's in
        tree and lookahead decoding), so that a large batch does not hold the model's whole
        window from the start. Past ``limit`` it stops growing, and the model's own room check
        reports the overflow.
        """
        n_slots = check_int("n_slots", n_slots, 0, "cache slots per sequence")
        limit = check_int("limit", limit, 1, "the most cache slots per sequence")
        if n_slots <= self.max_len or self.max_len >= limit:
            return
        new_len = min(max(n_slots, 2 * self.max_len), limit)
        used = int(self.lengths.max())  # slots past every length are stale: no need to copy them

        def grown(t: torch.Tensor) -> torch.Tensor:  # [L, B, H, max_len, D] -> [L, B, H, new_len, D]
            out = t.new_zeros(t.shape[:3] + (new_len, t.shape[4]))
            out[:, :, :, :used] = t[:, :, :, :used]
            return out

        self.k, self.v = grown(self.k), grown(self.v)

    def make_room(self, n_new: int, limit: int) -> None:
        """Grow, if it must, so that every sequence can take ``n_new`` more tokens (`reserve`, at most ``limit``)."""
        self.reserve(int(self.lengths.max()) + check_int("n_new", n_new, 0, "new tokens per sequence"), limit)

    def check_room(self, n_new: int, what: str) -> None:
        """Raise unless every sequence can take `n_new` more tokens (`what` names them in the message)."""
        longest = int(self.lengths.max())
        if longest + n_new > self.max_len:
            raise ValueError(
                f"{what} needs {n_new} new cache slots after {longest} cached tokens, but the cache holds "
                f"at most max_len={self.max_len}: use a smaller tree near the end of the window"
            )

    def compact(self, kept_slots: Sequence[Sequence[int] | torch.Tensor]) -> None:
        """Keep only ``kept_slots[b]`` of each sequence ``b``, moved to slots ``0..len-1`` in order.

        Used after tree verification: the cache holds prefix + a flattened tree,
        and only the prefix and the accepted path survive.  GPT-2's positions are
        baked into K/V at write time, so the kept tokens must have been written
        with the position ids they have in the compacted sequence (a tree node at
        depth d gets position prefix_len + d, which is exactly that).
        """
        if len(kept_slots) != self.batch_size:
            raise ValueError(f"kept_slots must have one entry per sequence ({self.batch_size}), got {len(kept_slots)}")
        new_lengths = self.lengths.clone()
        for b, slots in enumerate(kept_slots):
            idx = torch.as_tensor(slots, device=self.device)
            if idx.numel() == 0:
                new_lengths[b] = 0
                continue
            if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.ndim != 1:
                raise TypeError(f"kept_slots[{b}] must be a 1-D sequence of integer slot indices")
            idx = idx.to(torch.long)
            n = int(self.lengths[b])
            if bool((idx < 0).any()) or bool((idx >= n).any()):
                raise ValueError(f"kept_slots[{b}] must index valid slots in [0, {n}), got {idx.tolist()}")
            if idx.unique().numel() != idx.numel():
                raise ValueError(f"kept_slots[{b}] has repeated slots: {idx.tolist()}")
            m = idx.numel()
            # index_select copies first, so overlapping source/destination slots are safe.
            self.k[:, b, :, :m] = self.k[:, b].index_select(2, idx)
            self.v[:, b, :, :m] = self.v[:, b].index_select(2, idx)
            new_lengths[b] = m
        self.lengths = new_lengths

    def clone(self) -> "KVCache":
        """An independent copy (e.g. to branch a decode without disturbing the original)."""
        out = KVCache.__new__(KVCache)
        out.k, out.v, out.lengths = self.k.clone(), self.v.clone(), self.lengths.clone()
        return out
