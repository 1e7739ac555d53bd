"""A draft's KV cache starts small and grows as the rows do (`KVCache.reserve`), with no change in what it computes.

Before, `ModelDraft.begin` allocated the draft model's whole window for every row: 1 GB at B = 2,000 in
float64 for the bundled 1-layer draft (notebook 04's distribution test, which needs 22 of its 256
slots). The tests here start the cache at 3 slots, so that every decode below grows it several times,
and require the same tokens, greedy and sampled, chains and trees, as a cache allocated at full size.
Only the sampled runs can flag a draft's cache that loses its contents as it grows (greedy output is the
target's whatever the draft proposes): without the copy in `reserve` they fail. The target's caches in
`tree_generate` and lookahead decoding are sized to the run (prompt, new tokens and one pass's tree or
window) and grow through the same `reserve` if a pass needs more: the last tests start them at the
prompt's length, so that every pass must grow them, and require the same tokens.
"""

from __future__ import annotations

import pytest
import torch

import specref.drafts.cached as cached_module
from specref.decoding.chain import generate, speculative_generate
from specref.decoding.lookahead import lookahead_generate
from specref.decoding.tree import tree_generate
from specref.drafts.eagle import EagleDraft
from specref.drafts.heads import EagleLayer
from specref.drafts.model import ModelDraft, TreeModelDraft
from specref.drafts.shapes import DynamicTree
from specref.models.kvcache import KVCache

from model_factory import noisy_copy, small_gpt2


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=40, n_embd=32, n_layer=2, seed=11, n_positions=64, scale=2.0)
    return target, noisy_copy(target, noise=0.3, seed=12)


def _prompts(B: int, T: int = 5) -> torch.Tensor:
    return torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(B))


def test_reserve_keeps_the_cached_tokens_and_lengths_and_the_model_continues_exactly(pair):
    target, _ = pair
    ids = _prompts(3, 12)
    full = target.new_cache(3)  # the whole window
    small = target.new_cache(3, max_len=7)
    with torch.no_grad():
        target(ids[:, :7], cache=full)
        target(ids[:, :7], cache=small)
        small.truncate(torch.tensor([7, 5, 6]))
        full.truncate(torch.tensor([7, 5, 6]))
        small.reserve(12, limit=target.config.n_positions)
        assert small.max_len == 14  # doubled: more than asked for, so growth is rare
        assert small.lengths.tolist() == [7, 5, 6]
        rest = ids[:, 7:]
        assert torch.equal(target(rest, cache=small), target(rest, cache=full))
    assert torch.equal(small.k[:, :, :, :12], full.k[:, :, :, :12])


def test_reserve_stops_at_its_limit_and_does_nothing_when_there_is_room(pair):
    target, _ = pair
    cache = target.new_cache(2, max_len=8)
    k = cache.k
    cache.reserve(8, limit=64)
    assert cache.k is k  # room enough: nothing reallocated
    cache.reserve(9, limit=10)
    assert cache.max_len == 10
    cache.reserve(40, limit=10)
    assert cache.max_len == 10
    with torch.no_grad(), pytest.raises(ValueError, match="max_len=10"):
        target(torch.zeros((2, 11), dtype=torch.long), cache=cache)  # past the limit: the model's own check


@pytest.mark.parametrize("n_slots, limit, error", [(-1, 8, ValueError), (2.0, 8, TypeError), (4, 0, ValueError),
                                                   (4, True, TypeError)])
def test_reserve_refuses_bad_arguments(n_slots, limit, error):
    cache = KVCache(1, 1, 1, 2, 4)
    with pytest.raises(error, match="n_slots|limit"):
        cache.reserve(n_slots, limit=limit)


