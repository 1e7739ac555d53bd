"""specref.decoding.tree on small random GPT-2 models: one pass scores a tree, compaction, exact generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specref.checks.exact_trees import random_parents
from specref.checks.montecarlo import distribution_test
from specref.decoding import tree as tree_decode
from specref.decoding.chain import generate
from specref.decoding.tree import keep_path, score_tree, tree_generate
from specref.drafts import TreeModelDraft
from specref.drafts.shapes import DynamicTree, TreeShape
from specref.models.gpt2 import GPT2
from specref.sampling import SamplingParams
from specref.trees import Tree, verify_tree


@pytest.fixture(scope="module")
def pair() -> tuple[GPT2, GPT2]:
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0)
    return target, noisy_copy(target, noise=0.05, seed=1)


@pytest.fixture(scope="module")
def fp32_model() -> GPT2:
    return small_gpt2(vocab=50, n_embd=32, n_layer=2, seed=5, scale=3.0, dtype=torch.float32)


def _random_tree(rng: np.random.Generator, n: int, V: int) -> Tree:
    parents = random_parents(rng, n)
    tokens = []
    for i, par in enumerate(parents):  # distinct siblings: a deterministic tree
        used = {tokens[j] for j in range(i) if parents[j] == par}
        tokens.append(int(rng.choice([t for t in range(V) if t not in used])))
    return Tree(parents, tokens)


# -- one pass over the tree ------------------------------------------------------------------


@torch.no_grad()
def test_tree_logits_of_every_node_equal_its_path_run_as_a_chain(fp32_model):
    model = fp32_model
    rng = np.random.default_rng(0)
    for trial in range(6):
        context = rng.integers(0, 50, size=int(rng.integers(1, 9))).tolist()
        tree = _random_tree(rng, int(rng.integers(1, 12)), 50)
        cache = model.new_cache(1, max_len=64)
        if len(context) > 1:
            model(torch.tensor([context[:-1]]), cache=cache)
        logits = score_tree(model, cache, torch.tensor([context[-1]]), [tree])[0]  # [N+1, V]
        chain = model(torch.tensor([context]))[0, -1]
        torch.testing.assert_close(logits[0], chain, atol=1e-5, rtol=0)
        for i in range(tree.n_nodes):
            chain = model(torch.tensor([context + tree.path_tokens(i)]))[0, -1]
            torch.testing.assert_close(logits[1 + i], chain, atol=1e-5, rtol=0, msg=f"trial {trial}, node {i}")


@torch.no_grad()
def test_without_the_tree_mask_siblings_would_see_each_other(fp32_model):
    """Negative control: the same pass with a causal mask gives sibling b the wrong logits."""
    model = fp32_model
    tree = Tree([-1, -1, 0, 0, 1, 1], [3, 4, 5, 6, 7, 8])
    context = [1, 2, 9]
    ids = torch.tensor([context + list(tree.tokens)])
    causal = model(ids)[0]  # position of b is 4 and b sees a: wrong on both counts
    chain_b = model(torch.tensor([context + [4]]))[0, -1]
    assert (causal[len(context) + 1] - chain_b).abs().max() > 1e-2


@torch.no_grad()
def test_batched_rows_with_different_trees_and_context_lengths(fp32_model):
    model = fp32_model
    rng = np.random.default_rng(1)
    contexts = [[5, 6, 7, 8, 9], [11, 12]]
    trees = [_random_tree(rng, 7, 50), _random_tree(rng, 4, 50)]
    cache = model.new_cache(2, max_len=32)
    model(torch.tensor([[5, 6, 7, 8], [11, 0, 0, 0]]), cache=cache)
    cache.truncate(torch.tensor([4, 1]))
    logits = score_tree(model, cache, torch.tensor([9, 12]), trees)
    for b in range(2):
        for i in range(trees[b].n_nodes):
            chain = model(torch.tensor([contexts[b] + trees[b].path_tokens(i)]))[0, -1]
            torch.testing.assert_close(logits[b, 1 + i], chain, atol=1e-5, rtol=0)


@torch.no_grad()
def test_compacted_cache_gives_the_same_next_logits_as_a_fresh_recompute(fp32_model):
    model = fp32_model
    tree = Tree([-1, -1, 0, 0, 1, 1, 3], [3, 4, 5, 6, 7, 8, 2])
    contexts = [[1, 2, 9, 10, 11], [20, 21]]
    for paths in ([[1, 5], [0, 3, 6]], [[], [0]], [[0, 3, 6], []]):
        cache = model.new_cache(2, max_len=32)
        model(torch.tensor([[1, 2, 9, 10], [20, 0, 0, 0]]), cache=cache)
        cache.truncate(torch.tensor([4, 1]))
        score_tree(model, cache, torch.tensor([11, 21]), [tree, tree])
        keep_path(cache, torch.tensor([5, 2]), paths)
        assert cache.lengths.tolist() == [5 + len(paths[0]), 2 + len(paths[1])]
        nxt = torch.tensor([[13], [14]])
        got = model(nxt, cache=cache)[:, -1]
        for b in range(2):
            seq = contexts[b] + [tree.tokens[i] for i in paths[b]] + [int(nxt[b])]
            torch.testing.assert_close(got[b], model(torch.tensor([seq]))[0, -1], atol=1e-5, rtol=0)


# -- generation ----------------------------------------------------------------------------

SPECS = [(2, 2), (3, 1, 1), (1, 1, 1), TreeShape((2, 2), sampled=True), DynamicTree(10, max_depth=5, top_k=3, beam=2),
         DynamicTree(6, max_depth=6, top_k=3, beam=3)]  # grows 9 candidates a level, keeps 6: the draft needs room
PROMPTS = [[1, 2, 3], [10, 20, 30, 40, 50, 60, 5, 5]]


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_greedy_tree_speculation_equals_greedy_decoding(pair, spec):
    target, draft = pair
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        expected = generate(target, ids, 60, temperature=0)
        got, stats = tree_generate(target, draft, ids, spec, max_new_tokens=60, temperature=0)
        assert torch.equal(got, expected), f"prompt {prompt}"
        assert 0 < stats.accepted < stats.nodes, "the draft should be partly right, so both paths run"


def test_greedy_tree_speculation_batch_4(pair):
    target, draft = pair
    ids = torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(3))
    expected = generate(target, ids, 50, temperature=0)
    for spec in [(2, 2, 1), DynamicTree(8, max_depth=4, top_k=2, beam=2)]:
        got, stats = tree_generate(target, draft, ids, spec, max_new_tokens=50, temperature=0)
        assert torch.equal(got, expected)
        assert (stats.accepted_hist > 0).sum() >= 2  # rows accept different lengths: caches really differ


def test_tree_shrinks_at_the_end_of_the_context_window():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, scale=20.0, n_positions=40)
    draft = noisy_copy(target, 0.05, 1)
    ids = torch.arange(1, 29)[None]  # 28 tokens + 12 new = the whole window
    expected = generate(target, ids, 12, temperature=0)
    got, _ = tree_generate(target, draft, ids, (3, 3, 2), max_new_tokens=12, temperature=0)
    assert torch.equal(got, expected)


def test_generates_exactly_max_new_tokens(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    for n in [0, 1, 2, 5, 17]:
        out, stats = tree_generate(target, draft, ids, (2, 2), max_new_tokens=n, temperature=0)
        assert out.shape == (1, 3 + n) and stats.emitted == n


def test_nothing_is_emitted_after_eos(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    greedy = generate(target, ids, 60, temperature=0)[0, 3:]
    eos = int(greedy[10])
    first = int((greedy == eos).nonzero()[0])
    out, stats = tree_generate(target, draft, ids, (2, 2), max_new_tokens=60, temperature=0, eos_token_id=eos)
    assert torch.equal(out, generate(target, ids, 60, temperature=0, eos_token_id=eos))
    assert stats.emitted == first + 1


def test_stats_count_nodes_per_pass_and_accepted_length(pair):
    target, draft = pair
    ids = torch.tensor([[4, 5, 6]] * 3)
    _, s = tree_generate(target, draft, ids, (2, 2), max_new_tokens=40, temperature=0)
    assert s.emitted == 3 * 40
    assert s.nodes_per_step <= 6 and s.nodes == s.proposed
    assert s.accepted <= s.nodes and 1 <= s.tokens_per_step <= 3
    assert s.mean_accepted == pytest.approx(s.accepted / s.steps)
    assert s.accepted_hist.sum() <= s.steps and len(s.accepted_hist) == 3
    assert s.accepted <= s.examined <= s.nodes and 0 < s.acceptance_rate <= 1
    assert s.as_dict()["nodes_per_step"] == s.nodes_per_step


def test_seeded_sampling_reproduces_and_inputs_are_not_modified(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    before = ids.clone()
    runs = [tree_generate(target, draft, ids, TreeShape((2, 2), sampled=True), max_new_tokens=30,
                          generator=torch.Generator().manual_seed(5))[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(ids, before)


# -- sampling: the first two tokens follow the target --------------------------------------

N_RUNS = 1000


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[GPT2, GPT2]:
    return tiny_pair_models()


def _first_two(target, draft, spec, params, seed) -> torch.Tensor:  # [N, 2]
    ids = torch.tensor([[1, 2]] * N_RUNS)
    out, _ = tree_generate(target, draft, ids, spec, max_new_tokens=2, temperature=params.temperature,
                           top_k=params.top_k, generator=torch.Generator().manual_seed(seed))
    return out[:, 2:]


@pytest.mark.parametrize("spec,params", [(TreeShape((2, 1), sampled=True), SamplingParams(1.0)),
                                         (TreeShape((3,)), SamplingParams(0.8, top_k=4))], ids=repr)
def test_sampled_first_two_tokens_follow_the_target(tiny_pair, spec, params):
    target, draft = tiny_pair
    exact = exact_first_two(target, [1, 2], params)
    assert distribution_test(exact, samples=_first_two(target, draft, spec, params, seed=11)).passed


def test_negative_control_top_k_children_verified_as_sampled_is_flagged(tiny_pair, monkeypatch):
    import dataclasses

    def broken(tree, p, generator=None):
        return verify_tree(dataclasses.replace(tree, mode="sampled"), p, generator)

    monkeypatch.setattr(tree_decode, "verify_tree", broken)
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    exact = exact_first_two(target, [1, 2], params)
    assert not distribution_test(exact, samples=_first_two(target, draft, TreeShape((3,)), params, seed=12)).passed


# -- bad input -----------------------------------------------------------------------------


def test_tree_that_does_not_fit_the_cache_is_refused(fp32_model):
    cache = fp32_model.new_cache(1, max_len=8)
    fp32_model(torch.tensor([[1, 2, 3, 4]]), cache=cache)
    with pytest.raises(ValueError, match="max_len=8"):
        score_tree(fp32_model, cache, torch.tensor([5]), [Tree([-1, -1, -1, -1], [1, 2, 3, 4])])


def test_tree_deeper_than_the_context_window_is_refused():
    model = small_gpt2(vocab=20, n_embd=16, n_layer=1, seed=0, n_positions=8)
    cache = model.new_cache(1)
    model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    with pytest.raises(ValueError, match="n_positions=8"):
        score_tree(model, cache, torch.tensor([6]), [Tree([-1, 0, 1], [1, 2, 3])])


def test_trees_and_roots_must_match_the_cache_rows(fp32_model):
    cache = fp32_model.new_cache(2, max_len=16)
    with pytest.raises(ValueError, match="holds 2 rows"):
        score_tree(fp32_model, cache, torch.tensor([1, 2]), [Tree([-1], [1])])
    with pytest.raises(TypeError, match="list of specref.trees.Tree"):
        score_tree(fp32_model, cache, torch.tensor([1, 2]), [[-1], [-1]])


def test_keep_path_refuses_nodes_the_cache_does_not_hold(fp32_model):
    cache = fp32_model.new_cache(1, max_len=16)
    fp32_model(torch.tensor([[1, 2, 3]]), cache=cache)
    with pytest.raises(ValueError, match="does not hold"):
        keep_path(cache, torch.tensor([2]), [[0, 3]])
    with pytest.raises(ValueError, match="exceeds the cache length"):
        keep_path(cache, torch.tensor([5]), [[]])


def test_tree_drafting_needs_a_model_draft(pair):
    target, _ = pair
    with pytest.raises(TypeError, match="draft model"):
        tree_generate(target, object(), torch.tensor([[1]]), (2,), max_new_tokens=3)
    with pytest.raises(TypeError, match="tree must be"):
        tree_generate(target, target, torch.tensor([[1]]), "wide", max_new_tokens=3)
    other = small_gpt2(vocab=32, n_embd=16, n_layer=1, seed=0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        tree_generate(target, other, torch.tensor([[1]]), (2,), max_new_tokens=3)


def test_tree_draft_refuses_use_before_begin(pair):
    d = TreeModelDraft(pair[1])
    with pytest.raises(RuntimeError, match="begin"):
        d.propose_tree(torch.tensor([[1]]), torch.tensor([1]), TreeShape((2,)), SamplingParams())


# -- the bundled pair ----------------------------------------------------------------------

from model_factory import exact_first_two, noisy_copy, small_gpt2
from model_factory import tiny_pair as tiny_pair_models

from specref.models.pair import assets_dir, load_pair

ASSETS_READY = all(assets_dir().joinpath(*f.split("/")).is_file()
                   for f in ("target/model.safetensors", "draft/model.safetensors", "tokenizer.json"))
needs_assets = pytest.mark.skipif(not ASSETS_READY, reason="bundled assets not trained yet "
                                  "(run tools/training/train_pair.py to write specref/assets)")


@pytest.fixture(scope="module")
def bundled():
    from specref.models.pair import heldout_prompts

    target, draft, _ = load_pair()
    return target, draft, heldout_prompts(3, 48)


@needs_assets
@pytest.mark.parametrize("spec", [(2, 2), DynamicTree(8, max_depth=6, top_k=3, beam=3)], ids=repr)
def test_greedy_tree_speculation_on_the_bundled_pair_equals_greedy_decoding(bundled, spec):
    target, draft, prompts = bundled
    for prompt in prompts:
        ids = torch.tensor([prompt])
        expected = generate(target, ids, 40, temperature=0)
        got, stats = tree_generate(target, draft, ids, spec, max_new_tokens=40, temperature=0)
        assert torch.equal(got, expected)
        assert stats.accepted > 0


@needs_assets
@torch.no_grad()
def test_bundled_target_scores_every_tree_node_like_its_chain(bundled):
    target, draft, prompts = bundled
    ids = torch.tensor([prompts[0]])
    drafter = TreeModelDraft(draft)
    drafter.begin(1)
    tree = drafter.propose_tree(ids, torch.tensor([ids.shape[1]]), TreeShape((3, 2, 1)), SamplingParams(0.0))[0]
    cache = target.new_cache(1)
    target(ids[:, :-1], cache=cache)
    logits = score_tree(target, cache, ids[:, -1], [tree])[0]
    for i in range(tree.n_nodes):
        chain = target(torch.cat([ids, torch.tensor([tree.path_tokens(i)])], 1))[0, -1]
        torch.testing.assert_close(logits[1 + i], chain, atol=1e-4, rtol=1e-5)
