"""The trainable parts of the feature drafts (Medusa, EAGLE, MTP), and how their training inputs line up.

Decoding logic lives in the drafts that use these modules; this file holds the modules,
their save/load, and the *teacher-forced* alignment: which target position, feature and
token every module reads, and which token it predicts.  Training (``tools/train_heads.py``)
and the drafts' inference build their inputs with the same functions below.

Notation, used in every docstring here.  ``input_ids`` is ``[B, T]``, token ``x_u`` at position
``u``.  ``hidden_states = target(input_ids, return_hidden=True).hidden_states`` (HF's
convention: ``hidden_states[0]`` is the embedding output, ``hidden_states[l]`` the output of
block ``l - 1``, ``hidden_states[n_layer]`` = ``ln_f`` of the last block's output).  The
target's *feature* at position ``t`` is ``f_t = hidden_states[-1][:, t]``; the target's own
head ``target.lm_head(f_t)`` predicts ``x_{t+1}``.  In decoding, ``t`` is the last position
the target has scored, ``x_{t+1}`` the token it just produced, and a draft's position
``j = 1, 2, ...`` is the token ``x_{t+1+j}``.  The label of an output that predicts
``x_u`` is the target's next-token distribution at ``u - 1``, ``target.lm_head(f_{u-1})``
(what a lossless verifier accepts against).

* ``MedusaHeads`` (Medusa-1): head ``i`` (0-based) reads ``f_t`` only and predicts
  ``x_{t+2+i}`` = draft position ``i + 1``, without seeing ``x_{t+1} .. x_{t+1+i}``.
* ``EagleLayer`` (EAGLE-1/3): at row ``s`` it reads ``g_s`` (the fused target feature at
  ``s``, or while drafting its own previous output), the embedding of ``x_{s+1}`` and the
  position embedding of ``s + 1``; its output ``f_hat_s`` estimates ``f_{s+1}`` and
  ``target.lm_head(f_hat_s)`` predicts ``x_{s+2}``.  Drafting step ``j`` from ``t`` runs
  at row ``s = t + j - 1``.
* ``MTPModule`` (DeepSeek-V3 MTP), depth ``d``: at row ``i`` it reads ``h^{d-1}_i``
  (``h^0 = f``, the target's feature; else depth ``d - 1``'s output at the same row), the
  embedding of ``x_{i+d}`` and the position embedding of ``i + d``; its logits predict
  ``x_{i+d+1}`` = draft position ``d`` from ``t = i``.

Token and position embeddings and the LM head are the target's own, frozen and shared,
never stored with the heads (so every head set is small and is tied to its target: see
``target_fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._validate import check_int, check_tensor, check_tokens
from ..models.gpt2 import GPT2, Block, GPT2Config, attention_mask_over_slots, check_attention_mask
from ..models.kvcache import KVCache

KINDS = ("medusa", "eagle", "mtp")


# -- shared pieces -----------------------------------------------------------------------------
def _block_config(n_embd: int, n_head: int) -> GPT2Config:
    # vocab_size and n_positions are unused by a lone Block; GPT2Config checks n_embd % n_head.
    return GPT2Config(vocab_size=1, n_positions=1, n_embd=n_embd, n_layer=1, n_head=n_head)


def _init_block(block: Block, std: float = 0.02) -> None:
    """GPT-2's initialisation for one block (its residual projections scaled by 1/sqrt(2 * 1 layer))."""
    for name, p in block.named_parameters():
        if name.endswith("weight") and p.ndim == 2:
            nn.init.normal_(p, 0.0, std / (2 ** 0.5) if "c_proj" in name else std)
        elif name.endswith("bias") and "ln_" not in name:
            nn.init.zeros_(p)


