"""Self-speculation: the target's own first n layers, its final LayerNorm and its LM head as the draft (chapter 5).

Rule (early exit, as in LayerSkip, Elhoushi et al. 2024, here without LayerSkip's training): the
draft is the target cut after block n,

    token, position -> wte + wpe -> blocks 0 .. n-1 -> ln_f -> lm_head -> logits,

and it drafts as a smaller model does (`ModelDraft`): feed the tokens its cache has not seen in
one pass, then k autoregressive steps, each draft drawn from q = its logits processed as p is
(one-hot on the argmax when greedy). The verifier is the same one every draft goes through, so
the output is the target's, whatever n.

What it costs to have: nothing. Every weight is the target's own (the same tensors, no copy)
and nothing is trained; the draft keeps its own KV cache for its n layers. Per draft token it
runs n of the target's n_layer blocks and the whole LM head, so c is about
(n blocks + head) / (n_layer blocks + head).

Why it accepts less than a trained head: ln_f and the LM head were trained to read the last
block's output. Block n's output is a different vector that they read as well as they can;
the fewer layers, the further it is from the last one, and the lower the acceptance.

A grown target (`specref.models.grow.GrownGPT2`) runs its own wide first blocks, ln_f and LM
head: the same function as the bundled target's first n layers (the same drafts, the same
acceptance), at the grown model's cost.
"""

from __future__ import annotations

import torch

from .._validate import check_gpt2, check_int
from ..models.gpt2 import GPT2, GPT2Config
from .base import Sampler, draw
from .model import TreeModelDraft

# The default depth for the bundled 12-block target: a quarter of its blocks. Of 1, 2, 3, 4 and 6 blocks,
# 3 accepted the most greedy drafts on 16 held-out prompts (float64). Up to half the depth every exit
# accepts about a fifth of the drafts, as one block does; only the last few blocks raise it.
DEFAULT_LAYERS = 3


def early_exit_model(target: torch.nn.Module, n_layers: int) -> GPT2:
    """A `GPT2` made of the target's embeddings, its blocks 0 .. n_layers-1, its ln_f and its LM head (shared modules).

    Nothing is copied: a change to the target's weights is a change to this model's. Its
    config is the target's with n_layer = n_layers, so its KV cache holds n_layers layers.
    """
    target = check_gpt2(target)
    if not isinstance(target, GPT2):
        raise TypeError(f"target must be a specref GPT2 (its blocks are run as the draft), got "
                        f"{type(target).__name__}")
    depth = target.config.n_layer
    n_layers = check_int("n_layers", n_layers, 1, "the target's blocks the draft runs")
    if n_layers > depth:
        raise ValueError(f"n_layers must be in [1, {depth}] (the target has {depth} blocks), got {n_layers}")
    config = GPT2Config.from_dict({**target.config.to_dict(), "n_layer": n_layers})
    with torch.device("meta"):  # a shell: every module below is replaced by the target's own
        model = GPT2(config)
    tr, mine = target.transformer, model.transformer
    mine.wte, mine.wpe, mine.ln_f = tr.wte, tr.wpe, tr.ln_f
    mine.h = torch.nn.ModuleList(list(tr.h)[:n_layers])
    model.lm_head = target.lm_head
    return model.train(target.training)


class SelfDraft(TreeModelDraft):
    """The target's first `n_layers` blocks, its ln_f and its LM head as a chain or tree draft (no training).

    `model` is the `early_exit_model` (the target's own modules); its state is one part,
    `cache` (a `DraftCache` over its n_layers layers). `sampler` draws each token when sampling
    (default `draw`: q processed as p is).
    """

    def __init__(self, target: torch.nn.Module, n_layers: int, sampler: Sampler = draw) -> None:
        super().__init__(early_exit_model(target, n_layers), sampler)
        self.target = target
        self.n_layers = n_layers

    def __repr__(self) -> str:
        return f"SelfDraft(n_layers={self.n_layers} of {self.target.config.n_layer})"
