"""Caches are allocated once per generation, at the size it needs, and never grow or move.

A draft that allocated its model's whole window for every row held 1 GB at B = 2,000 in float64 for
the bundled 1-layer draft (notebook 04's distribution test needs 22 of its 256 slots); one that grew
as the rows did reallocated its K/V (new addresses, which a captured CUDA graph cannot follow). Now
`loop.decode` sizes the target's cache and, through the run's `Session` (`Draft.join`), the draft's to prompt +
max_new_tokens + the step's room (k drafts, a tree, a lookahead window), within the window, and
`begin` allocates that once. The tests check the sizes, that the buffers keep their addresses for
the whole run, and that a cache sized to the need gives the same tokens, greedy and sampled, chains
and trees, model drafts and EAGLE, as one of the whole window. A tree or lookahead pass is cut to
the room its cache has, never grown past it.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref.decoding.chain import generate, speculative_generate
from specref.decoding.lookahead import lookahead_generate
from specref.decoding.tree import tree_generate
from specref.drafts.eagle import EagleDraft
from specref.drafts.heads import EagleLayer
from specref.drafts.model import ModelDraft, TreeModelDraft
from specref.drafts.shapes import DynamicTree
from specref.models.kvcache import KVCache
from specref.models.session import Session


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=40, n_embd=32, n_layer=2, seed=11, n_positions=128, scale=2.0)
    return target, noisy_copy(target, noise=0.3, seed=12)


def _prompts(B: int, T: int = 5) -> torch.Tensor:
    return torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(B))


class _WholeWindow:
    """Wraps a draft so that it joins no session: its cache is its window, as before the sizing."""

    def __init__(self, draft) -> None:
        draft.join = lambda session: None
        self.draft = draft


def test_a_cache_can_no_longer_grow():
    cache = KVCache(1, 2, 1, 2, 8)
    assert not hasattr(cache, "reserve") and not hasattr(cache, "make_room")


def test_begin_alone_allocates_the_window_and_a_session_only_what_a_generation_needs():
    model = small_gpt2(vocab=40, n_embd=16, n_layer=1, seed=1, n_positions=1024)
    draft = ModelDraft(model)
    draft.begin(4)
    assert draft.cache.kv.max_len == 1024  # a draft used on its own does not know the run
    draft.join(Session(30))
    draft.begin(4)
    assert draft.cache.kv.max_len == 30
    draft.begin(4)
    assert draft.cache.kv.max_len == 1024  # a size holds for one generation only


@pytest.mark.parametrize("B", [1, 64])
def test_a_chain_generation_sizes_both_caches_to_its_need_and_never_moves_them(pair, B):
    target, draft_model = pair
    ids, k, new = _prompts(B), 4, 20
    draft = ModelDraft(draft_model)
    made, real = [], type(target).new_cache

    def recording(batch_size, max_len=None, device=None, dtype=None):
        made.append(real(target, batch_size, max_len, device, dtype))
        return made[-1]

    addresses = set()
    target.new_cache = recording
    try:
        speculative_generate(target, draft, ids, k=k, max_new_tokens=new, temperature=0,
                             on_step=lambda step: addresses.add((draft.cache.kv.k.data_ptr(),
                                                                 draft.cache.kv.v.data_ptr(),
                                                                 draft.cache.kv.lengths.data_ptr())))
    finally:
        del target.new_cache
    need = ids.shape[1] + new + k
    assert [c.max_len for c in made] == [need]  # one target cache, of the run's size
    assert draft.cache.kv.max_len == need < draft_model.config.n_positions
    assert len(addresses) == 1  # the draft's buffers kept their addresses for the whole run
    # Memory at a large batch: the draft's K/V is need / window of what the whole window would hold.
    assert draft.cache.kv.k.numel() == draft_model.config.n_layer * B * draft_model.config.n_head * need * (
        draft_model.config.n_embd // draft_model.config.n_head)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_draft_sized_to_the_run_gives_the_same_tokens_as_a_whole_window(pair, B, temperature):
    target, draft_model = pair
    ids = _prompts(B)
    runs = [speculative_generate(target, d, ids, k=4, max_new_tokens=40, temperature=temperature,
                                 generator=torch.Generator().manual_seed(5))[0]
            for d in (ModelDraft(draft_model), _WholeWindow(ModelDraft(draft_model)).draft)]
    assert torch.equal(runs[0], runs[1])
    if temperature == 0:
        assert torch.equal(runs[0], generate(target, ids, 40, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_draft_sized_to_the_run_gives_the_same_tokens_as_a_whole_window(pair, temperature):
    target, draft_model = pair
    ids = _prompts(2)
    runs = [tree_generate(target, d, ids, (3, 2, 2), max_new_tokens=30, temperature=temperature,
                          generator=torch.Generator().manual_seed(6))[0]
            for d in (TreeModelDraft(draft_model), _WholeWindow(TreeModelDraft(draft_model)).draft)]
    assert torch.equal(runs[0], runs[1])
    if temperature == 0:
        assert torch.equal(runs[0], generate(target, ids, 30, temperature=0))


# -- EagleDraft's one-layer cache is sized the same way ---------------------------------------------------------


@pytest.fixture(scope="module")
def eagle_layer():
    torch.manual_seed(13)  # tests may seed the global RNG; library code never does
    return EagleLayer(32, 2, (2,), True).double().eval()


def _eagle_runs(pair, eagle_layer, decode) -> list[torch.Tensor]:
    """[decode(sized draft), decode(whole-window draft)]; their caches' contents must agree too.

    A random layer's q hardly depends on what its cache attends to, so the tokens alone would not
    notice a cache that lost or misplaced entries: its K/V entries are compared too.
    """
    target, _ = pair
    drafts = [EagleDraft(target, eagle_layer), _WholeWindow(EagleDraft(target, eagle_layer)).draft]
    runs = [decode(d) for d in drafts]
    sized, whole = drafts[0].cache.kv, drafts[1].cache.kv
    assert sized.max_len < whole.max_len == target.config.n_positions
    assert torch.equal(sized.lengths, whole.lengths)
    for b, n in enumerate(sized.lengths.tolist()):
        for a, w in ((sized.k, whole.k), (sized.v, whole.v)):
            torch.testing.assert_close(a[:, b, :, :n], w[:, b, :, :n], atol=1e-12, rtol=0)
    return runs


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_eagle_chain_sized_to_the_run_gives_the_same_tokens_as_a_whole_window(pair, eagle_layer, B, temperature):
    target, _ = pair
    ids = _prompts(B)
    runs = _eagle_runs(pair, eagle_layer, lambda d: speculative_generate(
        target, d, ids, k=4, max_new_tokens=40, temperature=temperature,
        generator=torch.Generator().manual_seed(7))[0])
    assert torch.equal(runs[0], runs[1])
    if temperature == 0:
        assert torch.equal(runs[0], generate(target, ids, 40, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_eagle_tree_sized_to_the_run_gives_the_same_tokens_as_a_whole_window(pair, eagle_layer, temperature):
    target, _ = pair
    ids = _prompts(2)
    spec = DynamicTree(8, max_depth=4, top_k=3, beam=2)
    runs = _eagle_runs(pair, eagle_layer, lambda d: tree_generate(
        target, d, ids, spec, max_new_tokens=30, temperature=temperature,
        generator=torch.Generator().manual_seed(8))[0])
    assert torch.equal(runs[0], runs[1])
    if temperature == 0:
        assert torch.equal(runs[0], generate(target, ids, 30, temperature=0))


# -- the target's cache in tree_generate and lookahead: a pass is cut to the room it has -----------------------


def _target_cache_of(monkeypatch, target, size) -> list:
    """Make the target's next caches hold `size(max_len asked)` slots per row; returns the caches it hands out."""
    made, real = [], type(target).new_cache

    def sized(batch_size, max_len=None, device=None, dtype=None):
        made.append(real(target, batch_size, max_len=size(max_len), device=device, dtype=dtype))
        return made[-1]

    monkeypatch.setattr(target, "new_cache", sized)
    return made