def _check_features(name: str, x: object, C: int, B: int | None = None, T: int | None = None) -> torch.Tensor:
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.ndim != 3 or x.shape[-1] != C:
        raise ValueError(f"{name} must have shape [B, T, {C}], got {tuple(x.shape)}")
    if B is not None and x.shape[0] not in (B, 1) or T is not None and x.shape[1] != T:
        raise ValueError(f"{name} must have shape [{B} (or 1), {T}, {C}], got {tuple(x.shape)}")
    return x


def _one_block_forward(block: Block, n_head: int, x: torch.Tensor, cache: KVCache | None,
                       attention_mask: torch.Tensor | None) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
    """One GPT-2 block over new rows ``x``, attending as ``GPT2.forward`` does (cache + mask among new rows)."""
    B, T, C = x.shape
    new_mask = check_attention_mask(attention_mask, B, T, x.device)
    if cache is None:
        past, slots, n_slots = None, None, T
        mask = attention_mask_over_slots(None, torch.arange(T, device=x.device)[None].expand(B, T), T, new_mask)
    else:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        if cache.n_layer != 1 or cache.k.shape[2] != n_head or cache.k.shape[4] != C // n_head:
            raise ValueError("cache must be a 1-layer KVCache of this module's shape (use module.new_cache)")
        if cache.batch_size != B:
            raise ValueError(f"cache holds {cache.batch_size} sequences but the input has B={B}")
        if cache.device != x.device:
            raise ValueError(f"cache is on {cache.device} but the input is on {x.device}")
        past = cache.lengths
        n_slots = int(past.max()) + T
        if n_slots > cache.max_len:
            raise ValueError(f"total length {n_slots} exceeds the cache's max_len={cache.max_len}")
        slots = past[:, None] + torch.arange(T, device=x.device)  # [B, T]
        mask = attention_mask_over_slots(past, slots, n_slots, new_mask)
    y = block(x, mask, cache, 0, slots, n_slots)
    if cache is not None:
        cache.lengths = past + T  # a new tensor, as GPT2.forward does
    return y


