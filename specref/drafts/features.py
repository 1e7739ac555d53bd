"""The target's hidden states, kept aligned to the token buffer, for drafts that read them (chapter 5).

The hook (see `specref.drafts.base`): a draft sets `feature_layers`, indices into
`GPT2Output.hidden_states` (0 = the embeddings, i = the input of block i, n_layer = the
final hidden state after ln_f). After every target pass (prefill included) the loop
calls `observe(features, starts)`: features[j] is [B, T, C] for feature_layers[j], the
hidden states of the T tokens the target just processed, which are positions
starts[b] .. starts[b]+T-1 of row b of the token buffer. Then `rollback(n_valid)`
keeps only the first n_valid[b] positions: what the row kept. So after each step
row b holds the target's features of exactly its context minus the last token (the
target's own token, which gets its features when it is fed at the next pass).

`FeatureDraft` is that bookkeeping: one buffer [B, capacity, C] per requested layer and
one valid length per row. `observe` writes positions starts[b].. and sets the row's
length to starts[b] + T (a write may re-cover positions already held, never leave a
gap); `rollback` truncates; `gather(positions)` reads any valid ones.
"""

from __future__ import annotations

import torch

from .._validate import as_int_tuple, check_tensor
from ..trees import ROOT, Tree
from .base import Draft


