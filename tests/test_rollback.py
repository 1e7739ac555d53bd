"""A draft with state forgets exactly what verification rejected: after a step, its cache is a recompute of the kept tokens.

Verification hides a draft that forgets nothing (the output stays exact, only acceptance
drops), so this is checked on the cache itself.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref.decoding.chain import speculative_step
from specref.decoding.loop import Sequences, SpecStats, prefill
from specref.decoding.tree import TreeSpecStats, tree_step
from specref.drafts import ModelDraft, TreeModelDraft
from specref.drafts.shapes import TreeShape
from specref.sampling import SamplingParams


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    return target, noisy_copy(target, noise=0.3, seed=1)


def _assert_cache_is_a_recompute(draft: ModelDraft, seqs: Sequences, behind: int | None = None) -> None:
    """Row b's draft cache holds n_b <= length_b slots (at least length_b - behind when given), and their K/V
    are the draft's own over tokens[b, :n_b]."""
    cache = draft.cache.kv
    for b, n in enumerate(cache.lengths.tolist()):
        assert n <= seqs.lengths_h[b], f"row {b}: the draft caches {n} tokens, the sequence has {seqs.lengths_h[b]}"
        if behind is not None:  # a rollback that forgets too much would pass the K/V comparison below
            assert n >= seqs.lengths_h[b] - behind, f"row {b}: the draft forgot kept tokens ({n} of {seqs.lengths_h[b]})"
        fresh = draft.model.new_cache(1)
        draft.model(seqs.tokens[b : b + 1, :n], cache=fresh)
        torch.testing.assert_close(cache.k[:, b, :, :n], fresh.k[:, 0, :, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-5, rtol=1e-5)


def _start(target, draft, prompts, max_new):
    ids = torch.tensor(prompts)
    seqs = Sequences(ids, max_new)
    cache = target.new_cache(ids.shape[0])
    draft.begin(ids.shape[0])
    prefill(target, ids, cache, SpecStats(k=1))
    return seqs, cache


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_model_draft_cache_after_rollback_equals_a_recompute_of_the_kept_tokens(pair, temperature):
    target, model = pair
    draft = ModelDraft(model)
    seqs, cache = _start(target, draft, [[1, 2, 3, 4], [9, 8, 7, 6]], 40)
    g = torch.Generator().manual_seed(0)
    rejected = 0
    while not seqs.done:
        step = speculative_step(target, draft, seqs, cache, 4, SamplingParams(temperature), g)
        rejected += sum(n < step.drafts.shape[1] for n in step.n_accepted)
        # It keeps everything it saw that verification kept: all but the emitted token (and the last draft,
        # never fed, when all k were accepted).
        _assert_cache_is_a_recompute(draft, seqs, behind=2)
    assert rejected > 0, "no draft was rejected: the test would not notice a rollback that does nothing"


def test_tree_model_draft_cache_after_rollback_equals_a_recompute_of_the_kept_tokens(pair):
    target, model = pair
    draft = TreeModelDraft(model)
    seqs, cache = _start(target, draft, [[1, 2, 3, 4], [9, 8, 7, 7]], 30)
    stats = TreeSpecStats(k=3)
    while not seqs.done:
        tree_step(target, draft, seqs, cache, TreeShape((2, 2, 1)), SamplingParams(0.0), stats=stats)
        _assert_cache_is_a_recompute(draft, seqs)
    assert stats.accepted < stats.steps * 3, "every tree was accepted to a leaf: nothing was rolled back"
