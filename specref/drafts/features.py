"""The target's hidden states, kept aligned to the token buffer, for drafts that read them (chapter 5).

The hook (`specref.drafts.base`): the loop calls `observe(features, starts)` after every target
pass with the hidden states of positions starts[b] .. starts[b]+T-1 of row b, then
`rollback(n_valid)` keeps the first n_valid[b]. So after each step row b holds the target's
features of its context minus the last token (the target's own, fed at the next pass).
`FeatureBuffer` is that bookkeeping, a part a draft holds (Medusa, EAGLE, MTP): one buffer
[B, capacity, C] per requested layer and one held length per row; a write may re-cover
positions already held, never leave a gap. Before any feature exists (a one-token prompt)
such a draft proposes the prompt's token again (`repeat_prompt`, `repeat_prompt_tree`).
"""

from __future__ import annotations

import torch

from .._validate import as_int_tuple, check_gpt2, check_rows, check_tensor
from ..trees import ROOT, Tree
from .base import one_hot


class FeatureBuffer:
    """The target's hidden states feature_layers[j] of every held position, per row: `buffers[j]` [B, capacity, C].

    Row b's first `held()[b]` positions are the hidden states of tokens 0 .. held()[b]-1 of
    the buffer. `reader`, the module that reads the features, is checked against each pass's
    features (width, device, dtype). The owning draft calls `begin` from its own `begin`,
    `observe` from its `observe` and `rollback` from its `rollback`, each after `Draft.begun`.
    """

    def __init__(self, feature_layers: tuple[int, ...], reader: torch.nn.Module | None = None,
                 what: str = "the draft") -> None:
        layers = as_int_tuple("feature_layers", feature_layers)
        if not layers or any(i < 0 for i in layers):
            raise ValueError(f"feature_layers must name at least one hidden state, as indices >= 0 into "
                             f"GPT2Output.hidden_states, got {list(layers)}")
        if len(set(layers)) != len(layers):
            raise ValueError(f"feature_layers must not repeat a layer, got {list(layers)}")
        self.layers = layers
        self.reader, self.what = reader, what  # the module that reads the features (its width, device, dtype)
        self.batch_size: int | None = None  # from `begin`
        self.run_rows: int | None = None  # the run's longest row (`Draft.run_rows`, its session's), from `begin`
        self.buffers: list[torch.Tensor] | None = None  # per layer [B, capacity, C]
        self.n_held: torch.Tensor | None = None  # [B]

    def begin(self, batch_size: int, run_rows: int | None) -> None:
        """Forget every feature; the buffers are allocated at the first `observe` (its C, dtype and device)."""
        self.batch_size, self.run_rows = batch_size, run_rows
        self.buffers, self.n_held = None, None

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        """Hold features[j][b, t] as layer feature_layers[j]'s hidden state at position starts[b] + t of row b."""
        B, n_layers = self._begun(), len(self.layers)
        if self.reader is not None:
            check_features_fit(features, self.reader, self.what)
        if not isinstance(features, (tuple, list)) or len(features) != n_layers:
            raise ValueError(f"features must be a tuple of {n_layers} tensors, one per feature layer "
                             f"{list(self.layers)}, got {type(features).__name__} of "
                             f"{len(features) if isinstance(features, (tuple, list)) else '?'}")
        first = check_tensor("features[0]", features[0])
        if first.dim() != 3 or first.shape[0] != B or first.shape[1] == 0 or not first.is_floating_point():
            raise ValueError(f"features[0] must be a float [B, T, C] tensor with B = {B} (from begin) and T >= 1, "
                             f"got {first.dtype} {tuple(first.shape)}")
        for j, f in enumerate(features):
            f = check_tensor(f"features[{j}]", f)
            if f.shape != first.shape or f.dtype != first.dtype or f.device != first.device:
                raise ValueError(f"features[{j}] must match features[0] ({first.dtype} {tuple(first.shape)} on "
                                 f"{first.device}), got {f.dtype} {tuple(f.shape)} on {f.device}")
        _, T, C = first.shape
        dev = first.device
        starts = check_rows("starts", starts, B).to(dev, torch.long)
        held = torch.zeros(B, dtype=torch.long, device=dev) if self.n_held is None else self.n_held
        if self.buffers is not None and (self.buffers[0].shape[2] != C or self.buffers[0].dtype != first.dtype):
            raise ValueError(f"features changed from {self.buffers[0].dtype} C={self.buffers[0].shape[2]} "
                             f"to {first.dtype} C={C} within one generation")
        bad = (starts < 0) | (starts > held)
        n_bad, longest = torch.stack([bad.sum(), (starts + T).max()]).tolist()  # one read back
        if n_bad:
            b = int(bad.nonzero()[0])
            raise ValueError(f"row {b}: features start at position {int(starts[b])} but the row holds "
                             f"{int(held[b])}: a write must continue or re-cover what is held, never leave a gap")
        self._reserve(longest, B, C, first.dtype, dev)
        pos = starts[:, None] + torch.arange(T, device=dev)  # [B, T]
        for buf, f in zip(self.buffers, features):
            buf.scatter_(1, pos[..., None].expand(B, T, C), f)  # the caller's tensors are only read
        self.n_held = starts + T

    def _reserve(self, n: int, B: int, C: int, dtype: torch.dtype, dev: torch.device) -> None:
        """Make every buffer hold at least n positions (doubling, so a generation reallocates O(log L) times)."""
        cap = 0 if self.buffers is None else self.buffers[0].shape[1]
        if n <= cap:
            return
        new_cap = max(n, 2 * cap, 64, self.run_rows or 0)  # sized to the run (`Draft.run_rows`): allocated once
        grown = [torch.zeros((B, new_cap, C), dtype=dtype, device=dev) for _ in self.layers]
        if self.buffers is not None:
            for g, old in zip(grown, self.buffers):
                g[:, :cap] = old
        self.buffers = grown

    def _begun(self) -> int:
        """The batch size from `begin`; raises before it."""
        if self.batch_size is None:
            raise RuntimeError(f"{self.what}'s features are used before begin(batch_size): call begin first")
        return self.batch_size

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Keep only the first n_valid[b] features of row b (they belong to the tokens the row kept)."""
        n_valid = check_rows("n_valid", n_valid, self._begun())
        if bool((n_valid < 0).any()):  # one read back
            raise ValueError(f"n_valid must be >= 0, got {n_valid.tolist()}")
        if self.n_held is not None:
            self.n_held = torch.minimum(self.n_held, n_valid.to(self.n_held.device))

    def held(self) -> torch.Tensor:  # [B]
        """How many leading positions of each row have features (0 before the first observe)."""
        if self.n_held is None:
            return torch.zeros(self._begun(), dtype=torch.long)
        return self.n_held.clone()

    def scored(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:  # [B, L], [B] -> t [B]
        """t = lengths - 2, the newest position the target has scored, whose features must be held.

        None before any feature exists: a one-token prompt, which every row shares.
        """
        B = self._begun()
        tokens = check_rows("tokens", tokens, B, "[B, L]")
        t = check_rows("lengths", lengths, B).to(tokens.device, torch.long) - 2
        held = self.held().to(t.device)
        # One read back: the lengths' range, and whether any row lacks the features it needs.
        lacks = ((t < 0) | (held <= t)).any().long()
        lo, hi, n_before, lacking = torch.stack([t.min(), t.max(), (t < 0).sum(), lacks]).tolist()
        if lo < -1 or hi > tokens.shape[1] - 2:
            raise ValueError(f"lengths must be in [1, {tokens.shape[1]}] (the buffer's width), got {(t + 2).tolist()}")
        if n_before == B:
            return None
        if lacking:
            raise RuntimeError(f"the draft holds the target's features of {held.tolist()} positions but needs "
                               f"those of {(t + 1).tolist()}: the loop must call observe(features, starts) after "
                               f"every target pass")
        return t

    def gather(self, positions: torch.Tensor,  # [B, W]
               check: bool = True) -> tuple[torch.Tensor, ...]:  # ([B, W, C], ...)
        """The features at positions[b, w] of row b, per feature layer; every position must be held.

        ``check=False`` (a draft's own call, positions it derived from `scored`) skips the read back.
        """
        positions = check_rows("positions", positions, self._begun(), "[B, W]")
        if self.buffers is None or self.n_held is None:
            raise RuntimeError("no features held yet: observe the target's pass first")
        positions = positions.to(self.n_held.device, torch.long)
        if check and positions.numel() and bool(((positions < 0) | (positions >= self.n_held[:, None])).any()):
            raise ValueError(f"positions must lie in [0, held) for each row, held = {self.n_held.tolist()}, "
                             f"got {positions.tolist()}")
        C = self.buffers[0].shape[2]
        idx = positions[..., None].expand(*positions.shape, C)
        return tuple(f.gather(1, idx) for f in self.buffers)


def repeat_prompt(tokens: torch.Tensor, k: int, V: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Before any feature (a one-token prompt): k copies of that token with one-hot q, exact and rarely accepted."""
    x = tokens[:, :1].expand(tokens.shape[0], k).clone()  # [B, k]
    return x, one_hot(x, V, dtype)


def repeat_prompt_tree(tokens: torch.Tensor, depth: int, max_depth: int | None,
                       max_nodes: int | None) -> list[Tree]:
    """The tree form of `repeat_prompt`: one node per row, the lone prompt token (deterministic, one-hot q).

    The tree is empty when the step allows no node (max_depth or max_nodes 0).
    """
    n_nodes = min(depth if max_depth is None else max_depth, 1 if max_nodes is None else max_nodes)
    return [Tree((ROOT,), (int(tokens[b, 0]),)) if n_nodes > 0 else Tree((), ()) for b in range(tokens.shape[0])]


def check_target(target: object, module: torch.nn.Module, what: str, config: object | None = None) -> None:
    """Raise unless `target` is a GPT-2 model (it lends its embeddings and LM head) that `module` fits.

    `module` (with `n_embd`) must read the target's width and share its device and dtype;
    `config` (a `HeadsConfig`), when given, must name this target as the one it was trained on.
    """
    tc = check_gpt2(target).config
    if config is not None:
        config.check_target(target)  # before the width: it names the target the module was trained on
    if tc.n_embd != module.n_embd:
        raise ValueError(f"the target's n_embd is {tc.n_embd}, but {what} read features of width {module.n_embd}: "
                         "the draft was built for another target")
    p = next(module.parameters())
    if p.device != target.device or p.dtype != target.dtype:
        raise ValueError(f"the target computes in {target.dtype} on {target.device} but {what} are {p.dtype} on "
                         f"{p.device}: put both on one device and dtype (module.to(target.device, target.dtype))")


def check_features_fit(features: object, module: torch.nn.Module, what: str) -> None:
    """Raise unless the target's features have the width `module` reads and live on its device, in its dtype."""
    if not (isinstance(features, (tuple, list)) and features and isinstance(features[0], torch.Tensor)):
        return  # FeatureBuffer.observe names what is wrong with the structure
    f, p = features[0], next(module.parameters())
    if f.dim() == 3 and f.shape[-1] != module.n_embd:
        raise ValueError(f"{what} read features of width {module.n_embd}, the target's pass gave width "
                         f"{f.shape[-1]}: the draft was built for another target")
    if f.device != p.device or f.dtype != p.dtype:
        raise ValueError(f"the target computes in {f.dtype} on {f.device} but {what} are {p.dtype} on {p.device}: "
                         "put both on one device and dtype (load_draft does)")