def test_a_tree_generation_sizes_the_targets_cache_to_prompt_tokens_and_one_tree(pair, monkeypatch):
    target, draft_model = pair
    ids = _prompts(2)
    made = _target_cache_of(monkeypatch, target, lambda n: n)
    tree_generate(target, TreeModelDraft(draft_model), ids, (3, 2, 2), max_new_tokens=30, temperature=0)
    assert [c.max_len for c in made] == [5 + 30 + 21]  # prompt, new tokens, one tree of 3 + 6 + 12 nodes


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_targets_cache_without_room_for_a_tree_cuts_the_trees_and_keeps_the_tokens(pair, monkeypatch,
                                                                                          temperature):
    target, draft_model = pair
    ids = _prompts(2)

    def run():
        return tree_generate(target, TreeModelDraft(draft_model), ids, (3, 2, 2), max_new_tokens=30,
                             temperature=temperature, generator=torch.Generator().manual_seed(9))

    sized, sized_stats = run()
    made = _target_cache_of(monkeypatch, target, lambda n: n - 21 + 3)  # room for 3 nodes past the budget
    tight, tight_stats = run()
    monkeypatch.undo()
    assert made and made[0].max_len == 5 + 30 + 3
    assert tight_stats.nodes < sized_stats.nodes  # trees were cut to the room
    if temperature == 0:
        assert torch.equal(tight, generate(target, ids, 30, temperature=0))
        assert torch.equal(sized, tight)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lookahead_cache_without_room_for_its_window_keeps_the_tokens(pair, monkeypatch, temperature):
    target, _ = pair
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])  # repeats: with the prompt in the pool, candidates from the start

    def run():
        return lookahead_generate(target, ids, max_new_tokens=30, temperature=temperature, window=3, ngram=3,
                                  guesses=3, pool_from_prompt=True, generator=torch.Generator().manual_seed(10))[0]

    sized = run()
    made = _target_cache_of(monkeypatch, target, lambda n: n - 6)  # less room than root + window + candidates
    tight = run()
    monkeypatch.undo()
    assert made and made[0].max_len == 8 + 30 + 12 - 6
    if temperature == 0:
        assert torch.equal(tight, generate(target, ids, 30, temperature=0))
        assert torch.equal(sized, tight)
