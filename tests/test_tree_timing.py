"""Trees timed: the tree pass timed is the verifier's pass, repeats are paired, counts are the decoders' own."""

from __future__ import annotations

import pytest
import torch

from specref import DynamicTree, TreeShape, tree_attention_mask, tree_generate
from specref.decoding.tree import score_tree
from specref.models.gpt2 import GPT2, GPT2Config
from specref.perf import tree_timing
from specref.perf.tree_timing import complete_tree, measure_tree_pass_costs, time_tree_decoding


def tiny(n_layer: int = 2, seed: int = 0) -> GPT2:
    torch.manual_seed(seed)
    return GPT2(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=n_layer, n_head=2)).eval()


def test_complete_tree_hangs_each_node_under_the_right_parent():
    assert complete_tree(7, 2).parents == (-1, -1, 0, 0, 1, 1, 2)
    assert complete_tree(5, 3).parents == (-1, -1, -1, 0, 0)
    assert complete_tree(4, 1).parents == (-1, 0, 1, 2)  # branching 1: a chain
    assert complete_tree(6).depths == (1, 1, 2, 2, 2, 2)
    with pytest.raises(ValueError, match="n_nodes"):
        complete_tree(0)


def test_the_timed_tree_pass_is_the_verifiers_pass(monkeypatch):
    """Each timed tree pass feeds what `score_tree` feeds, after exactly `context` cached tokens."""
    target = tiny(1)
    seen = []
    real_step = target.step

    def step(ids, cache=None, position_ids=None, attention_mask=None, *a, **kw):
        seen.append((int(cache.lengths[0]), ids.clone(), None if position_ids is None else position_ids.clone(),
                     None if attention_mask is None else attention_mask.clone()))
        return real_step(ids, cache, position_ids, attention_mask, *a, **kw)

    monkeypatch.setattr(target, "step", step)
    costs = measure_tree_pass_costs(target, [6], context=5, repeats=2)
    trees = [s for s in seen if s[2] is not None]
    assert len(trees) == 1 + 2  # warm-up, then one per repeat
    tree = complete_tree(6)
    for length, ids, pos, mask in trees:
        assert length == 5 and ids.shape == (1, 7)
        assert pos.tolist() == [[5, 6, 6, 7, 7, 7, 7]]  # root at the context's end, nodes at root + depth
        assert torch.equal(mask[0], tree_attention_mask(tree, with_root=True))
    assert costs.ks == (6,) and len(costs.one) == len(costs.verify[6]) == 2 and costs.draft is None


def test_tree_pass_logits_match_score_tree():
    """The pass timed computes what the verifier computes: the same logits as `score_tree` on the same cache."""
    target, tree = tiny(2), complete_tree(5)
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    seen = []
    real_step = target.step
    target.step = lambda *a, **kw: seen.append(real_step(*a, **kw)) or seen[-1]
    measure_tree_pass_costs(target, [5], context=8, repeats=1, generator=torch.Generator().manual_seed(0))
    del target.step
    with torch.no_grad():
        cache = target.new_cache(1)
        target(ids[:, :8], cache=cache)
        want = score_tree(target, cache, ids[:, 8], [tree])
    got = [out for out in seen if out.shape[1] == 6][-1]
    torch.testing.assert_close(got, want)


def test_measure_times_every_pass_once_per_repeat_in_a_fixed_order(monkeypatch):
    order = []
    real = tree_timing.repeat_times

    def spy(fn, device, repeats, warmup, clock):
        order.append(fn)
        return real(fn, device, repeats=repeats, warmup=warmup, clock=clock)

    monkeypatch.setattr(tree_timing, "repeat_times", spy)
    costs = measure_tree_pass_costs(tiny(2), [3, 7], draft=tiny(1), context=8, repeats=3)
    assert len(order) == 3 * 4 and order[:4] == order[4:8] == order[8:]
    assert costs.v_repeats(7) == [t / o for t, o in zip(costs.verify[7], costs.one)]
    assert len(costs.draft) == 3 and costs.kernel.startswith("torch")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_nodes=[]), ValueError, "n_nodes must hold"),
    (dict(n_nodes=[3, 3]), ValueError, "distinct"),
    (dict(n_nodes=[0]), ValueError, "n_nodes must hold"),
    (dict(n_nodes=[3], context=61), ValueError, "exceeds"),
    (dict(n_nodes=[3], repeats=0), ValueError, "repeats"),
    (dict(n_nodes=[3], clock="sundial"), ValueError, "clock must be"),
    (dict(n_nodes=[65]), ValueError, "vocabulary size"),
])
def test_measure_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        measure_tree_pass_costs(tiny(1), **kwargs)


def test_decoding_counts_are_the_decoders_own_and_speedups_are_paired():
    target, draft = tiny(2, seed=0), tiny(1, seed=1)
    prompts = [torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    shapes = {"chain": TreeShape((1, 1, 1)), "tree": TreeShape((2, 1))}
    got = time_tree_decoding(target, draft, prompts, 10, shapes, repeats=2)
    for label, shape in shapes.items():
        stats = [tree_generate(target, draft, x, shape, max_new_tokens=10, temperature=0)[1] for x in prompts]
        run = got.runs[label]
        assert run.steps == sum(s.steps for s in stats) and run.emitted == 2 * 10
        assert run.nodes == sum(s.nodes for s in stats) and run.draft_passes == sum(s.draft_passes for s in stats)
        assert run.same_as_plain and len(run.times.times) == 2 and run.spec == repr(shape)
        assert got.speedups(label) == tuple(p / t for p, t in zip(got.plain.times, run.times.times))
        assert run.step_times.times == tuple(t / run.steps for t in run.times.times)
        assert run.nodes_per_step <= shape.n_nodes
    assert got.plain_step().times == tuple(t / 20 for t in got.plain.times)


def test_same_as_plain_flags_a_run_that_emits_other_tokens(monkeypatch):
    """Negative control: a decoder that emits other tokens than plain greedy decoding is recorded as such."""
    target, draft = tiny(2, seed=0), tiny(1, seed=1)
    prompts = [torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))]

    def off_by_one(*args, **kwargs):
        out, stats = tree_generate(*args, **kwargs)
        out = out.clone()
        out[0, -1] = (out[0, -1] + 1) % 64
        return out, stats

    monkeypatch.setattr(tree_timing, "tree_generate", off_by_one)
    got = time_tree_decoding(target, draft, prompts, 6, {"tree": DynamicTree(4, max_depth=3)}, repeats=1)
    assert not got.runs["tree"].same_as_plain


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(trees={}), ValueError, "at least one label"),
    (dict(trees={"a": (2, 2)}), TypeError, "TreeShape or a DynamicTree"),
    (dict(trees={"plain": TreeShape((2,))}), ValueError, "'plain' names plain decoding"),
    (dict(new_tokens=0), ValueError, "new_tokens"),
    (dict(repeats=0), ValueError, "repeats"),
    (dict(prompts=[torch.zeros(2, 3, dtype=torch.long)]), ValueError, r"\[1, P\]"),
    (dict(prompts=torch.zeros(1, 3, dtype=torch.long)), TypeError, "prompts"),
])
def test_decoding_refuses_bad_arguments(kwargs, error, match):
    args = dict(prompts=[torch.zeros(1, 3, dtype=torch.long)], new_tokens=4, trees={"a": TreeShape((2,))}) | kwargs
    with pytest.raises(error, match=match):
        time_tree_decoding(tiny(1), tiny(1, seed=1), **args)
