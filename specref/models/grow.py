"""The bundled target grown wider with the same function: a target whose weights stream from memory.

The bundled target's 11 MiB of weights fit in a CPU's cache, so on a CPU its passes show fixed
per-pass work, not the chapter's physics. `widen(model, r)` copies every hidden unit r times
(function-preserving growth, as in Net2Net, Chen et al. 2016): a vector ``h`` of width C becomes
``h'`` of width rC with each coordinate repeated r times (``h.repeat_interleave(r)``), and

* the embeddings repeat each column r times, so ``x'_0`` is ``x_0`` copied;
* every linear layer ``W [in, out]`` becomes ``kron(W, ones(r, r)) / r`` and its bias repeats:
  ``h' @ W'`` sums r equal copies of each term divided by r, so the output is ``h @ W`` copied;
* LayerNorm's weight and bias repeat: copies leave a vector's mean and variance unchanged;
* attention keeps its heads; each head's width grows r times, so ``q' . k'`` is r times ``q . k``
  while the scale ``1 / sqrt(head width)`` shrinks by ``sqrt(r)``: the query weights and bias are
  multiplied by ``1 / sqrt(r)`` and the attention scores are the original ones;
* the LM head, untied from the embeddings, is ``wte`` repeated along its width and divided by r.

Every hidden state is the original one copied r times and the logits are the original logits,
up to float rounding (the sums run in another order). The cost: r^2 times the layers' weights (r = 4:
42 M parameters, 161 MiB in float32), read by every pass.

A `GrownGPT2` keeps the model it grew from (`base`): the drafts that read the target's features
(Medusa, EAGLE, MTP heads) were trained on the base, so the grown target hands them its hidden
states folded back to the base width (the mean of the r copies), and they borrow the base's
embeddings and LM head, which compute the same function at the small width.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict

import torch

from .._validate import check_int
from .gpt2 import GPT2, GPT2Config, GPT2Output


class GrownGPT2(GPT2):
    """A GPT-2 grown `factor` times wider from `base` (`widen`); hidden states come back at the base width."""

    def __init__(self, config: GPT2Config, base: GPT2, factor: int) -> None:
        super().__init__(config)
        self.factor = factor
        # The base is not a submodule: its weights are not this model's parameters (state_dict, counts).
        object.__setattr__(self, "base", base)

    def _apply(self, fn, *args, **kwargs):  # .to(), .double() ...: the base goes along, so drafts see one device
        self.base._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)

    def step(self, *args, **kwargs):  # noqa: D102 (GPT2.step, with hidden states folded to the base width)
        out = super().step(*args, **kwargs)
        if isinstance(out, GPT2Output):
            return GPT2Output(out.logits, tuple(fold(h, self.factor) for h in out.hidden_states))
        return out


def fold(h: torch.Tensor, r: int) -> torch.Tensor:  # [..., r C] -> [..., C]
    """The mean of each unit's r copies: a grown model's hidden state at the base width."""
    return h.unflatten(-1, (-1, r)).mean(-1)


def widen(model: GPT2, r: int) -> GrownGPT2:
    """`model` grown r times wider with the same function (see the module's docstring); eval mode, no gradients.

    The new model is on `model`'s device and dtype; its weights are computed in float64 and cast. Its
    `base` is a copy of `model` (the input is left as it was).
    """
    if not isinstance(model, GPT2):
        raise TypeError(f"model must be a GPT2, got {type(model).__name__}")
    check_int("r", r, 1, "the growth factor")
    c = model.config
    if not c.tie_word_embeddings:
        raise ValueError("widen grows a model whose LM head is tied to its token embeddings (GPT-2's)")
    inner = c.n_inner or 4 * c.n_embd
    big = GPT2Config(**{**asdict(c), "n_embd": r * c.n_embd, "n_inner": r * inner,
                        "tie_word_embeddings": False})
    base = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.device("meta"):
        grown = GrownGPT2(big, base, r)
    src = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    q_scale = torch.cat([torch.full((r * c.n_embd,), 1 / math.sqrt(r), dtype=torch.float64),
                         torch.ones(2 * r * c.n_embd, dtype=torch.float64)])  # c_attn's outputs: q, then k, v
    out: dict[str, torch.Tensor] = {}
    for name, w in src.items():
        if name == "lm_head.weight":
            out[name] = w.repeat_interleave(r, dim=1) / r  # [V, r C]
        elif name.endswith(("wte.weight", "wpe.weight")):
            out[name] = w.repeat_interleave(r, dim=1)
        elif w.dim() == 2:  # a Conv1D weight [in, out]
            out[name] = w.repeat_interleave(r, dim=0).repeat_interleave(r, dim=1) / r  # kron(W, ones(r, r)) / r
        else:  # a bias or a LayerNorm parameter
            out[name] = w.repeat_interleave(r)
        if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
            out[name] = out[name] * q_scale
    grown.load_state_dict({k: v.to(model.dtype) for k, v in out.items()}, assign=True)
    grown.to(model.device)
    return grown.eval().requires_grad_(False)
