"""Reads back to the host, counted on the CPU: the core pass makes none, a speculative step one or two.

On a GPU every value the host reads from the device (`int(t)`, `bool(t)`, `.item()`, `.tolist()`, a
data-dependent shape such as `nonzero`) waits for all the work queued before it: the launch pipeline
drains, and a pass can no longer be captured as a CUDA graph. The same reads happen on a CPU, where
they cost nothing, so they can be counted there: `HostReads` is a `TorchDispatchMode` that counts the
aten ops that hand a tensor's value to the host (`_local_scalar_dense`, behind `int`, `bool`, `float`
and `.item()`; `nonzero`, `equal`, `is_nonzero`, `unique`, `masked_select`) and, since a CPU tensor's
`.tolist()`, `.cpu()` and `.numpy()` do not pass through the dispatcher, those calls too.

The rules proved here: `GPT2.step` (the unchecked core of `GPT2.forward`) and the one-block heads'
unchecked attention read nothing back; a chain step reads back at most a bound per draft kind, and
the greedy step with a model draft at most twice (its accepted counts; the draft's catch-up width).
The negative controls: the same counter sees the checked `GPT2.forward`'s reads and a function that
reads deliberately, so a pass that starts reading back fails these tests.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specref.decoding.chain import speculative_generate
from specref.decoding.lookahead import lookahead_generate
from specref.decoding.tree import tree_generate
from specref.drafts import NoDraft
from specref.drafts.eagle import EagleDraft
from specref.drafts.heads import load_bundled_heads
from specref.drafts.medusa import MedusaDraft
from specref.drafts.model import ModelDraft, TreeModelDraft
from specref.drafts.mtp import MTPDraft
from specref.drafts.prompt_lookup import PromptLookupDraft
from specref.models.pair import heldout_prompts, load_pair

_READS = {"aten._local_scalar_dense", "aten.nonzero", "aten.equal", "aten.is_nonzero", "aten._unique2",
          "aten.unique_dim", "aten.unique_consecutive", "aten.masked_select"}
_PY_READS = ("tolist", "cpu", "numpy")  # host reads of a CPU tensor that bypass the dispatcher


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values by the host while active: `count`, and `ops` by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self._saved: dict[str, object] = {}

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if name in _READS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for attr in _PY_READS:
            real = getattr(torch.Tensor, attr)
            self._saved[attr] = real

            def counted(t, *a, _real=real, _attr=attr, **kw):
                self.ops[f"Tensor.{_attr}"] += 1
                return _real(t, *a, **kw)

            setattr(torch.Tensor, attr, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for attr, real in self._saved.items():
            setattr(torch.Tensor, attr, real)
        return super().__exit__(*exc)


@pytest.fixture(scope="module")
def pair():
    target, draft, _ = load_pair()
    return target, draft


@pytest.fixture(scope="module")
def prompts():
    return torch.tensor([p[:24] for p in heldout_prompts(2, 24)])  # [2, 24]


# -- the core pass ------------------------------------------------------------------------------------------


def test_the_counter_sees_a_deliberate_read_and_the_checked_forward_s_reads(pair, prompts):
    target, _ = pair
    x = torch.arange(5)
    with HostReads() as reads:
        int(x.max())
        bool((x > 2).any())
        x.tolist()
        x.nonzero()
    assert reads.count == 4, reads.ops
    cache = target.new_cache(2, max_len=64)
    with torch.no_grad(), HostReads() as reads:
        target(prompts[:, :8], cache=cache)  # checked: token ids, the cache's length
        target(prompts[:, 8:9], cache=cache, attention_mask=torch.ones(1, 1, 1, dtype=torch.bool))
    print(f"checked GPT2.forward, 2 passes: {reads.count} reads back {dict(reads.ops)}")
    assert reads.count >= 4, reads.ops


@pytest.mark.parametrize("T", [1, 5])
def test_the_core_pass_reads_nothing_back(pair, prompts, T):
    target, _ = pair
    cache = target.new_cache(2, max_len=64)
    with torch.no_grad():
        target(prompts[:, :10], cache=cache)
        cache.truncate(torch.tensor([10, 7]))  # rows of different lengths: stale slots to mask
        ids = prompts[:, 10 : 10 + T]
        tree = torch.tril(torch.ones(1, T, T, dtype=torch.bool))
        tree[0, -1, :-1] = False  # a node that sees only the cache and itself
        with HostReads() as reads:
            target(ids, cache=cache, checked=False)
            target.step(ids, cache=cache, position_ids=cache.lengths[:, None] + torch.arange(T),
                        attention_mask=tree, return_hidden=True, logits_to_keep=1)
    assert reads.count == 0, reads.ops
    assert cache.lengths.tolist() == [10 + 2 * T, 7 + 2 * T] and cache.bound == 10 + 2 * T


def test_the_core_pass_attends_as_the_checked_forward_over_a_bucketed_capacity(pair, prompts):
    target, _ = pair
    a, b = target.new_cache(2, max_len=64), target.new_cache(2, max_len=64)
    with torch.no_grad():
        for cache in (a, b):
            target(prompts[:, :10], cache=cache)
            cache.truncate(torch.tensor([10, 7]))
        assert a.capacity(3) == 16 and a.capacity(7) == 32  # the next power of two, at least 16
        checked = target(prompts[:, 10:13], cache=a)
        core = target.step(prompts[:, 10:13], cache=b)
    torch.testing.assert_close(core, checked)
    assert torch.equal(a.lengths, b.lengths)


def test_the_heads_core_attention_reads_nothing_back(pair):
    target, _ = pair
    layer, _ = load_bundled_heads("eagle1")
    cache = layer.new_cache(2, 32)
    x = torch.randn(2, 3, layer.n_embd, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        layer.attend(x, cache, None)  # checked
        cache.truncate(torch.tensor([3, 1]))
        with HostReads() as reads:
            layer.attend(x[:, :1], cache, None, check=False)
            layer.attend(x, cache, torch.ones(1, 3, 3, dtype=torch.bool), check=False)
    assert reads.count == 0, reads.ops
    assert cache.lengths.tolist() == [7, 5]


# -- a speculative step --------------------------------------------------------------------------------------


def _reads_per_step(run) -> list[int]:
    """Reads back of each step after the first (the first also feeds the prompt), from marks left by on_step."""
    marks: list[int] = []
    with HostReads() as reads:
        run(lambda step: marks.append(reads.count))
    return [b - a for a, b in zip(marks, marks[1:])]


def _drafts(target, draft):
    eagle = EagleDraft.bundled(target)
    medusa, _ = load_bundled_heads("medusa")
    mtp, _ = load_bundled_heads("mtp")
    return {"model": ModelDraft(draft), "nodraft": NoDraft(target.config.vocab_size),
            "prompt_lookup": PromptLookupDraft.for_target(target), "eagle": eagle,
            "medusa": MedusaDraft(target, medusa), "mtp": MTPDraft(target, mtp)}


# The most reads back per chain step, by draft kind and temperature (greedy, sampled). Every step that verifies
# drafts reads once: the accepted counts, with the logits' check; a step with nothing proposed (NoDraft, plain
# decoding's strategy) reads nothing. A model draft's catch-up reads its width; prompt lookup copies
# the buffer to the host (its proposal is a host search); a feature draft checks the features it is handed
# (`FeatureBuffer.observe`), the rows it reads (`scored`) and its rollback's n_valid >= 0 (`FeatureBuffer.rollback`);
# MTP reads each depth's width (k = 3 depths).
# A sampled step reads no more: the rule's check that q(x) > 0 (`chain_verify._verify_chain`) runs only
# for a draft the package does not vouch for (its own drafts sample their tokens from q).
BOUNDS = {"model": (2, 2), "nodraft": (0, 0), "prompt_lookup": (2, 2), "eagle": (5, 5), "medusa": (4, 4),
          "mtp": (7, 7)}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_step_reads_back_at_most_its_bound_per_draft_kind(pair, prompts, temperature):
    target, draft = pair
    found = {}
    for kind, d in _drafts(target, draft).items():
        k = 3 if kind == "mtp" else 4
        per_step = _reads_per_step(lambda on_step, d=d, k=k: speculative_generate(
            target, d, prompts, k=k, max_new_tokens=24, temperature=temperature,
            generator=torch.Generator().manual_seed(1), on_step=on_step))
        found[kind] = max(per_step)
    print(f"temperature {temperature:g}: most reads back per chain step: {found}")
    over = {kind: n for kind, n in found.items() if n > BOUNDS[kind][temperature > 0]}
    assert not over, f"over the bound {BOUNDS}: {over}"


def test_tree_and_lookahead_steps_read_back_a_bounded_number_of_times(pair, prompts):
    target, draft = pair
    tree = _reads_per_step(lambda on_step: tree_generate(target, TreeModelDraft(draft), prompts, (2, 2, 1),
                                                         max_new_tokens=24, temperature=0, on_step=on_step))
    lookahead = _reads_per_step(lambda on_step: lookahead_generate(target, prompts, max_new_tokens=24,
                                                                   temperature=0, on_step=on_step))
    print(f"most reads back per step: tree {max(tree)}, lookahead {max(lookahead)}")
    # Trees are built and verified on the host. Lookahead: the roots, the window's new guesses, the pass's
    # p for each row's trie, the commit. A (2, 2, 1) tree of a model draft: the catch-up, the context and
    # each depth's rows (2), the commit (2); the rest, about 50, are `TreeGrower`'s reads per node
    # (specref/tree_shapes.py) and the checked `SamplingParams.probs` it calls: bounds as measured, so
    # that a new read fails here.
    assert max(tree) <= 59 and max(lookahead) <= 9


def test_plain_decoding_reads_nothing_back_per_token_and_with_eos_one(pair, prompts):
    """`generate` is the chain step with nothing drafted: its reads do not grow with the tokens generated (the
    door's checks only); with an EOS to watch for, each step reads its tokens once (the control)."""
    from specref.decoding.chain import generate

    target, _ = pair

    def reads(n: int, eos: int | None) -> int:
        with HostReads() as counter:
            generate(target, prompts, n, temperature=0, eos_token_id=eos)
        return counter.count

    assert reads(24, None) == reads(4, None)
    never = target.config.vocab_size - 1  # an id the greedy run does not emit in 24 tokens
    assert reads(24, never) - reads(4, never) == 20
