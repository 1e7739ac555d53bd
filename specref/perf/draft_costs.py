"""What a draft costs: to have (parameters, KV cache) and per step on a modelled GPU, from its size (chapter 5).

To have: `own_parameters` counts the parameters a draft adds to the target (shared
embeddings and LM head excluded); `kv_bytes_per_token` the KV cache it keeps beside the
target's, per token of context.

Per step, modelled: a decode pass at batch 1 reads every weight it uses once, so on a
GPU it costs its bytes over the memory bandwidth until the tokens it scores make the
arithmetic slower than that (the roofline, `PassModel.roofline`). `step_passes` lists the
passes one chain step of a draft makes and the weights each reads, from the objects:

    ModelDraft      k passes, each over its whole model (its tied LM head once; position table not read)
    SelfDraft       k passes of the target's first n blocks and its ln_f, each with the target's LM head
    EagleDraft      k passes of its layer, each with the target's LM head; EAGLE-3's fusing layer once
    MTPDraft        pass d runs module d (d = 1..k), each with the target's LM head
    MedusaDraft     one pass: heads 1..k on one feature, the target's LM head over k vectors
    PromptLookup    no pass (a search in the token buffer), as for NoDraft

`ServingShape` scales the bundled GPT-2 to a serving-size target of the same structure:
every weight dimension equal to the vocabulary becomes the new vocabulary, every multiple
of the width the same multiple of the new width, and the target has `n_layer` blocks;
each draft keeps its own structure (one block stays one block). `gpu_step_cost` is a
draft step in target passes (the chapter's d = c k for drafts whose passes cost alike) and
`gpu_verify_cost` a target pass over T tokens in plain passes (v). Left out, as in the
chapter's estimate: KV-cache reads and attention, kernel-launch overhead, and the
host's work (prompt lookup's search, the acceptance rule).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .._validate import check_gpt2, check_int
from ..drafts import EagleDraft, MedusaDraft, ModelDraft, MTPDraft, NoDraft, PromptLookupDraft
from ..drafts.base import Draft
from ..drafts.cached import DraftCache
from ..drafts.early_exit import SelfDraft
from ..models.kvcache import KVCache
from .costmodel import H100_BANDWIDTH, H100_BF16_FLOPS, PassModel


def _check_draft(draft: object) -> Draft:
    if not isinstance(draft, Draft):
        raise TypeError(f"draft must be a specref Draft (e.g. from specref.drafts.load_draft), got "
                        f"{type(draft).__name__}")
    return draft


def _members(draft: Draft) -> list[object]:
    """The draft's attributes, lists and tuples unpacked (its modules and caches live there)."""
    return [m for v in vars(draft).values() for m in (v if isinstance(v, (list, tuple)) else [v])]


def own_parameters(draft: Draft, target: torch.nn.Module) -> int:
    """Parameters of the draft's own modules that the target does not hold (its shared embeddings and LM head excluded)."""
    draft, target = _check_draft(draft), check_gpt2(target)
    shared = {p.data_ptr() for p in target.parameters()}
    mods = [m for m in _members(draft) if isinstance(m, torch.nn.Module) and m is not target]
    params = {p.data_ptr(): p for m in mods for p in m.parameters()}
    return sum(p.numel() for ptr, p in params.items() if ptr not in shared)


def kv_bytes_per_token(draft: Draft) -> int:
    """Bytes of KV cache the draft holds per token of context: 2 (K and V) x layers x heads x head_dim x element size.

    Read from the caches the draft holds, so call it after a generation (a draft allocates its
    caches in `begin` or at its first proposal); a draft without a cache gives 0.
    """
    draft = _check_draft(draft)
    members = [m.kv if isinstance(m, DraftCache) else m for m in _members(draft)]  # a DraftCache part holds its kv
    caches = [c for c in members if isinstance(c, KVCache)]
    return sum(2 * c.k.shape[0] * c.k.shape[2] * c.k.shape[4] * c.k.element_size() for c in caches)


@dataclass(frozen=True)
class Pass:
    """One forward pass of a draft step: the draft's own weight shapes it reads (each once), whether it also reads
    the target's LM head, and the token vectors it scores."""

    shapes: tuple[tuple[int, ...], ...]
    tokens: int
    target_head: bool = False


def _shapes(params: Iterable[torch.Tensor], skip: frozenset[int] | set[int] = frozenset()) -> tuple[tuple[int, ...], ...]:
    seen: dict[int, tuple[int, ...]] = {}
    for p in params:
        if p.data_ptr() not in skip:
            seen.setdefault(p.data_ptr(), tuple(p.shape))
    return tuple(seen.values())


