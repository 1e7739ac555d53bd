"""MedusaDraft: k heads on the target's newest feature; its q is the heads' softmax on the feature training used,
a sampled Medusa tree step emits exactly the target's distribution, and the features held after a rollback are a
recompute's.

The heads are random (seeded), so nothing waits for training. What every draft must do (the proposal's form,
greedy and sampled chains and greedy trees equal to the target's output, the shipped heads on the bundled and
the grown target) is tests/test_draft_contract.py's.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from model_factory import small_gpt2, tiny_pair

from specref.checks.exact_trees import extended_distribution, target_distribution, target_rows, verify_tree_softmax_q
from specref.checks.rng import exact_distribution
from specref.decoding.chain import speculative_generate, speculative_step
from specref.decoding.loop import Sequences, SpecStats, prefill
from specref.decoding.tree import tree_generate, tree_step
from specref.drafts import MedusaDraft
from specref.drafts.heads import MedusaHeads
from specref.drafts.shapes import TreeShape
from specref.sampling import SamplingParams
from specref.trees import verify_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "training"))  # heads_alignment
from heads_alignment import medusa_inputs  # noqa: E402


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    """|got - want| <= atol everywhere, shapes equal (torch.testing.assert_close costs a second to import)."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    err = float((got - want).detach().abs().max()) if got.numel() else 0.0
    assert err <= atol, f"max |difference| {err:.3g} > {atol:.3g}"


def random_heads(target, n_heads: int, seed: int, scale: float = 1.0) -> MedusaHeads:
    """Medusa heads with seeded random weights, in the target's dtype (trained ones start at W = 0)."""
    C = target.config.n_embd
    g = torch.Generator().manual_seed(seed)
    heads = MedusaHeads(C, n_heads)
    with torch.no_grad():
        heads.weight.copy_(torch.randn(heads.weight.shape, generator=g) * scale / C**0.5)
        heads.bias.copy_(torch.randn(heads.bias.shape, generator=g) * scale)
    return heads.to(target.dtype).eval()


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=24, n_embd=32, n_layer=2, seed=0, scale=20.0)


@pytest.fixture(scope="module")
def draft(target):
    return MedusaDraft(target, random_heads(target, 8, seed=1, scale=3.0))


# -- what the heads are fed -----------------------------------------------------------------------


def test_q_is_each_heads_softmax_on_the_feature_training_used(target, draft):
    # Training (medusa_inputs) gives head i the feature f_t and labels x_{t+2+i}; decoding must feed f_t at
    # t = length - 2, the newest position the verification pass scored, and draft position i + 1 from head i.
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]])
    params = SamplingParams(0.8)
    draft.begin(2)
    prefill(target, ids, target.new_cache(2), SpecStats(k=1), draft)
    _, q = draft.propose(ids, torch.tensor([7, 7]), 8, params, torch.Generator().manual_seed(0))
    f = medusa_inputs(target(ids[:, :-1], return_hidden=True).hidden_states, 1).h  # [B, 6, C]
    expected = params.probs(draft.heads.logits(f[:, -1:], target.lm_head)[:, 0])  # [B, 8, V]
    assert_close(q, expected, 1e-12)


def test_a_medusa_tree_has_each_heads_top_tokens_at_its_depth(target, draft):
    ids = torch.tensor([[4, 4, 2, 9, 1]])
    draft.begin(1)
    prefill(target, ids, target.new_cache(1), SpecStats(k=1), draft)
    (tree,) = draft.propose_tree(ids, torch.tensor([5]), TreeShape((3, 2)), SamplingParams(0.0))
    logits = draft.head_logits(ids, torch.tensor([5]), 2)[0]  # [2, V]
    top = [logits[d].topk(3 if d == 0 else 2).indices.tolist() for d in range(2)]
    assert list(tree.tokens[:3]) == top[0]
    assert [list(tree.tokens[3 + 2 * j : 5 + 2 * j]) for j in range(3)] == [top[1]] * 3  # the same under every node
    assert tree.mode == "deterministic"


# -- sampling: a Medusa tree step emits exactly the target's distribution -----------------------------


@pytest.fixture(scope="module")
def tiny():
    target, _ = tiny_pair()
    return target, random_heads(target, 3, seed=7, scale=2.0)


def _tree_step_error(target, heads, spec, params, rule) -> float:
    """max |P(a Medusa tree step, then the target, emits y) - P(the target emits y)| over y of depth + 1 tokens,
    by exact enumeration of the rule's draws on the tree MedusaDraft grows after the prompt [1, 2].

    One step is enough: every step starts from the context alone, so if each step's output follows the
    target given its context, the whole generation does (chapter 6)."""
    prompt = [1, 2]
    draft = MedusaDraft(target, heads)
    ids = torch.tensor([prompt])
    draft.begin(1)
    prefill(target, ids, target.new_cache(1), SpecStats(k=1), draft)
    (tree,) = draft.propose_tree(ids, torch.tensor([2]), spec, params)

    @functools.cache
    @torch.no_grad()
    def p_of(path: tuple[int, ...]) -> torch.Tensor:  # [V] the target's processed p after prompt + path
        return params.probs(target(torch.tensor([prompt + list(path)]))[0, -1])

    rows = target_rows(tree, p_of)
    step = exact_distribution(lambda rng: tuple(rule(tree, rows, rng=rng).tokens), max_draws=1000)
    L = spec.depth + 1
    return float((extended_distribution(step, p_of, L) - target_distribution(p_of, L)).abs().max())