class _OneBlockCache:
    """Mixin: ``new_cache`` for modules with one GPT-2 block (``self.n_embd``, ``self.n_head``)."""

    n_embd: int
    n_head: int

    def new_cache(self, batch_size: int, max_len: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty 1-layer cache for this module's block: ``batch_size`` rows of up to ``max_len`` entries."""
        p = next(self.parameters())  # type: ignore[attr-defined]
        return KVCache(1, batch_size, self.n_head, self.n_embd // self.n_head, max_len,
                       device=p.device if device is None else device, dtype=p.dtype if dtype is None else dtype)


def _check_dims(n_embd: object, n_head: object) -> None:
    check_int("n_embd", n_embd, 1, "the target's width")
    check_int("n_head", n_head, 1, "attention heads")
    if n_embd % n_head:  # type: ignore[operator]
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")


# -- Medusa ----------------------------------------------------------------------------------
class MedusaHeads(nn.Module):
    """Medusa-1 heads: head ``i`` maps the target's feature ``f_t`` to ``f_t + SiLU(W_i f_t + b_i)``.

    ``target.lm_head`` of head ``i``'s output predicts ``x_{t+2+i}`` (draft position ``i + 1``);
    the target's own head predicts ``x_{t+1}``.  Head ``i`` never sees ``x_{t+1} .. x_{t+1+i}``,
    which is why its acceptance falls with ``i``.  The paper gives every head its own LM
    head initialised from the target's; here all heads share the target's frozen
    ``lm_head`` (not stored), which keeps a head at ``C * C + C`` parameters.  ``W_i`` starts
    at zero (as in Medusa), so every head starts as the target's own next-token head.
    """

    def __init__(self, n_embd: int, n_heads: int) -> None:
        super().__init__()
        check_int("n_embd", n_embd, 1, "the target's width")
        check_int("n_heads", n_heads, 1, "Medusa heads")
        self.n_embd, self.n_heads = n_embd, n_heads
        self.weight = nn.Parameter(torch.zeros(n_heads, n_embd, n_embd))  # [n, C_in, C_out]
        self.bias = nn.Parameter(torch.zeros(n_heads, n_embd))  # [n, C]

    def forward(self, h: torch.Tensor, n: int | None = None) -> torch.Tensor:  # [B, T, C] -> [B, T, n, C]
        """Heads 0 .. n-1 (all when n is None) on every row of h; a head never reads another's output."""
        h = _check_features("h", h, self.n_embd)
        n = self.n_heads if n is None else check_int("n", n, 1, f"heads to run (at most {self.n_heads})")
        if n > self.n_heads:
            raise ValueError(f"n must be at most n_heads = {self.n_heads}, got {n}")
        z = torch.einsum("btc,ncd->btnd", h, self.weight[:n]) + self.bias[:n]  # [B, T, n, C]
        return h[:, :, None, :] + F.silu(z)

    def logits(self, h: torch.Tensor, lm_head: nn.Module, n: int | None = None) -> torch.Tensor:  # -> [B, T, n, V]
        """``lm_head(forward(h, n))``: head i's logits at row t are for token ``x_{t+2+i}``; only heads 0 .. n-1 run."""
        return lm_head(self(h, n))


# -- EAGLE -----------------------------------------------------------------------------------
class EagleLayer(_OneBlockCache, nn.Module):
    """The EAGLE draft layer: one GPT-2 block on (feature at ``s``, embedding of ``x_{s+1}``) -> feature at ``s + 1``.

    ``x = fc([g_s ; tok_emb_s]) + pos_emb_s`` then ``f_hat = LayerNorm(Block(x))``, with ``tok_emb_s =
    target.transformer.wte(x_{s+1})`` and ``pos_emb_s = target.transformer.wpe(s + 1)`` (the
    position of the token read and of the feature predicted; GPT-2 has no rotary
    positions inside the block, so the target's frozen absolute ones are added).
    ``target.lm_head(f_hat_s)`` is q for ``x_{s+2}``.

    * EAGLE-1: ``feature_layers=(n_layer,)`` (the top feature ``f``), ``use_token=True``;
      trained to regress ``f_{s+1}`` plus token CE.
    * ``use_token=False``: the ablation without the token one step ahead; ``fc`` sees
      ``g_s`` only (``tok_emb`` may be None and is ignored).
    * EAGLE-3: ``feature_layers=(2, 6, 12)`` (low, mid, top): ``fuse`` maps them through
      ``Linear(3C -> C)``; trained on token CE only, with training-time test (see
      ``eagle_unroll``), so its output is a feature of its own, not the target's.

    While drafting, step 1 reads ``g = fuse(target features)``, later steps read the
    layer's own previous output as ``g``.  Attention runs over a 1-layer ``KVCache``
    (``new_cache``) with ``GPT2.forward``'s rule: a new row sees the cached rows and
    the new rows allowed by ``attention_mask`` (default causal).

    Cache rows, as in training (``eagle_unroll`` is checked against exactly this): with
    ``n`` tokens known and target features for positions ``0 .. n - 2``, the cache holds
    rows ``s = 0 .. n - 2`` (row ``s`` needs token ``x_{s+1}``); drafting step 1 is the
    output of row ``n - 2`` (q for ``x_n``), step ``j`` writes row ``n - 3 + j`` from step
    ``j - 1``'s output and draft ``j - 1``.  Rows written while drafting hold the layer's
    own features: after verification, ``cache.truncate`` back to the rows fed with target
    features and feed the target's new features (and the accepted tokens) from there.
    """

    def __init__(self, n_embd: int, n_head: int, feature_layers: tuple[int, ...], use_token: bool = True) -> None:
        super().__init__()
        _check_dims(n_embd, n_head)
        if isinstance(feature_layers, (str, bytes)) or not isinstance(feature_layers, Sequence) \
                or not feature_layers:
            raise TypeError(f"feature_layers must be a non-empty tuple of ints, got {feature_layers!r}")
        for v in feature_layers:
            check_int("feature_layers[i]", v, 0, "an index into GPT2Output.hidden_states")
        if not isinstance(use_token, bool):
            raise TypeError(f"use_token must be a bool, got {use_token!r}")
        self.n_embd, self.n_head = n_embd, n_head
        self.feature_layers, self.use_token = tuple(feature_layers), use_token
        C, k = n_embd, len(self.feature_layers)
        self.fuse_fc = nn.Linear(k * C, C) if k > 1 else None
        self.fc = nn.Linear(2 * C if use_token else C, C)
        self.block = Block(_block_config(n_embd, n_head))
        _init_block(self.block)
        self.norm_out = nn.LayerNorm(n_embd, eps=1e-5)  # the output lives where the target's ln_f output does

    def fuse(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:  # k x [B, T, C] -> [B, T, C]
        """``hidden_states[l]`` for ``l`` in ``feature_layers`` (in that order) -> g; one layer: identity."""
        if isinstance(feats, torch.Tensor) or not isinstance(feats, Sequence) \
                or len(feats) != len(self.feature_layers):
            raise ValueError(f"feats must be a sequence of {len(self.feature_layers)} tensors "
                             f"(hidden_states{list(self.feature_layers)})")
        first = _check_features("feats[0]", feats[0], self.n_embd)
        for f in feats[1:]:
            _check_features("feats[i]", f, self.n_embd)
            if f.shape != first.shape:
                raise ValueError(f"feats must share one shape, got {[tuple(x.shape) for x in feats]}")
        if self.fuse_fc is None:
            return first
        return self.fuse_fc(torch.cat(list(feats), -1))

    def forward(
        self,
        g: torch.Tensor,  # [B, T, C]
        tok_emb: torch.Tensor | None,  # [B, T, C] embedding of x_{s+1}; ignored without use_token
        pos_emb: torch.Tensor,  # [B or 1, T, C] wpe(s + 1)
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B or 1, T, T] bool among the new rows
    ) -> torch.Tensor:  # f_hat [B, T, C]
        g = _check_features("g", g, self.n_embd)
        B, T, _ = g.shape
        pos_emb = _check_features("pos_emb", pos_emb, self.n_embd, B, T)
        if self.use_token:
            tok_emb = _check_features("tok_emb", tok_emb, self.n_embd, B, T)
            x = self.fc(torch.cat([g, tok_emb.expand(B, T, -1)], -1))
        else:
            x = self.fc(g)
        return self.norm_out(_one_block_forward(self.block, self.n_head, x + pos_emb, cache, attention_mask))


# -- MTP -------------------------------------------------------------------------------------
class MTPModule(_OneBlockCache, nn.Module):
    """One DeepSeek-V3 MTP module (depth d): ``h^d = Block(M [RMSNorm(h^{d-1}) ; RMSNorm(Emb(x_{i+d}))] + wpe(i+d))``.

    At row ``i``, ``h_prev`` is depth ``d - 1``'s output at the same row (``h^0`` = the target's
    feature ``f_i``), ``tok_emb = target.transformer.wte(x_{i+d})``, ``pos_emb =
    target.transformer.wpe(i + d)`` (GPT-2's absolute positions stand in for DeepSeek's
    rotary ones).  ``logits(h, target.lm_head)`` = ``lm_head(LayerNorm(h))`` predicts
    ``x_{i+d+1}``: the module's own final norm (a LayerNorm, the kind the target's head
    was trained behind), the shared frozen output head.  Modules chain by depth
    (``MTPStack``); each attends causally over its own depth's rows (a 1-layer cache).

    Cache rows, as in training (``mtp_unroll``): row ``i`` of depth ``d`` needs token
    ``x_{i+d}`` and depth ``d - 1``'s row ``i``, so with ``n`` tokens known and target
    features for ``0 .. n - 2``, depth ``d`` can hold rows ``0 .. n - 1 - d`` from real
    tokens.  Drafting from ``t = n - 2``: depth 1 writes row ``t`` (token ``x_{t+1}``) and
    predicts ``x_{t+2}``; depth ``d`` writes its rows ``t + 2 - d .. t`` (those rows' tokens
    ``x_{i+d}`` include the drafts ``x_{t+2} .. x_{t+d}``) and its row ``t`` predicts
    ``x_{t+d+1}``.  Rows that read drafted tokens must be rolled back after verification
    (``cache.truncate``) and rewritten from the accepted tokens.
    """

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        _check_dims(n_embd, n_head)
        self.n_embd, self.n_head = n_embd, n_head
        self.norm_h = nn.RMSNorm(n_embd, eps=1e-6)
        self.norm_e = nn.RMSNorm(n_embd, eps=1e-6)
        self.proj = nn.Linear(2 * n_embd, n_embd, bias=False)  # DeepSeek's M_k
        self.block = Block(_block_config(n_embd, n_head))
        _init_block(self.block)
        self.norm_out = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(
        self,
        h_prev: torch.Tensor,  # [B, T, C]
        tok_emb: torch.Tensor,  # [B, T, C] embedding of x_{i+d}
        pos_emb: torch.Tensor,  # [B or 1, T, C] wpe(i + d)
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:  # h^d [B, T, C]
        h_prev = _check_features("h_prev", h_prev, self.n_embd)
        B, T, _ = h_prev.shape
        tok_emb = _check_features("tok_emb", tok_emb, self.n_embd, B, T)
        pos_emb = _check_features("pos_emb", pos_emb, self.n_embd, B, T)
        x = self.proj(torch.cat([self.norm_h(h_prev), self.norm_e(tok_emb.expand(B, T, -1))], -1)) + pos_emb
        return _one_block_forward(self.block, self.n_head, x, cache, attention_mask)

    def logits(self, h: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:  # [B, T, C] -> [B, T, V]
        return lm_head(self.norm_out(h))


class MTPStack(nn.Module):
    """``depth`` MTP modules; ``modules_list[d - 1]`` is depth d (predicts draft position d)."""

    def __init__(self, n_embd: int, n_head: int, depth: int) -> None:
        super().__init__()
        check_int("depth", depth, 1, "MTP depths")
        self.n_embd, self.n_head, self.depth = n_embd, n_head, depth
        self.modules_list = nn.ModuleList(MTPModule(n_embd, n_head) for _ in range(depth))

    def __getitem__(self, d: int) -> MTPModule:
        return self.modules_list[d]

    def __len__(self) -> int:
        return self.depth


# -- teacher-forced alignment ----------------------------------------------------------------
def _check_pair(hidden_states: object, input_ids: object, target: GPT2) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    if not isinstance(target, GPT2):
        raise TypeError(f"target must be a GPT2, got {type(target).__name__}")
    if isinstance(hidden_states, torch.Tensor) or not isinstance(hidden_states, Sequence) \
            or len(hidden_states) != target.config.n_layer + 1:
        raise ValueError(f"hidden_states must be GPT2Output.hidden_states ({target.config.n_layer + 1} tensors)")
    ids = check_tokens("input_ids", input_ids, target.config.vocab_size)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must have shape [B, T] with T >= 2, got {tuple(ids.shape)}")
    for h in hidden_states:
        _check_features("hidden_states[l]", h, target.config.n_embd, ids.shape[0], ids.shape[1])
    return tuple(hidden_states), ids


def embed(target: GPT2, token_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's frozen ``wte(token_ids)`` ``[B, T, C]`` and ``wpe(positions)`` ``[B or 1, T, C]``."""
    tr = target.transformer
    pos = positions if positions.ndim == 2 else positions[None]
    return tr.wte(token_ids), tr.wpe(pos)


class MedusaBatch(NamedTuple):
    h: torch.Tensor  # [B, T, C] the target's feature f_t at every row t
    labels: list[torch.Tensor]  # labels[i]: [B, T - 1 - i, C] f_{t+1+i}, rows t = 0 .. T-2-i


def medusa_inputs(hidden_states: Sequence[torch.Tensor], n_heads: int) -> MedusaBatch:
    """Head ``i``'s rows and label features: row ``t`` reads ``f_t``; its label is ``lm_head(f_{t+1+i})``.

    Rows ``t > T - 2 - i`` have no label (``f_{t+1+i}`` lies past the text) and are dropped.
    """
    check_int("n_heads", n_heads, 1, "Medusa heads")
    f = hidden_states[-1]
    T = f.shape[1]
    if n_heads > T - 1:
        raise ValueError(f"n_heads={n_heads} needs T >= {n_heads + 1} tokens, got T={T}")
    return MedusaBatch(f, [f[:, 1 + i:] for i in range(n_heads)])


class EagleBatch(NamedTuple):
    g: torch.Tensor  # [B, L, C] fused target feature g_s, s = 0 .. L-1 (L = T - 1)
    tok_emb: torch.Tensor  # [B, L, C] wte(x_{s+1})
    pos_emb: torch.Tensor  # [1, L, C] wpe(s + 1)
    next_feature: torch.Tensor  # [B, L, C] f_{s+1}: regression target; lm_head(next_feature) = labels for x_{s+2}


def eagle_inputs(layer: EagleLayer, hidden_states: Sequence[torch.Tensor], input_ids: torch.Tensor,
                 target: GPT2) -> EagleBatch:
    """The EAGLE layer's teacher-forced inputs: row ``s`` reads ``(g_s, x_{s+1}, s + 1)`` and predicts ``f_{s+1}``.

    Every row has a label: ``target.lm_head(f_{s+1})`` exists even at the last row ``s = T - 2``.
    """
    hs, ids = _check_pair(hidden_states, input_ids, target)
    for l in layer.feature_layers:
        if l >= len(hs):
            raise ValueError(f"feature layer {l} is not in hidden_states (0 .. {len(hs) - 1})")
    T = ids.shape[1]
    g = layer.fuse([hs[l] for l in layer.feature_layers])[:, :T - 1]
    tok, pos = embed(target, ids[:, 1:], torch.arange(1, T, device=ids.device))
    return EagleBatch(g, tok, pos, hs[-1][:, 1:])


def ttt_attention_mask(L: int, steps: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[steps * L, steps * L]`` bool: the attention that drafting ``steps`` tokens from every row at once sees.

    Row blocks are steps: entry ``(j, s)`` (step ``j`` = 1.., row ``s``) is step ``j`` of a
    draft that started at ``t = s - j + 1``.  It may attend to step 1's rows ``r <= t``
    (the cache of target features), and to step ``i``'s row ``s - (j - i)`` for
    ``1 < i <= j`` (the draft's own earlier steps of the same draft, itself included).
    This is what a chain draft with a ``KVCache`` sees at inference.
    """
    check_int("L", L, 1, "rows")
    check_int("steps", steps, 1, "drafting steps")
    s = torch.arange(L, device=device)
    blocks = []
    for j in range(1, steps + 1):
        row = []
        for i in range(1, steps + 1):
            if i > j:
                m = torch.zeros(L, L, dtype=torch.bool, device=device)
            elif i == 1:
                m = s[None, :] <= (s[:, None] - (j - 1))
            else:
                m = s[None, :] == (s[:, None] - (j - i))
            if i == j:
                m = m | torch.eye(L, dtype=torch.bool, device=device)  # rows before any draft start still see themselves
            row.append(m)
        blocks.append(torch.cat(row, 1))
    return torch.cat(blocks, 0)


def ttt_shift(prev_out: torch.Tensor) -> torch.Tensor:  # [B, L, C] -> [B, L, C]
    """Step ``j + 1``'s ``g`` from step ``j``'s output: row ``s`` reads step ``j``'s row ``s - 1`` (row 0: zeros)."""
    return F.pad(prev_out[:, :-1], (0, 0, 1, 0))


def eagle_unroll(layer: EagleLayer, batch: EagleBatch, steps: int) -> list[torch.Tensor]:
    """Teacher-forced drafting of ``steps`` tokens from every row: outputs ``[B, L, C]`` per step.

    Step ``j``'s row ``s`` is draft position ``j`` from ``t = s - j + 1``: it predicts ``x_{s+2}``
    (label ``lm_head(batch.next_feature[:, s])``, the same as step 1's row ``s``) and is valid for
    ``s >= j - 1``.  Step 1 reads the target features; step ``j > 1`` reads step ``j - 1``'s
    outputs shifted by one row (``ttt_shift``) with the true next tokens, and attends as
    ``ttt_attention_mask``.  The fed-back outputs are computed without gradient (detached:
    a simplification of EAGLE-3's training-time test); the final pass over all steps carries
    the gradient of every step.  ``steps = 1`` is plain teacher forcing (EAGLE-1 training).
    """
    check_int("steps", steps, 1, "drafting steps")
    B, L, C = batch.g.shape
    if steps == 1:
        return [layer(batch.g, batch.tok_emb, batch.pos_emb)]
    gs = [batch.g]
    mask = ttt_attention_mask(L, steps, batch.g.device)[None]
    with torch.no_grad():
        for j in range(1, steps):
            n = j * L
            out = layer(torch.cat(gs, 1), batch.tok_emb.repeat(1, j, 1), batch.pos_emb.repeat(1, j, 1),
                        attention_mask=mask[:, :n, :n])
            gs.append(ttt_shift(out[:, -L:]).detach())
    out = layer(torch.cat(gs, 1), batch.tok_emb.repeat(1, steps, 1), batch.pos_emb.repeat(1, steps, 1),
                attention_mask=mask)
    return list(out.split(L, 1))


def mtp_inputs(depth: int, h_prev: torch.Tensor, input_ids: torch.Tensor, target: GPT2
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth ``d``'s teacher-forced inputs over rows ``i = 0 .. T-1-d``: ``(h^{d-1}_i, wte(x_{i+d}), wpe(i+d))``.

    ``h_prev`` is ``[B, >= T - d, C]`` (``f`` for ``d = 1``, depth ``d - 1``'s output for
    ``d > 1``).  Row ``i``'s output predicts ``x_{i+d+1}``; its label is ``lm_head(f_{i+d})``,
    i.e. ``hidden_states[-1][:, d:]``.
    """
    check_int("depth", depth, 1, "MTP depth")
    T = input_ids.shape[1]
    if depth > T - 1:
        raise ValueError(f"depth {depth} needs T >= {depth + 1} tokens, got T={T}")
    L = T - depth
    tok, pos = embed(target, input_ids[:, depth:], torch.arange(depth, T, device=input_ids.device))
    return h_prev[:, :L], tok, pos


def mtp_unroll(stack: MTPStack, hidden_states: Sequence[torch.Tensor], input_ids: torch.Tensor,
               target: GPT2) -> list[torch.Tensor]:
    """Depth d's outputs ``h^d`` ``[B, T - d, C]`` for d = 1 .. depth; labels ``lm_head(hidden_states[-1][:, d:])``."""
    hs, ids = _check_pair(hidden_states, input_ids, target)
    if stack.depth > ids.shape[1] - 1:
        raise ValueError(f"an MTP stack of depth {stack.depth} needs T >= {stack.depth + 1} tokens")
    outs, h = [], hs[-1]
    for d in range(1, stack.depth + 1):
        h = stack[d - 1](*mtp_inputs(d, h, ids, target))
        outs.append(h)
    return outs


# -- configs, saving and loading -------------------------------------------------------------
def target_fingerprint(target: GPT2) -> str:
    """sha256 of the target's token embedding (= its LM head) in float16: which target a head set belongs to."""
    w = target.transformer.wte.weight.detach().to("cpu", torch.float16).contiguous()
    return hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]


@dataclass
class HeadsConfig:
    """What a head set is and which target it was trained on (stored in its safetensors' metadata)."""

    kind: str  # "medusa" | "eagle" | "mtp"
    name: str  # file stem, e.g. "eagle1"
    n_embd: int
    n_head: int = 1  # attention heads of the block (eagle, mtp)
    n_heads: int = 1  # Medusa heads, or MTP depth
    feature_layers: tuple[int, ...] = ()  # eagle only
    use_token: bool = True  # eagle only
    ttt_steps: int = 1  # eagle: training-time test steps used in training (1 = teacher forcing only)
    target_vocab_size: int = 0
    target_n_layer: int = 0
    target_fingerprint: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.feature_layers = tuple(self.feature_layers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadsConfig":
        return cls(**d)

    def check_target(self, target: GPT2) -> None:
        """Raise ValueError unless ``target`` is the model this head set was trained on."""
        c = target.config
        if (c.n_embd, c.vocab_size, c.n_layer) != (self.n_embd, self.target_vocab_size, self.target_n_layer):
            raise ValueError(f"head set {self.name!r} was trained on a target with n_embd={self.n_embd}, "
                             f"vocab_size={self.target_vocab_size}, n_layer={self.target_n_layer}; got "
                             f"n_embd={c.n_embd}, vocab_size={c.vocab_size}, n_layer={c.n_layer}")
        if self.target_fingerprint and target_fingerprint(target) != self.target_fingerprint:
            raise ValueError(f"head set {self.name!r} was trained on another target (embedding fingerprint "
                             f"{self.target_fingerprint}, this target's is {target_fingerprint(target)})")


def build_heads(config: HeadsConfig) -> nn.Module:
    """A freshly initialised module for ``config``."""
    if config.kind == "medusa":
        return MedusaHeads(config.n_embd, config.n_heads)
    if config.kind == "eagle":
        return EagleLayer(config.n_embd, config.n_head, config.feature_layers, config.use_token)
    return MTPStack(config.n_embd, config.n_head, config.n_heads)


def save_heads(module: nn.Module, config: HeadsConfig, path: str | Path,
               dtype: torch.dtype = torch.float16) -> int:
    """Write ``module``'s weights in ``dtype`` with ``config`` in the metadata; returns the file's size in bytes."""
    from safetensors.torch import save_file

    if not isinstance(config, HeadsConfig):
        raise TypeError(f"config must be a HeadsConfig, got {type(config).__name__}")
    sd = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in module.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata={"format": "pt", "config": json.dumps(config.to_dict())})
    path.chmod(0o644)  # safetensors writes owner-only files; these are package data
    return path.stat().st_size


def load_heads(path: Any, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float32) -> tuple[nn.Module, HeadsConfig]:
    """``(module, config)`` from a file written by ``save_heads``, in eval mode on ``device`` in ``dtype``."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(str(path))
    if not path.is_file():
        raise FileNotFoundError(f"no head set at {path}; run `python tools/train_heads.py` to create it")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path} has no head-set config in its metadata (not written by save_heads)")
    config = HeadsConfig.from_dict(json.loads(meta["config"]))
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's global RNG alone
        module = build_heads(config)
    module.load_state_dict(load_file(str(path)))
    return module.to(device=device, dtype=dtype).eval(), config


def load_bundled_heads(name: str, device: torch.device | str | None = None,
                       dtype: torch.dtype = torch.float32) -> tuple[nn.Module, HeadsConfig]:
    """A head set shipped in ``specref/assets/heads/<name>.safetensors`` (names: see ``heads.json`` there)."""
    import importlib.resources

    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise ValueError(f"name must be a head-set name such as 'eagle1', got {name!r}")
    res = importlib.resources.files("specref").joinpath("assets", "heads", f"{name}.safetensors")
    with importlib.resources.as_file(res) as p:
        return load_heads(p, device, dtype)