def step_passes(draft: Draft, target: torch.nn.Module, k: int) -> list[Pass]:
    """The passes one chain step of k drafts makes, and what each reads (see the module docstring)."""
    draft, target = _check_draft(draft), check_gpt2(target)
    k = check_int("k", k, 1, "drafted tokens per step")
    max_k = getattr(draft, "max_k", None)
    if max_k is not None and k > max_k:
        raise ValueError(f"k={k} but this {type(draft).__name__} drafts at most {max_k} tokens per step")
    if isinstance(draft, (PromptLookupDraft, NoDraft)):
        return []
    if isinstance(draft, SelfDraft):  # before ModelDraft: the blocks are the target's, and so is the LM head
        tr = draft.model.transformer
        body = _shapes([p for block in tr.h for p in block.parameters()] + list(tr.ln_f.parameters()))
        return [Pass(body, 1, True) for _ in range(k)]
    if isinstance(draft, ModelDraft):
        m = draft.model
        skip = {m.transformer.wpe.weight.data_ptr()}  # a position is a row looked up, not a matrix read
        return [Pass(_shapes(m.parameters(), skip), 1) for _ in range(k)]
    if isinstance(draft, EagleDraft):
        layer = draft.layer
        fuse = set() if layer.fuse_fc is None else {p.data_ptr() for p in layer.fuse_fc.parameters()}
        body = _shapes(layer.parameters(), fuse)
        first = _shapes(layer.parameters())  # the catch-up pass fuses the target's features
        return [Pass(first if i == 0 else body, 1, True) for i in range(k)]
    if isinstance(draft, MTPDraft):
        return [Pass(_shapes(draft.modules[d].parameters()), 1, True) for d in range(k)]
    if isinstance(draft, MedusaDraft):
        h = draft.heads  # heads 1..k: weight [n, C, C], bias [n, C]
        return [Pass(((k,) + tuple(h.weight.shape[1:]), (k,) + tuple(h.bias.shape[1:])), k, True)]
    raise TypeError(f"no step model for a {type(draft).__name__}: step_passes knows ModelDraft, SelfDraft, EagleDraft, "
                    f"MTPDraft, MedusaDraft, PromptLookupDraft and NoDraft")


@dataclass(frozen=True)
class ServingShape:
    """A target of the bundled GPT-2's structure at serving size, on a GPU; defaults: a 7B-class model on an H100.

    32 blocks of width 4096 with a 32,000-token vocabulary hold about 6.6B parameters.
    `efficiency` is the fraction of the bf16 peak the matmuls reach (an assumption, as in
    `h100_cost_model`); it only matters once a pass scores more tokens than the ridge.
    """

    n_layer: int = 32
    n_embd: int = 4096
    vocab_size: int = 32_000
    bytes_per_param: float = 2.0
    bandwidth: float = H100_BANDWIDTH  # bytes/s
    peak_flops: float = H100_BF16_FLOPS  # FLOP/s
    efficiency: float = 0.4

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "vocab_size"):
            check_int(name, getattr(self, name), 1, "a size")
        for name in ("bytes_per_param", "bandwidth", "peak_flops", "efficiency"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.efficiency > 1:
            raise ValueError(f"efficiency is a fraction of peak, in (0, 1], got {self.efficiency}")

    def scaled(self, shape: tuple[int, ...], target: torch.nn.Module) -> int:
        """Elements of a weight of `shape` (on the bundled target's scale) at this size (see the module docstring)."""
        C, V = target.config.n_embd, target.config.vocab_size
        n = 1
        for d in shape:
            n *= self.vocab_size if d == V else (d // C) * self.n_embd if d % C == 0 else d
        return n

    def head_params(self, target: torch.nn.Module) -> int:
        """Parameters of the target's LM head at this size (vocabulary x width)."""
        return self.scaled(tuple(check_gpt2(target).lm_head.weight.shape), target)

    def pass_params(self, p: Pass, target: torch.nn.Module) -> int:
        """Weights one draft pass reads at this size: its own, plus the target's LM head if it uses it."""
        return sum(self.scaled(s, target) for s in p.shapes) + (self.head_params(target) if p.target_head else 0)

    def draft_params(self, draft: Draft, target: torch.nn.Module) -> int:
        """The draft's own parameters at this size: what its longest step reads, the shared LM head left out."""
        draft = _check_draft(draft)
        if isinstance(draft, (PromptLookupDraft, NoDraft)):
            return 0
        passes = step_passes(draft, target, getattr(draft, "max_k", None) or 1)  # one pass already reads it all
        return sum(self.scaled(s, target) for p in passes for s in p.shapes)

    def target_params(self, target: torch.nn.Module) -> int:
        """Parameters one target pass reads at this size: n_layer blocks, the final norm and the LM head."""
        target = check_gpt2(target)
        block = sum(self.scaled(tuple(p.shape), target) for p in target.transformer.h[0].parameters())
        ln_f = sum(self.scaled(tuple(p.shape), target) for p in target.transformer.ln_f.parameters())
        return self.n_layer * block + ln_f + self.head_params(target)

    def roofline(self, n_params: float) -> PassModel:
        """Seconds of a pass reading n_params weights, memory- or compute-bound (`PassModel.roofline`)."""
        return PassModel.roofline(n_params, self.bandwidth, self.peak_flops, self.bytes_per_param,
                                  efficiency=self.efficiency)


def gpu_step_cost(draft: Draft, target: torch.nn.Module, k: int, shape: ServingShape = ServingShape()) -> float:
    """A chain step's draft cost d at serving size, in plain target passes: sum over `step_passes` of each roofline time."""
    if not isinstance(shape, ServingShape):
        raise TypeError(f"shape must be a ServingShape, got {type(shape).__name__}")
    plain = shape.roofline(shape.target_params(target))(1, 1, 0)
    total = sum(shape.roofline(shape.pass_params(p, target))(1, p.tokens, 0) for p in step_passes(draft, target, k))
    return float(total / plain)


def gpu_verify_cost(target: torch.nn.Module, n_tokens: float, shape: ServingShape = ServingShape()) -> float:
    """v: a target pass over n_tokens tokens at batch 1 at serving size, in plain passes (1 below the ridge)."""
    if not isinstance(shape, ServingShape):
        raise TypeError(f"shape must be a ServingShape, got {type(shape).__name__}")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, float)) or not n_tokens >= 1:
        raise ValueError(f"n_tokens must be a number >= 1 (tokens one pass scores), got {n_tokens!r}")
    model = shape.roofline(shape.target_params(target))
    return float(model(1, n_tokens, 0) / model(1, 1, 0))