@pytest.mark.parametrize("spec,params", [(TreeShape((3, 2)), SamplingParams(1.0)),
                                         (TreeShape((2, 2, 1)), SamplingParams(0.7, top_k=4))], ids=repr)
def test_a_sampled_medusa_tree_step_emits_exactly_the_targets_distribution(tiny, spec, params):
    target, heads = tiny
    assert _tree_step_error(target, heads, spec, params, verify_tree) < 1e-12


def test_negative_control_top_b_children_verified_against_the_heads_softmax_are_flagged(tiny):
    # The same enumeration flags the rule that treats the heads' top-b children as draws from their softmax.
    target, heads = tiny
    assert _tree_step_error(target, heads, TreeShape((3, 2)), SamplingParams(1.0), verify_tree_softmax_q) > 1e-3


# -- rollback: the features held are a recompute of the kept tokens -------------------------------------


def _assert_features_are_a_recompute(target, draft, seqs) -> None:
    """Row b holds the target's last hidden state of tokens 0 .. length_b - 2, equal to a fresh pass over them."""
    held = draft.features.held().tolist()
    for b, n in enumerate(seqs.lengths_h):
        if seqs.done_h[b]:
            continue
        assert held[b] == n - 1, f"row {b}: holds the features of {held[b]} positions, its context needs {n - 1}"
        fresh = target(seqs.tokens[b : b + 1, : n - 1], return_hidden=True).hidden_states[-1][0]  # [n-1, C]
        assert_close(draft.features.buffers[0][b, : n - 1], fresh, 1e-10)


def test_chain_features_after_rollback_equal_a_recompute(target, draft):
    # Sampling: drafts are accepted and rejected, and the rows' lengths drift apart.
    ids = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5], [3, 3, 3, 3, 3]])
    seqs, cache = Sequences(ids, 24), target.new_cache(3)
    draft.begin(3)
    prefill(target, ids, cache, SpecStats(k=1), draft)
    g, rejected, uneven = torch.Generator().manual_seed(0), 0, False
    while not seqs.done:
        step = speculative_step(target, draft, seqs, cache, 4, SamplingParams(1.0), g)
        rejected += sum(n < step.drafts.shape[1] for n in step.n_accepted)
        uneven |= len(set(seqs.lengths_h)) > 1
        _assert_features_are_a_recompute(target, draft, seqs)
    assert rejected > 0 and uneven, "no rejection, or rows never had different lengths: rollback was not exercised"


def test_tree_features_after_rollback_equal_a_recompute(target, draft):
    ids = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    seqs, cache = Sequences(ids, 24), target.new_cache(2)
    draft.begin(2)
    prefill(target, ids, cache, SpecStats(k=1), draft)
    rejected = 0
    while not seqs.done:
        step = tree_step(target, draft, seqs, cache, TreeShape((2, 2, 1)), SamplingParams(0.0))
        rejected += sum(r.n_accepted < 3 for r in step.results)
        _assert_features_are_a_recompute(target, draft, seqs)
    assert rejected > 0


# -- bad input ---------------------------------------------------------------------------------


def test_k_beyond_the_heads_is_refused(target):
    draft = MedusaDraft(target, random_heads(target, 3, seed=1))
    with pytest.raises(ValueError, match="k=4 but this Medusa draft has 3 heads"):
        speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), k=4, max_new_tokens=8, temperature=0)
    with pytest.raises(ValueError, match="a tree of depth 4 needs 4 Medusa heads"):
        tree_generate(target, draft, torch.tensor([[1, 2, 3]]), (2, 1, 1, 1), max_new_tokens=8, temperature=0)


def test_heads_for_another_width_are_refused(target):
    with pytest.raises(ValueError, match="n_embd is 32"):
        MedusaDraft(target, MedusaHeads(16, 2).double())
    with pytest.raises(TypeError, match="MedusaHeads"):
        MedusaDraft(target, torch.nn.Linear(32, 32))
    with pytest.raises(TypeError, match="GPT-2 model"):
        MedusaDraft("gpt2", MedusaHeads(32, 2))


def test_a_draft_built_for_another_target_is_refused(target, draft):
    ids = torch.tensor([[1, 2, 3]])
    deeper = small_gpt2(vocab=24, n_embd=32, n_layer=1, seed=0)  # reads hidden state 2, which it does not have
    with pytest.raises(ValueError, match="built for another target"):
        speculative_generate(deeper, draft, ids, k=2, max_new_tokens=4)
    wider = small_gpt2(vocab=24, n_embd=48, n_layer=2, seed=0)
    with pytest.raises(ValueError, match="features of width 32.*width 48"):
        speculative_generate(wider, draft, ids, k=2, max_new_tokens=4)


def test_heads_in_another_dtype_than_the_target_are_refused(target):
    with pytest.raises(ValueError, match="float64.*float32.*one device and dtype"):
        speculative_generate(target, MedusaDraft(target, random_heads(target, 2, seed=1).float()), torch.tensor([[1, 2, 3]]), k=2, max_new_tokens=4)


def test_propose_without_the_targets_features_is_refused(target):
    draft = MedusaDraft(target, random_heads(target, 2, seed=1))
    draft.begin(1)
    with pytest.raises(RuntimeError, match="observe"):
        draft.propose(torch.tensor([[1, 2, 3]]), torch.tensor([3]), 2, SamplingParams(0.0))
    with pytest.raises(ValueError, match="k must be >= 0"):
        draft.propose(torch.tensor([[1, 2, 3]]), torch.tensor([3]), -1, SamplingParams(0.0))
