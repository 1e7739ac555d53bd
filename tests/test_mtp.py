"""MTPDraft: DeepSeek-V3-style modules chained by depth, each with its own KV cache, through the one verifier.

The modules are random (seeded), so nothing waits for training. The key property is the cache
scheme: what the draft computes equals the teacher-forced computation training runs
(`mtp_unroll`) on the context followed by the drafts, at every step of a generation. What every
draft must do (the proposal's form, greedy and sampled output equal to the target's, the shipped
modules on the bundled and the grown target) is tests/test_draft_contract.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from model_factory import small_gpt2

from specref.decoding.chain import generate, speculative_generate, speculative_step
from specref.decoding.loop import Sequences, SpecStats, prefill
from specref.drafts import MTPDraft
from specref.drafts.heads import MTPModule, MTPStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "training"))  # heads_alignment
from heads_alignment import mtp_unroll  # noqa: E402

from specref.sampling import SamplingParams


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    """|got - want| <= atol everywhere, shapes equal (torch.testing.assert_close costs a second to import)."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    err = float((got - want).detach().abs().max()) if got.numel() else 0.0
    assert err <= atol, f"max |difference| {err:.3g} > {atol:.3g}"


def random_stack(target, depth: int, seed: int) -> MTPStack:
    torch.manual_seed(seed)  # tests may seed the global RNG (the modules' own initialisation); library code never does
    return MTPStack(target.config.n_embd, 2, depth).to(target.dtype).eval()


@pytest.fixture(scope="module")
def target():
    return small_gpt2(vocab=24, n_embd=32, n_layer=2, seed=0, scale=20.0)


@pytest.fixture(scope="module")
def stack(target):
    return random_stack(target, 8, seed=1)


@pytest.fixture(scope="module")
def shallow(target):
    return random_stack(target, 4, seed=3)


@torch.no_grad()
def _teacher_forced_q(target, stack, context: torch.Tensor, drafts: torch.Tensor, params) -> torch.Tensor:
    """q_d of every depth d from `mtp_unroll` (training's computation) over context + drafts, at t = len - 2."""
    full = torch.cat([context, drafts[:, :-1]], 1)  # [1, L + k - 1]: draft k is read by no module
    outs = mtp_unroll(stack, target(full, return_hidden=True).hidden_states, full, target)
    t = context.shape[1] - 2
    return torch.stack([params.probs(stack[d].logits(outs[d][:, t : t + 1], target.lm_head)[:, 0])
                        for d in range(drafts.shape[1])], 1)  # [1, k, V]


# -- what the modules are fed -------------------------------------------------------------------------


@pytest.mark.parametrize("L", [2, 3, 5, 9])  # short contexts: the first rows of the deeper modules read drafts
def test_q_equals_the_teacher_forced_computation_on_context_plus_drafts(target, stack, L):
    g = torch.Generator().manual_seed(L)
    context = torch.randint(0, 24, (1, L), generator=g)
    params = SamplingParams(0.9)
    draft = MTPDraft(target, stack)
    draft.begin(1)
    prefill(target, context, target.new_cache(1), SpecStats(k=1), draft)
    x, q = draft.propose(context, torch.tensor([L]), 8, params, g)
    assert_close(q, _teacher_forced_q(target, stack, context, x, params), 1e-12)