class FeatureDraft(Draft):
    """A draft that reads the target's hidden states: a feature buffer per requested layer, aligned to the tokens.

    Subclasses implement `propose` and extend `begin`/`rollback` (calling these) for
    their own state. `features[j]` is [B, capacity, C]; row b's first
    `feature_lengths[b]` positions are the target's hidden states feature_layers[j]
    of tokens 0 .. feature_lengths[b]-1 of the buffer.
    """

    def __init__(self, feature_layers: tuple[int, ...]) -> None:
        layers = as_int_tuple("feature_layers", feature_layers)
        if not layers or any(i < 0 for i in layers):
            raise ValueError(f"feature_layers must name at least one hidden state, as indices >= 0 into "
                             f"GPT2Output.hidden_states, got {list(layers)}")
        if len(set(layers)) != len(layers):
            raise ValueError(f"feature_layers must not repeat a layer, got {list(layers)}")
        self.feature_layers = layers
        self.features: list[torch.Tensor] | None = None  # per layer [B, capacity, C]
        self.feature_lengths: torch.Tensor | None = None  # [B]
        self.batch_size: int | None = None

    def begin(self, batch_size: int) -> None:
        """Forget every feature; the buffers are allocated at the first `observe` (its C, dtype and device)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.features = None
        self.feature_lengths = None

    def _check_begun(self, what: str) -> int:
        if self.batch_size is None:
            raise RuntimeError(f"call begin(batch_size) before {what}")
        return self.batch_size

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        """Hold features[j][b, t] as layer feature_layers[j]'s hidden state at position starts[b] + t of row b."""
        B = self._check_begun("observe")
        if not isinstance(features, (tuple, list)) or len(features) != len(self.feature_layers):
            raise ValueError(f"features must be a tuple of {len(self.feature_layers)} tensors, one per feature layer "
                             f"{list(self.feature_layers)}, got {type(features).__name__} of "
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
        starts = check_tensor("starts", starts)
        if starts.is_floating_point() or starts.dtype == torch.bool or tuple(starts.shape) != (B,):
            raise ValueError(f"starts must be an integer tensor of shape [B] = [{B}], got {starts.dtype} "
                             f"{tuple(starts.shape)}")
        _, T, C = first.shape
        dev = first.device
        starts = starts.to(dev, torch.long)
        held = torch.zeros(B, dtype=torch.long, device=dev) if self.feature_lengths is None else self.feature_lengths
        if self.features is not None and (self.features[0].shape[2] != C or self.features[0].dtype != first.dtype):
            raise ValueError(f"features changed from {self.features[0].dtype} C={self.features[0].shape[2]} "
                             f"to {first.dtype} C={C} within one generation")
        bad = (starts < 0) | (starts > held)
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ValueError(f"row {b}: features start at position {int(starts[b])} but the row holds "
                             f"{int(held[b])}: a write must continue or re-cover what is held, never leave a gap")
        self._reserve(int((starts + T).max()), B, C, first.dtype, dev)
        pos = starts[:, None] + torch.arange(T, device=dev)  # [B, T]
        for buf, f in zip(self.features, features):
            buf.scatter_(1, pos[..., None].expand(B, T, C), f)  # the caller's tensors are only read
        self.feature_lengths = starts + T

    def _reserve(self, n: int, B: int, C: int, dtype: torch.dtype, dev: torch.device) -> None:
        """Make every buffer hold at least n positions (doubling, so a generation reallocates O(log L) times)."""
        cap = 0 if self.features is None else self.features[0].shape[1]
        if n <= cap:
            return
        new_cap = max(n, 2 * cap, 64)
        grown = [torch.zeros((B, new_cap, C), dtype=dtype, device=dev) for _ in self.feature_layers]
        if self.features is not None:
            for g, old in zip(grown, self.features):
                g[:, :cap] = old
        self.features = grown

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Keep only the first n_valid[b] features of row b (they belong to the tokens the row kept)."""
        B = self._check_begun("rollback")
        n_valid = check_tensor("n_valid", n_valid)
        if n_valid.is_floating_point() or n_valid.dtype == torch.bool or tuple(n_valid.shape) != (B,):
            raise ValueError(f"n_valid must be an integer tensor of shape [B] = [{B}], got {n_valid.dtype} "
                             f"{tuple(n_valid.shape)}")
        if bool((n_valid < 0).any()):
            raise ValueError(f"n_valid must be >= 0, got {n_valid.tolist()}")
        if self.feature_lengths is not None:
            self.feature_lengths = torch.minimum(self.feature_lengths, n_valid.to(self.feature_lengths.device))

    def held(self) -> torch.Tensor:  # [B]
        """How many leading positions of each row have features (0 before the first observe)."""
        B = self._check_begun("held")
        if self.feature_lengths is None:
            return torch.zeros(B, dtype=torch.long)
        return self.feature_lengths.clone()

    def prompt_again(self, tokens: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Before any feature (a one-token prompt): k copies of that token with one-hot q, exact and rarely accepted."""
        x = tokens[:, :1].expand(tokens.shape[0], k).clone()  # [B, k]
        return x, torch.nn.functional.one_hot(x, self.vocab_size).to(dtype)

    def prompt_again_tree(self, tokens: torch.Tensor, depth: int, max_depth: int | None,
                          max_nodes: int | None) -> list[Tree]:
        """The tree form of `prompt_again`: one node per row, the lone prompt token (deterministic, one-hot q)."""
        room = min(depth if max_depth is None else max_depth, 1 if max_nodes is None else max_nodes)
        return [Tree((ROOT,), (int(tokens[b, 0]),)) if room > 0 else Tree((), ()) for b in range(tokens.shape[0])]

    def gather(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [B, W] -> ([B, W, C], ...)
        """The features at positions[b, w] of row b, per feature layer; every position must be held."""
        B = self._check_begun("gather")
        positions = check_tensor("positions", positions)
        if positions.is_floating_point() or positions.dtype == torch.bool or positions.dim() != 2 \
                or positions.shape[0] != B:
            raise ValueError(f"positions must be an integer [B, W] tensor with B = {B}, got {positions.dtype} "
                             f"{tuple(positions.shape)}")
        if self.features is None or self.feature_lengths is None:
            raise RuntimeError("no features held yet: observe the target's pass first")
        positions = positions.to(self.feature_lengths.device, torch.long)
        if positions.numel() and bool(((positions < 0) | (positions >= self.feature_lengths[:, None])).any()):
            raise ValueError(f"positions must lie in [0, held) for each row, held = {self.feature_lengths.tolist()}, "
                             f"got {positions.tolist()}")
        C = self.features[0].shape[2]
        idx = positions[..., None].expand(*positions.shape, C)
        return tuple(f.gather(1, idx) for f in self.features)


def check_target(target: object, n_embd: int, what: str) -> None:
    """Raise unless `target` is a GPT-2 model (it lends its embeddings and LM head) of width n_embd."""
    config = getattr(target, "config", None)
    if not isinstance(target, torch.nn.Module) or config is None or not hasattr(target, "lm_head") \
            or not hasattr(target, "transformer"):
        raise TypeError(f"target must be a GPT-2 model (specref.models.gpt2.GPT2), got {type(target).__name__}")
    if config.n_embd != n_embd:
        raise ValueError(f"the target's n_embd is {config.n_embd}, but {what} read features of width {n_embd}: "
                         "the draft was built for another target")


def check_features_fit(features: object, n_embd: int, module: torch.nn.Module, what: str) -> None:
    """Raise unless the target's features have the width `module` reads and live on its device."""
    if not (isinstance(features, (tuple, list)) and features and isinstance(features[0], torch.Tensor)):
        return  # FeatureDraft.observe names what is wrong with the structure
    f, p = features[0], next(module.parameters())
    if f.dim() == 3 and f.shape[-1] != n_embd:
        raise ValueError(f"{what} read features of width {n_embd}, the target's pass gave width "
                         f"{f.shape[-1]}: the draft was built for another target")
    if f.device != p.device or f.dtype != p.dtype:
        raise ValueError(f"the target computes in {f.dtype} on {f.device} but {what} are {p.dtype} on {p.device}: "
                         "put both on one device and dtype (load_draft does)")


def check_lengths(draft: FeatureDraft, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # -> t [B]
    """t = lengths - 2 per row, the newest position the target has scored; its features must be held (or t = -1)."""
    B = draft._check_begun("propose")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != B \
            or tokens.is_floating_point():
        raise ValueError(f"tokens must be an integer [B, L] tensor with B = {B} (from begin), "
                         f"got {getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (B,) or lengths.is_floating_point():
        raise ValueError(f"lengths must be an integer tensor of shape [B] = [{B}]")
    t = lengths.to(torch.long) - 2
    if bool((t < -1).any()) or bool((lengths > tokens.shape[1]).any()):
        raise ValueError(f"lengths must be in [1, {tokens.shape[1]}] (the buffer's width), got {lengths.tolist()}")
    held = draft.held().to(t.device)
    if bool(((t >= 0) & (held <= t)).any()):
        raise RuntimeError(f"the draft holds the target's features of {held.tolist()} positions but needs those of "
                           f"{(t + 1).tolist()}: the loop must call observe(features, starts) after every target pass")
    return t
