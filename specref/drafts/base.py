"""Drafts: anything that proposes tokens with the distribution q it drew them from.

One contract, `Draft`: `begin(batch_size)` starts a generation; `propose` answers drafts [B, k'] and
q [B, k', V] (a tree draft, `TreeDraft`, also `propose_tree`: one `Tree` per row), both reading the
shared token buffer; after each verification `rollback(n_valid)` says how many leading tokens of each
row are still the ones it saw. A draft hands `begin` and `rollback` on to the parts that hold its
state (`DraftCache`, `FeatureBuffer`); the generation's `Session` (`join`) hands out its caches.

The feature hook (Medusa, EAGLE, MTP): a draft that sets `feature_layers` (indices into
`GPT2Output.hidden_states`: 0 = the embeddings, i = the input of block i, n_layer = after ln_f)
gets them from every target pass (prefill included), before `rollback`, through `observe`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from .._validate import check_int, check_rows
from ..models.session import Session
from ..sampling import SamplingParams, _sample
from ..tree_shapes import TreeSpec
from ..trees import Tree

__all__ = ["Draft", "NoDraft", "TreeDraft", "draw", "one_hot"]

# sampler(logits [B, V], params, generator) -> (x [B], q [B, V]): how a draft draws one token when sampling.
Sampler = Callable[[torch.Tensor, SamplingParams, torch.Generator | None], tuple[torch.Tensor, torch.Tensor]]


def one_hot(x: torch.Tensor, V: int, dtype: torch.dtype) -> torch.Tensor:  # [...] -> [..., V]
    """q for a deterministic token: 1 at x (in [0, V)), 0 elsewhere; unlike `F.one_hot`, it reads nothing back."""
    return torch.zeros((*x.shape, V), dtype=dtype, device=x.device).scatter_(-1, x[..., None], 1)


def draw(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:  # [..., V] -> x [...], q [..., V]
    """One token per row and the q it was drawn from: the argmax (one-hot q) when greedy, else x ~ q (as p)."""
    if params.greedy:
        x = logits.argmax(-1)
        return x, one_hot(x, logits.shape[-1], logits.dtype)
    q = params.probs_unchecked(logits)
    return _sample(q, generator), q


def check_k(k: object, max_k: int | None, why: str = "") -> int:
    """k as an int in 0..max_k (None: no upper limit); `why` says what sets the limit, for the error."""
    k = check_int("k", k, 0, "tokens to propose")
    if max_k is not None and k > max_k:
        raise ValueError(f"k={k} but {why}, so k must be <= {max_k}")
    return k


class Draft(ABC):
    """A draft: `begin`, then alternately `propose` (or `propose_tree`), `observe` if it reads features, `rollback`.

    A subclass defines `propose` (and `propose_tree`); it extends `begin` and `rollback`, calling these first.
    """

    vocab_size: int
    max_k: int | None = None  # the most tokens one chain proposal may hold; None: no limit
    feature_layers: tuple[int, ...] = ()  # the target's hidden states this draft reads; () reads none
    batch_size: int | None = None  # None until `begin`
    passes: int = 0  # the draft's forward passes so far (the tree step reports how many a tree took)
    session: Session | None = None  # this generation's (`join`, then `begin`); None: a draft begun by hand
    _joined: Session | None = None

    def join(self, session: Session) -> None:
        """The next generation runs in `session` (its caches come from it); `begin` then makes it `self.session`."""
        if not isinstance(session, Session):
            raise TypeError(f"session must be a specref.models.session.Session, got {type(session).__name__}")
        self._joined = session

    @property
    def run_rows(self) -> int | None:
        """The longest row of this generation (its session's); None for a draft begun by hand (its window)."""
        return None if self.session is None else self.session.rows

    @property
    def trusted(self) -> bool:
        """Whether the package vouches for this draft's proposals: its `propose` is one of `specref.drafts`' own and
        it draws with `draw` (the loop then checks a proposal's shapes only; a learner's draft, every step)."""
        propose = getattr(type(self), "propose", None)
        return getattr(propose, "__module__", "").startswith("specref.drafts.") \
            and getattr(self, "sampler", draw) is draw

    def begin(self, batch_size: int) -> None:
        """Start a new generation of `batch_size` sequences (a subclass then has its parts forget their state)."""
        self.batch_size = check_int("batch_size", batch_size, 1, "sequences in the batch")
        self.session, self._joined = self._joined, None

    def begun(self, what: str = "propose") -> int:
        """The batch size; RuntimeError if `begin` has not been called before `what`."""
        if self.batch_size is None:
            raise RuntimeError(f"call begin(batch_size) before {what}")
        return self.batch_size

    def empty(self, tokens: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:  # [B, 0], [B, 0, V]
        """The proposal of no tokens (k = 0): the step verifies none and is a plain decoding step."""
        B = tokens.shape[0]
        return tokens.new_zeros((B, 0)), torch.zeros((B, 0, self.vocab_size), dtype=dtype, device=tokens.device)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        """Only the first n_valid[b] tokens of row b are still what the draft last saw (checked here: shape only)."""
        check_rows("n_valid", n_valid, self.begun("rollback"))

    def observe(self, features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> None:  # ([B, T, C], ...), [B]
        """The target's hidden states feature_layers[j] -> features[j] for buffer positions starts[b] .. + T - 1
        (in a tree step, the root and the accepted path, contiguous)."""
        raise NotImplementedError(f"{type(self).__name__} sets feature_layers={self.feature_layers!r} "
                                  f"but does not implement observe(features, starts)")

    @abstractmethod
    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # draft tokens [B, k'], q [B, k', V]
        """Propose k' <= k tokens after each sequence (k' the same in every row; none makes a plain decoding step),
        with the q each was drawn from."""

    def propose_tree(
        self,
        tokens: torch.Tensor,  # [B, L] buffer; row b holds lengths[b] valid tokens
        lengths: torch.Tensor,  # [B]
        spec: TreeSpec,  # a TreeShape or DynamicTree (specref.drafts.shapes)
        params: SamplingParams,
        generator: torch.Generator | None = None,
        max_depth: int | None = None,
        max_nodes: int | None = None,
    ) -> list[Tree]:
        """One tree per row after its context, at most max_depth deep and max_nodes large (a tree draft's own)."""
        raise NotImplementedError(f"{type(self).__name__} grows no trees: it defines no propose_tree")


class TreeDraft(ABC):
    """`isinstance(d, TreeDraft)` holds for a `Draft` whose class defines `propose_tree` (not a base to inherit)."""

    @abstractmethod
    def propose_tree(self, *args: object, **kwargs: object) -> list[Tree]:
        """`Draft.propose_tree`, which such a draft's class defines."""

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        if cls is TreeDraft and issubclass(other, Draft) and other.propose_tree is not Draft.propose_tree:
            return True
        return NotImplemented  # otherwise ordinary inheritance decides


class NoDraft(Draft):
    """Proposes nothing, ever: every step is a plain one (the loop's own cost, next to `generate`'s)."""

    def __init__(self, vocab_size: int, dtype: torch.dtype = torch.float32) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, 1, "the target's vocabulary")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype for q, got {dtype!r}")
        self.dtype = dtype

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # [B, 0], [B, 0, V]
        self.begun()
        return self.empty(tokens, self.dtype)

    def rollback(self, n_valid: torch.Tensor) -> None:  # [B]
        pass  # no state, and no check: the loop's own cost is what this draft measures