def test_after_every_rollback_the_state_equals_a_recompute_from_scratch(target, shallow):
    # Three rows that accept different numbers of drafts. After each step: (1) no module keeps a row that read
    # a token verification dropped; (2) once caught up, its K/V and outputs on the rows it keeps equal those of
    # a fresh draft built from the buffer alone; (3) its next q equals the teacher-forced computation.
    # Sampling, so that drafts are both accepted and rejected (random modules rarely match an argmax).
    stack = shallow
    ids = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5], [3, 3, 3, 3, 3]])
    seqs, cache = Sequences(ids, 16), target.new_cache(3)
    draft = MTPDraft(target, stack)
    draft.begin(3)
    prefill(target, ids, cache, SpecStats(k=1), draft)
    g, rejected, uneven = torch.Generator().manual_seed(0), 0, False
    while True:
        step = speculative_step(target, draft, seqs, cache, 4, SamplingParams(1.0), g)
        rejected += sum(n < step.drafts.shape[1] for n in step.n_accepted)
        uneven |= len(set(seqs.lengths_h)) > 1
        if seqs.done:
            break
        active = [b for b in range(3) if not seqs.done_h[b]]
        for d in range(1, 5):  # (1) depth d keeps row i only if x_{i+d} is still what it saw: i + d < length - 1
            kept = draft.true_rows(d)
            assert all(int(kept[b]) <= max(seqs.lengths_h[b] - 1 - d, 0) for b in active), d
        fresh = MTPDraft(target, stack)
        fresh.begin(3)
        prefill(target, seqs.tokens[:, : max(seqs.lengths_h)], target.new_cache(3), SpecStats(k=1), fresh)
        fresh.rollback(seqs.lengths - 1)  # a shorter row keeps the features of its own tokens only
        x, _ = draft.propose(seqs.tokens, seqs.lengths, 4, SamplingParams(0.0))
        x_fresh, _ = fresh.propose(seqs.tokens, seqs.lengths, 4, SamplingParams(0.0))
        for b in active:  # (2)
            assert torch.equal(x[b], x_fresh[b])
            for d in range(1, 5):
                m = max(seqs.lengths_h[b] - d, 0)  # true rows of depth d: 0 .. t + 1 - d, t = length - 2
                assert int(draft.true_rows(d)[b]) == int(fresh.true_rows(d)[b]) == m
                mine, theirs = draft.caches[d - 1], fresh.caches[d - 1]
                assert_close(mine.k[:, b, :, :m], theirs.k[:, b, :, :m], 1e-10)
                assert_close(mine.v[:, b, :, :m], theirs.v[:, b, :, :m], 1e-10)
                assert_close(draft.outputs[d - 1][b, :m], fresh.outputs[d - 1][b, :m], 1e-10)
        x, q = draft.propose(seqs.tokens, seqs.lengths, 4, SamplingParams(0.8), g)
        for b in active:  # (3)
            context = seqs.tokens[b : b + 1, : seqs.lengths_h[b]]
            want = _teacher_forced_q(target, stack, context, x[b : b + 1], SamplingParams(0.8))
            assert_close(q[b : b + 1], want, 1e-12)
    assert rejected > 0 and uneven, "no rejection, or rows never had different lengths: rollback was not exercised"


# -- a batch whose rows stop early -------------------------------------------------------------------


def test_rows_that_stop_at_eos_leave_the_others_exact(target, stack):
    # A finished row keeps being proposed for (the batch stays rectangular): its state must not disturb the others.
    ids = torch.randint(0, 24, (6, 5), generator=torch.Generator().manual_seed(3))
    expected = generate(target, ids, 20, temperature=0, eos_token_id=12)
    assert 0 < int((expected == 12).any(1).sum()) < 6, "some rows, not all, should stop early"
    got, _ = speculative_generate(target, MTPDraft(target, stack), ids, k=4, max_new_tokens=20, temperature=0,
                                  eos_token_id=12)
    assert torch.equal(got, expected)


# -- bad input ---------------------------------------------------------------------------------


def test_k_beyond_the_modules_is_refused(target):
    draft = MTPDraft(target, random_stack(target, 3, seed=2))
    with pytest.raises(ValueError, match="k=4 but this MTP draft has 3 modules"):
        speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), k=4, max_new_tokens=8, temperature=0)


def test_modules_for_another_width_or_not_modules_are_refused(target):
    with pytest.raises(ValueError, match="n_embd is 32"):
        MTPDraft(target, MTPStack(16, 2, 2).double())
    with pytest.raises(ValueError, match="share one width"):
        MTPDraft(target, [MTPModule(32, 2), MTPModule(16, 2)])
    with pytest.raises(TypeError, match="MTPStack or a non-empty sequence"):
        MTPDraft(target, [])
    with pytest.raises(TypeError, match="MTPStack or a non-empty sequence"):
        MTPDraft(target, torch.nn.Linear(32, 32))


def test_a_draft_built_for_another_target_is_refused(target, stack):
    draft, ids = MTPDraft(target, stack), torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="built for another target"):
        speculative_generate(small_gpt2(vocab=24, n_embd=32, n_layer=1, seed=0), draft, ids, k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="features of width 32.*width 48"):
        speculative_generate(small_gpt2(vocab=24, n_embd=48, n_layer=2, seed=0), draft, ids, k=2, max_new_tokens=4)


def test_heads_in_another_dtype_than_the_target_are_refused(target):
    with pytest.raises(ValueError, match="float64.*float32.*one device and dtype"):
        speculative_generate(target, MTPDraft(target, random_stack(target, 2, seed=1).float()), torch.tensor([[1, 2, 3]]), k=2, max_new_tokens=4)


def test_propose_without_the_targets_features_is_refused(target, stack):
    draft = MTPDraft(target, stack)
    draft.begin(1)
    with pytest.raises(RuntimeError, match="observe"):
        draft.propose(torch.tensor([[1, 2, 3]]), torch.tensor([3]), 2, SamplingParams(0.0))
