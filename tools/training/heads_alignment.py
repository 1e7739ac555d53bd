"""The teacher-forced alignment of the feature drafts' training (Medusa, EAGLE, MTP): which target position,
feature and token every module reads, and which token it predicts (used by tools/training/train_heads.py).

Notation. ``input_ids`` is ``[B, T]``, token ``x_u`` at position ``u``; ``hidden_states =
target(input_ids, return_hidden=True).hidden_states`` (``hidden_states[0]`` the embedding output,
``hidden_states[n_layer]`` = ``ln_f`` of the last block's output). The target's *feature* at ``t`` is
``f_t = hidden_states[-1][:, t]``; ``target.lm_head(f_t)`` predicts ``x_{t+1}``. The label of an
output that predicts ``x_u`` is the target's next-token distribution at ``u - 1``,
``target.lm_head(f_{u-1})`` (what a lossless verifier accepts against). The modules and the rows
each reads at inference are in ``specref.drafts.heads``; the drafts' caches hold exactly what these
functions compute (the tests check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specref._validate import check_int, check_tokens
from specref.drafts.heads import EagleLayer, MTPStack, check_features, embed
from specref.models.gpt2 import GPT2


def check_pair(hidden_states: object, input_ids: object, target: GPT2) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    if not isinstance(target, GPT2):
        raise TypeError(f"target must be a GPT2, got {type(target).__name__}")
    if isinstance(hidden_states, torch.Tensor) or not isinstance(hidden_states, Sequence) \
            or len(hidden_states) != target.config.n_layer + 1:
        raise ValueError(f"hidden_states must be GPT2Output.hidden_states ({target.config.n_layer + 1} tensors)")
    ids = check_tokens("input_ids", input_ids, target.config.vocab_size)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must have shape [B, T] with T >= 2, got {tuple(ids.shape)}")
    for h in hidden_states:
        check_features("hidden_states[l]", h, target.config.n_embd, ids.shape[0], ids.shape[1])
    return tuple(hidden_states), ids


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
    hs, ids = check_pair(hidden_states, input_ids, target)
    for layer_index in layer.feature_layers:
        if layer_index >= len(hs):
            raise ValueError(f"feature layer {layer_index} is not in hidden_states (0 .. {len(hs) - 1})")
    T = ids.shape[1]
    g = layer.fuse([hs[i] for i in layer.feature_layers])[:, :T - 1]
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
                m = m | torch.eye(L, dtype=torch.bool, device=device)  # rows before any draft start see themselves
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
    hs, ids = check_pair(hidden_states, input_ids, target)
    if stack.depth > ids.shape[1] - 1:
        raise ValueError(f"an MTP stack of depth {stack.depth} needs T >= {stack.depth + 1} tokens")
    outs, h = [], hs[-1]
    for d in range(1, stack.depth + 1):
        h = stack[d - 1](*mtp_inputs(d, h, ids, target))
        outs.append(h)
    return outs
