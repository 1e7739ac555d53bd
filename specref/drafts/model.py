"""A smaller language model as the draft, with its own KV cache: a chain of k tokens (`ModelDraft`) or a tree
(`TreeModelDraft`) per step (chapters 4-6).

Rule: feed the tokens the cache has not seen in one pass; then each draft is drawn from q = the processed
logits (one-hot when greedy) and fed to get the next, the last never; a tree grows one masked pass per depth.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._validate import check_rows
from ..models.gpt2 import unchecked
from ..sampling import SamplingParams
from ..tree_shapes import TreeSpec
from ..trees import Tree
from .base import Draft, Sampler, TreeDraft, check_k, draw, one_hot
from .cached import DraftCache, pick

__all__ = ["ModelDraft", "TreeModelDraft", "as_draft", "as_tree_draft"]


class ModelDraft(Draft):
    """A smaller language model as draft: k autoregressive steps with its own KV cache.

    `sampler(logits [B, V], params, generator) -> (x [B], q [B, V])` draws each token when sampling (default
    `draw`); greedy drafts are the argmax. Its state: `cache` (a `DraftCache`; lag 0: cache row s reads x_s).
    """

    def __init__(self, model: torch.nn.Module, sampler: Sampler = draw) -> None:
        if getattr(getattr(model, "config", None), "vocab_size", None) is None:
            raise TypeError(f"the draft must be a GPT2-like model (with config.vocab_size), got {type(model).__name__}")
        if not callable(sampler):
            raise TypeError(f"sampler must be a function (logits, params, generator) -> (x, q), got {sampler!r}")
        self.model = model
        self.cache = DraftCache(model)
        self.vocab_size = int(model.config.vocab_size)
        self.sampler = sampler

    def begin(self, batch_size: int) -> None:
        super().begin(batch_size)
        self.cache.begin(batch_size, self.window, self.session)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        super().rollback(n_valid)
        self.cache.rollback(n_valid)

    @property
    def step(self) -> Callable[..., torch.Tensor]:
        """The draft model's unchecked pass (`GPT2.step`; a wrapper's own forward): the loop checked the inputs."""
        return unchecked(self.model)

    @property
    def window(self) -> int:  # the draft model's context window
        return self.model.config.n_positions

    def context_logits(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # [B, L], [B] -> [B, V]
        """Feed each row's tokens the cache has not seen, in one pass: the logits after the whole context."""
        lengths = check_rows("lengths", lengths, self.begun()).to(tokens.device, torch.long)  # shapes only
        width = check_rows("tokens", tokens, self.batch_size, "[B, L]").shape[1]
        rows = self.cache.catch_up(lengths, limit=width)  # [B, W]
        if not self.cache.padded:  # every row's catch-up ends at its own last token
            return self.step(tokens.gather(1, rows), cache=self.cache.kv, logits_to_keep=1)[:, -1]
        last = lengths[:, None] - 1  # [B, 1] rows of unequal length: padding repeats the last true token
        logits = self.step(tokens.gather(1, torch.minimum(rows, last)), cache=self.cache.kv)  # [B, W, V]
        self.cache.keep_fed()  # drop the padding rows
        return pick(logits, last - rows[:, :1])[:, 0]

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,  # [B, L], [B]
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # [B, k], [B, k, V]
        self.begun()
        if check_k(k, None) == 0:
            return self.empty(tokens, torch.float32)
        logits = self.context_logits(tokens, lengths)  # [B, V]
        drafts, qs = [], []
        for i in range(k):
            if params.greedy:  # q is one-hot on the argmax; build it once, after the loop
                x = logits.argmax(-1)
            else:
                x, q = self.sampler(logits, params, generator)
                qs.append(q)
            drafts.append(x)
            if i < k - 1:  # the last draft is never fed: the target scores it
                logits = self.step(x[:, None], cache=self.cache.kv)[:, -1]
        self.cache.fed = self.cache.fed + (k - 1)  # drafts 1 .. k-1 stay until the rollback drops the rejected
        x = torch.stack(drafts, 1)  # [B, k]
        if params.greedy:
            return x, one_hot(x, self.vocab_size, logits.dtype)
        return x, torch.stack(qs, 1)


def as_draft(draft: object) -> Draft:
    """Wrap a bare model (a GPT2-like module with new_cache()) as a `ModelDraft`; pass `Draft` objects through."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "new_cache"):
        return ModelDraft(draft)
    raise TypeError(f"draft must be a Draft or a GPT2-like model with new_cache(), got {type(draft).__name__}")


class TreeModelDraft(ModelDraft):
    """A smaller language model that grows one draft tree per row (and chains, as a `ModelDraft`)."""

    @torch.no_grad()
    def propose_tree(self, tokens: torch.Tensor, lengths: torch.Tensor, spec: TreeSpec,  # [B, L], [B]
                     params: SamplingParams, generator: torch.Generator | None = None, max_depth: int | None = None,
                     max_nodes: int | None = None) -> list[Tree]:
        """One tree per row after its context, grown by a `TreeGrower` (one draft pass per depth)."""
        root_logits = self.context_logits(tokens, lengths)[:, None]  # [B, 1, V]
        self.passes += 1
        context = self.cache.fed.clone()
        grower = self.cache.tree_grower(spec, root_logits, context, params, generator, max_depth, max_nodes)
        while not grower.done:  # one masked pass per deeper depth
            ids, rows, mask, _, index = self.cache.feed_ancestors(grower, context)
            self.passes += 1
            logits = self.step(ids, cache=self.cache.kv, position_ids=rows, attention_mask=mask)  # row s: position s
            grower.grow(pick(logits, index))
        return self.cache.tree_result(grower, context)


def as_tree_draft(draft: object) -> TreeDraft:
    """A tree draft: pass a `TreeDraft` through; wrap a `ModelDraft`'s model or a bare model as a `TreeModelDraft`."""
    if isinstance(draft, TreeDraft):
        return draft
    if isinstance(draft, ModelDraft):
        return TreeModelDraft(draft.model)
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "new_cache"):
        return TreeModelDraft(draft)
    raise TypeError(f"tree drafting needs a TreeDraft, a draft model (a GPT2-like module) or a ModelDraft, "
                    f"got {type(draft).__name__}")
