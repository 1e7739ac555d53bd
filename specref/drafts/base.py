"""Drafts: anything that proposes k tokens with the distribution q it drew them from.

One verifier (`specref.decoding.chain.speculative_generate`) serves every draft through
this interface. A draft sees the shared token buffer and keeps whatever state
it likes (a KV cache, an n-gram index); after each verification it is told how
many leading tokens of each sequence are still the ones it saw, and forgets the rest.

The feature hook (Medusa, EAGLE, MTP read the target's hidden states): a draft that
sets `feature_layers` (indices into `GPT2Output.hidden_states` of
`specref.models.gpt2`: 0 = the embeddings, i = the input of block i, n_layer = the
final hidden state after ln_f) is handed those hidden states by the loop through
`observe(features, starts)`: features[j] is [B, T, C] for feature_layers[j], for the T
tokens the target just processed, which are positions starts[b] .. starts[b]+T-1 of
row b of the token buffer. The loop calls it after every target pass (prefill
included) and before `rollback(n_valid)`, which then drops what a row did not keep;
in a tree step it hands over the root and the accepted path only, gathered so the
positions are contiguous. The features come from the verification pass itself: the
target makes no extra pass, and a draft without `feature_layers` (the default, ())
is served exactly as before, its target passes not asked for hidden states.
`specref.drafts.features.FeatureDraft` keeps such features aligned to the buffer.

`TreeDraft` is a draft that grows one tree per row for `specref.decoding.tree.tree_generate`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .._validate import check_int
from ..sampling import SamplingParams, _sample
from ..trees import Tree
from .shapes import DynamicTree, TreeShape


def draw(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:  # [..., V] -> x [...], q [..., V]
    """One draft token per row and the q it was drawn from: the argmax with one-hot q when greedy, else x ~ q.

    q = `params.probs_unchecked(logits)`, the same processing as p (the loop checks the stacked q).
    """
    if params.greedy:
        x = logits.argmax(-1)
        return x, torch.nn.functional.one_hot(x, logits.shape[-1]).to(logits.dtype)
    q = params.probs_unchecked(logits)
    return _sample(q, generator), q


def check_k(k: object, max_k: int | None, why: str) -> int:
    """k as an int in 0..max_k (None: no upper limit); `why` says what sets the limit, for the error."""
    k = check_int("k", k, 0, "tokens to propose")
    if max_k is not None and k > max_k:
        raise ValueError(f"k={k} but {why}, so k must be <= {max_k}")
    return k


class Draft(ABC):
    """The draft interface: `begin`, then alternately `propose` and `rollback`."""

    vocab_size: int
    # The most tokens one chain proposal may hold (Medusa: its heads, MTP: its modules); None: no limit.
    max_k: int | None = None

    @abstractmethod
    def begin(self, batch_size: int) -> None:
        """Start a new generation of `batch_size` sequences (forget all state)."""

    @abstractmethod
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # draft tokens [B, k'], q [B, k', V]
        """Propose k' <= k tokens after each sequence (k' the same in every row), with the q each was drawn from.

        Most drafts propose all k; one with nothing worth proposing may return fewer, none
        included (the step then verifies only those, and with none it is a plain decoding step).
        """

    @abstractmethod
    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Only the first n_valid[b] tokens of row b are still what the draft last saw."""

    # The target's hidden states this draft reads, as indices into GPT2Output.hidden_states; () reads none.
    feature_layers: tuple[int, ...] = ()

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        """The target's hidden states feature_layers[j] -> features[j] for buffer positions starts[b] .. + T - 1.

        Called only for drafts with `feature_layers`, after each target pass and before `rollback`.
        """
        raise NotImplementedError(f"{type(self).__name__} sets feature_layers={self.feature_layers!r} "
                                  f"but does not implement observe(features, starts)")


class TreeDraft(Draft):
    """A draft that grows one tree per row (`tree_generate`): `begin`, then alternately `propose` and `rollback`.

    Given a tree shape (a `TreeShape` or `DynamicTree`) instead of k, `propose` returns the
    trees; a draft that also drafts chains (`MedusaDraft`, `EagleDraft`) tells the two
    calls apart by that argument's type. `passes` counts the draft's forward passes so
    far (the tree step reports how many a tree took).
    """

    passes: int = 0

    @abstractmethod
    def propose(  # type: ignore[override]  # a tree spec instead of k, trees instead of (drafts, q)
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        spec: object,  # a TreeShape or DynamicTree (specref.drafts.shapes)
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        """One tree per row after its context, at most max_depth deep and max_nodes large."""


class ChainOrTreeDraft(TreeDraft):
    """A draft that serves both loops: `propose` with k drafts a chain, with a tree shape grows a tree per row.

    `speculative_generate` passes an int k, `tree_generate` a `TreeShape` or `DynamicTree`;
    the subclass writes `propose_chain` and `propose_tree` (Medusa and EAGLE do).
    """

    @torch.no_grad()
    def propose(  # type: ignore[override]
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int | TreeShape | DynamicTree,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | list[Tree]:  # chain: drafts [B, k], q [B, k, V]; tree: [B] trees
        if isinstance(k, (TreeShape, DynamicTree)):
            return self.propose_tree(tokens, lengths, k, params, generator, max_depth, max_nodes)
        return self.propose_chain(tokens, lengths, k, params, generator)

    @abstractmethod
    def propose_chain(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, k], q [B, k, V]
        """k drafts per row with the q each was drawn from."""

    @abstractmethod
    def propose_tree(
        self,
        tokens: torch.Tensor,  # [B, L]
        lengths: torch.Tensor,  # [B]
        spec: TreeShape | DynamicTree,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        """One tree per row after its context, at most max_depth deep and max_nodes large."""


class NoDraft(Draft):
    """Proposes nothing, ever: every step is a plain one (the loop's own cost, next to `generate`'s)."""

    def __init__(self, vocab_size: int, dtype: torch.dtype = torch.float32) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, 1, "the target's vocabulary")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype for q, got {dtype!r}")
        self.dtype = dtype
        self.batch_size: int | None = None

    def begin(self, batch_size: int) -> None:
        self.batch_size = check_int("batch_size", batch_size, 1, "sequences in the batch")

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # [B, 0], [B, 0, V]
        if self.batch_size is None:
            raise RuntimeError("call begin(batch_size) before propose")
        B = self.batch_size
        return (torch.zeros((B, 0), dtype=torch.long, device=tokens.device),
                torch.zeros((B, 0, self.vocab_size), dtype=self.dtype, device=tokens.device))

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        pass  # no state