def test_begin_allocates_only_the_first_size():
    model = small_gpt2(vocab=40, n_embd=16, n_layer=1, seed=1, n_positions=1024)
    draft = ModelDraft(model)
    draft.begin(4)
    assert draft.cache.max_len == cached_module.FIRST_CACHE_LEN < model.config.n_positions


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_draft_grown_from_3_slots_gives_the_same_tokens_as_a_full_cache(pair, monkeypatch, B, temperature):
    target, draft_model = pair
    ids = _prompts(B)
    runs, full = {}, cached_module.FIRST_CACHE_LEN
    for first in (full, 3):
        monkeypatch.setattr(cached_module, "FIRST_CACHE_LEN", first)
        draft = ModelDraft(draft_model)
        runs[first], _ = speculative_generate(target, draft, ids, k=4, max_new_tokens=40, temperature=temperature,
                                              generator=torch.Generator().manual_seed(5))
        assert draft.cache.max_len >= 40  # it grew (3, 6, 12, 24, 48)
    assert torch.equal(runs[3], runs[full])
    if temperature == 0:
        assert torch.equal(runs[3], generate(target, ids, 40, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_draft_grown_from_3_slots_gives_the_same_tokens_as_a_full_cache(pair, monkeypatch, temperature):
    target, draft_model = pair
    ids = _prompts(2)
    runs, full = {}, cached_module.FIRST_CACHE_LEN
    for first in (full, 3):
        monkeypatch.setattr(cached_module, "FIRST_CACHE_LEN", first)
        runs[first], _ = tree_generate(target, TreeModelDraft(draft_model), ids, (3, 2, 2), max_new_tokens=30,
                                       temperature=temperature, generator=torch.Generator().manual_seed(6))
    assert torch.equal(runs[3], runs[full])
    if temperature == 0:
        assert torch.equal(runs[3], generate(target, ids, 30, temperature=0))


# -- EagleDraft's one-layer cache grows the same way ---------------------------------------------------


@pytest.fixture(scope="module")
def eagle_layer():
    torch.manual_seed(13)  # tests may seed the global RNG; library code never does
    return EagleLayer(32, 2, (2,), True).double().eval()


def _eagle_runs(pair, eagle_layer, monkeypatch, decode) -> dict[int, torch.Tensor]:
    """{first cache size: decode(draft)} for the full first size and for 3 slots; the caches' contents must agree.

    A random layer's q hardly depends on what its cache attends to, so the tokens alone
    would not notice a cache that lost its contents as it grew: its K/V entries are compared too.
    """
    target, _ = pair
    runs, caches, full = {}, {}, cached_module.FIRST_CACHE_LEN
    for first in (full, 3):
        monkeypatch.setattr(cached_module, "FIRST_CACHE_LEN", first)
        draft = EagleDraft(target, eagle_layer)
        runs[first] = decode(draft)
        caches[first] = draft.cache
        assert draft.cache.max_len >= 24  # it grew from 3
    grown, whole = caches[3], caches[full]
    assert torch.equal(grown.lengths, whole.lengths)
    for b, n in enumerate(grown.lengths.tolist()):
        for a, w in ((grown.k, whole.k), (grown.v, whole.v)):
            torch.testing.assert_close(a[:, b, :, :n], w[:, b, :, :n], atol=1e-12, rtol=0)
    return runs


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_eagle_chain_grown_from_3_slots_gives_the_same_tokens_as_a_full_cache(pair, eagle_layer, monkeypatch, B,
                                                                                  temperature):
    target, _ = pair
    ids = _prompts(B)
    runs = _eagle_runs(pair, eagle_layer, monkeypatch, lambda d: speculative_generate(
        target, d, ids, k=4, max_new_tokens=40, temperature=temperature,
        generator=torch.Generator().manual_seed(7))[0])
    assert torch.equal(runs[3], runs[cached_module.FIRST_CACHE_LEN])
    if temperature == 0:
        assert torch.equal(runs[3], generate(target, ids, 40, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_eagle_tree_grown_from_3_slots_gives_the_same_tokens_as_a_full_cache(pair, eagle_layer, monkeypatch,
                                                                                 temperature):
    target, _ = pair
    ids = _prompts(2)
    spec = DynamicTree(8, max_depth=4, top_k=3, beam=2)
    runs = _eagle_runs(pair, eagle_layer, monkeypatch, lambda d: tree_generate(
        target, d, ids, spec, max_new_tokens=30, temperature=temperature,
        generator=torch.Generator().manual_seed(8))[0])
    assert torch.equal(runs[3], runs[cached_module.FIRST_CACHE_LEN])
    if temperature == 0:
        assert torch.equal(runs[3], generate(target, ids, 30, temperature=0))


def test_make_room_grows_to_the_longest_row_plus_the_new_tokens(pair):
    target, _ = pair
    cache = target.new_cache(2, max_len=4)
    target(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
    cache.truncate(torch.tensor([3, 1]))
    cache.make_room(2, limit=64)  # 3 + 2 > 4: doubled to 8
    assert cache.max_len == 8 and cache.lengths.tolist() == [3, 1]
    cache.make_room(5, limit=64)  # 3 + 5 fits
    assert cache.max_len == 8
    with pytest.raises(ValueError, match="n_new must be >= 0"):
        cache.make_room(-1, limit=64)


# -- the target's cache in tree_generate and lookahead: sized to the run, grown if a pass needs more ------------


def _target_cache_from(monkeypatch, target, first: int) -> list:
    """Make the target's next caches start at `first` slots per row; returns the caches it hands out."""
    made, real = [], type(target).new_cache

    def small(batch_size, max_len=None, device=None, dtype=None):
        made.append(real(target, batch_size, max_len=first, device=device, dtype=dtype))
        return made[-1]

    monkeypatch.setattr(target, "new_cache", small)
    return made


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_targets_cache_grown_from_the_prompt_gives_the_same_tokens(pair, monkeypatch, temperature):
    target, draft_model = pair
    ids = _prompts(2)

    def run():
        return tree_generate(target, TreeModelDraft(draft_model), ids, (3, 2, 2), max_new_tokens=30,
                             temperature=temperature, generator=torch.Generator().manual_seed(9))[0]

    sized = run()
    made = _target_cache_from(monkeypatch, target, ids.shape[1])  # room for the prompt, none for a tree
    grown = run()
    monkeypatch.undo()
    assert made and made[0].max_len >= 5 + 21  # it grew to take context, root and 21 nodes
    assert torch.equal(grown, sized)
    if temperature == 0:
        assert torch.equal(grown, generate(target, ids, 30, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lookahead_cache_grown_from_the_prompt_gives_the_same_tokens(pair, monkeypatch, temperature):
    target, _ = pair
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])  # repeats: with the prompt in the pool, candidates from the start

    def run():
        return lookahead_generate(target, ids, max_new_tokens=30, temperature=temperature, window=3, ngram=3,
                                  guesses=3, pool_from_prompt=True, generator=torch.Generator().manual_seed(10))[0]

    sized = run()
    made = _target_cache_from(monkeypatch, target, ids.shape[1])
    grown = run()
    monkeypatch.undo()
    assert made and made[0].max_len >= 8 + 1 + 6  # root, window (W (N - 1) = 6) and candidates after the context
    assert torch.equal(grown, sized)
    if temperature == 0:
        assert torch.equal(grown, generate(target, ids, 30, temperature=0))
