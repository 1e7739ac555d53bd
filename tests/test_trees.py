"""specref.trees: tree structure, mask and positions, builders, and the exactness of both acceptance rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from specref import trees
from specref.checks.exact_trees import (
    BROKEN_TREE_RULES,
    PrefixModel,
    random_parents,
    sample_tree_steps,
    target_distribution,
    target_rows,
    tree_step_error,
)
from specref.checks.montecarlo import distribution_test
from specref.drafts import shapes
from specref.drafts.shapes import DynamicTree, TreeShape, as_tree_spec, build_tree
from specref.sampling import SamplingParams
from specref.trees import (
    ROOT,
    Tree,
    tree_attention_mask,
    tree_position_ids,
    verify_tree,
    verify_tree_greedy,
)

SHAPE_2_2 = [-1, -1, 0, 0, 1, 1]  # [a, b, a1, a2, b1, b2]


def _ranked_draft(V: int):
    """A draft that always ranks token 0 first, then 1, 2, ...: top-k children are 0..k-1."""
    q = torch.tensor([2.0 ** -(i + 1) for i in range(V)], dtype=torch.float64)
    q = q / q.sum()
    return lambda path: q


def _topk_as_sampled(tree, p, generator=None, rng=None):
    """BROKEN (negative control): verify deterministic top-k children with the draft's softmax q."""
    return verify_tree(dataclasses.replace(tree, mode="sampled"), p, generator=generator, rng=rng)


# -- structure -------------------------------------------------------------------------------


def test_shape_2_2_flattens_to_a_b_a1_a2_b1_b2():
    tree = build_tree((2, 2), _ranked_draft(5))
    assert tree.parents == tuple(SHAPE_2_2)
    assert tree.depths == (1, 1, 2, 2, 2, 2)
    # a = 0, b = 1 (the draft's top-2), and under each again its top-2: 0, 1.
    assert tree.tokens == (0, 1, 0, 1, 0, 1)
    assert tree.children(ROOT) == (0, 1) and tree.children(0) == (2, 3) and tree.children(1) == (4, 5)
    assert tree.path(5) == [1, 5] and tree.path_tokens(5) == [1, 1]


def test_every_node_keeps_the_q_of_its_parent():
    V = 4
    draft = PrefixModel(V, seed=3)
    tree = build_tree((2, 2), draft)
    for i in range(tree.n_nodes):
        torch.testing.assert_close(tree.q[i], draft(tuple(tree.path_tokens(i))[:-1]), atol=1e-15, rtol=0)


def test_mask_of_shape_2_2_sees_self_and_ancestors_only():
    mask = tree_attention_mask(Tree(SHAPE_2_2, range(6)))
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],  # a
        [0, 1, 0, 0, 0, 0],  # b: not its sibling a
        [1, 0, 1, 0, 0, 0],  # a1: a and itself
        [1, 0, 0, 1, 0, 0],  # a2: not its sibling a1
        [0, 1, 0, 0, 1, 0],  # b1: not its cousins a1, a2
        [0, 1, 0, 0, 0, 1],  # b2
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_mask_is_the_ancestor_relation_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(50):
        parents = random_parents(rng, int(rng.integers(1, 15)))
        tree = Tree(parents, range(len(parents)))
        mask = tree_attention_mask(tree)
        for i in range(len(parents)):
            assert set(torch.nonzero(mask[i]).flatten().tolist()) == set(tree.path(i))


def test_mask_with_root_lets_every_node_see_the_root():
    tree = Tree(SHAPE_2_2, range(6))
    full = tree_attention_mask(tree, with_root=True)
    assert full.shape == (7, 7)
    assert full[:, 0].all() and not full[0, 1:].any()
    assert torch.equal(full[1:, 1:], tree_attention_mask(tree))


def test_siblings_share_a_position_start_plus_depth():
    tree = Tree(SHAPE_2_2, range(6))
    assert tree_position_ids(tree, 10).tolist() == [11, 11, 12, 12, 12, 12]
    assert tree_position_ids(tree, 10, with_root=True).tolist() == [10, 11, 11, 12, 12, 12, 12]


def test_a_chain_is_a_tree_with_causal_mask_and_consecutive_positions():
    chain = Tree([-1, 0, 1, 2], [5, 6, 7, 8])
    assert torch.equal(tree_attention_mask(chain), torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree_position_ids(chain, 3).tolist() == [4, 5, 6, 7]


def test_subtree_keeps_whole_paths_and_renumbers():
    tree = Tree(SHAPE_2_2, [10, 11, 12, 13, 14, 15])
    sub = tree.subtree([1, 4, 5])
    assert sub.parents == (-1, 0, 0) and sub.tokens == (11, 14, 15)
    with pytest.raises(ValueError, match="not its parent"):
        tree.subtree([2])


def test_tree_owns_its_inputs():
    q = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    parents = torch.tensor([-1, -1])
    tree = Tree(parents, [0, 1], q, "sampled")
    q[0, 0] = 0.9
    parents[1] = 0
    assert tree.q[0, 0] == pytest.approx(1 / 3) and tree.parents == (-1, -1)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parents,message",
    [
        ([0], "its own parent"),
        ([-1, 2, 1], "cycle 1 -> 2 -> 1"),
        ([1, -1], "forward reference"),
        ([-1, -1, 1, 0], "breadth-first"),
        ([-1, 7], "not a node"),
        ([-2], "not a node"),
        ([-1, 2, 9], "not a node"),
    ],
)
def test_parents_that_are_not_a_breadth_first_tree_are_refused(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(parents, range(len(parents)))


def test_other_bad_trees_are_refused():
    with pytest.raises(ValueError, match="one entry per node"):
        Tree([-1, -1], [0])
    with pytest.raises(TypeError, match="parents"):
        Tree([-1.0], [0])
    with pytest.raises(ValueError, match="mode"):
        Tree([-1], [0], mode="beam")
    with pytest.raises(ValueError, match="needs q"):
        Tree([-1], [0], mode="sampled")
    with pytest.raises(ValueError, match="repeat a token"):
        Tree([-1, -1], [3, 3])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match="different q rows"):
        Tree([-1, -1], [0, 1], q, "sampled")
    with pytest.raises(ValueError, match=r"q\(token\) = 0"):
        Tree([-1, -1], [0, 2], q[[0, 0]], "sampled")
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, V=3\)"):
        Tree([-1], [3], q[:1])


def test_tree_deeper_than_the_context_window_is_refused():
    chain = Tree([-1, 0, 1], [1, 2, 3])
    assert tree_position_ids(chain, 60, n_positions=64).tolist() == [61, 62, 63]
    with pytest.raises(ValueError, match="beyond the context window n_positions=64"):
        tree_position_ids(chain, 61, n_positions=64)


def test_p_must_have_one_row_per_node_plus_the_root():
    tree = Tree(SHAPE_2_2, range(6))
    with pytest.raises(ValueError, match=r"\[N\+1, V\] = \[7, V\]"):
        verify_tree_greedy(tree, torch.zeros(6, 8))
    with pytest.raises(ValueError, match=r"\[N\+1, V\] = \[7, V\]"):
        verify_tree(tree, torch.full((6, 8), 1 / 8))
    with pytest.raises(ValueError, match=r"V=4\) of p"):
        verify_tree(tree, torch.full((7, 4), 1 / 4))


def test_bad_tree_specs_are_refused():
    with pytest.raises(ValueError, match="branching"):
        TreeShape((2, 0))
    with pytest.raises(ValueError, match="budget"):
        DynamicTree(0)
    with pytest.raises(TypeError, match="tree must be"):
        as_tree_spec("wide")
    assert as_tree_spec((2, 2)) == TreeShape((2, 2)) and as_tree_spec(8) == DynamicTree(8)


# -- builders --------------------------------------------------------------------------------


def test_sampled_children_are_drawn_with_replacement_and_reproduce_with_the_seed():
    draft = PrefixModel(3, seed=1)
    spec = TreeShape((4, 2), sampled=True)
    a = build_tree(spec, draft, generator=torch.Generator().manual_seed(0))
    b = build_tree(spec, draft, generator=torch.Generator().manual_seed(0))
    assert a.tokens == b.tokens and a.mode == "sampled" and a.n_nodes == 12
    # Four children from three tokens: some token is repeated.
    assert len({a.tokens[i] for i in a.children(ROOT)}) < 4


def test_dynamic_tree_keeps_the_most_probable_paths_within_the_budget():
    V = 6
    sharp = torch.tensor([0.9, 0.04, 0.03, 0.01, 0.01, 0.01], dtype=torch.float64)
    flat = torch.full((V,), 1 / V, dtype=torch.float64)
    # After any path starting with token 0 the draft is confident; elsewhere it is not.
    draft = lambda path: sharp if (not path or path[0] == 0) else flat
    tree = build_tree(DynamicTree(budget=8, max_depth=6, top_k=2, beam=2), draft)
    assert tree.n_nodes == 8 and tree.mode == "deterministic"
    # The confident branch 0 -> 0 -> 0 ... grows deep; the unconfident one stops at once.
    assert tree.depth >= 5
    assert tree.path_tokens(max(range(8), key=lambda i: tree.depths[i]))[:3] == [0, 0, 0]
    first = tree.children(ROOT)
    assert [tree.tokens[c] for c in first] == [0, 1] and tree.children(first[1]) == ()
    # Every kept node is at least as probable (along its path) as every node left out at its depth.
    logp = lambda path: sum(float(torch.log(draft(tuple(path[:j]))[t])) for j, t in enumerate(path))
    kept = [logp(tree.path_tokens(i)) for i in range(8)]
    assert min(kept) >= logp([1, 0]) - 1e-12  # the best node the budget left out under token 1


def test_node_cap_keeps_a_breadth_first_prefix():
    tree = shapes.grow_trees((2, 2), lambda ts, nodes: torch.zeros(1, len(nodes[0]), 5), 1, max_nodes=3)[0]
    assert tree.parents == (-1, -1, 0)
    assert shapes.grow_trees((2, 2), lambda ts, nodes: torch.zeros(1, 1, 5), 1, max_depth=1)[0].parents == (-1, -1)
    assert shapes.grow_trees((2, 2), lambda ts, nodes: torch.zeros(1, 1, 5), 1, max_nodes=0)[0].n_nodes == 0


def _path_logits(trees, frontier):  # [B, n, V]: a deterministic draft whose logits depend on the node's path
    rows = [[[float((sum(trees[b].path_tokens(n)) if n != ROOT else 0) * 7 % (v + 3)) + 0.01 * v for v in range(6)]
             for n in f] for b, f in enumerate(frontier)]
    return torch.tensor(rows, dtype=torch.float64)


def test_a_static_top_k_tree_holds_every_path_of_top_tokens_in_breadth_first_order():
    # An oracle apart from the grower: breadth-first, each node's children are the top-2 tokens after its path.
    from specref.tree_shapes import TreeGrower

    one = trees.Tree([], [], None, "deterministic")

    def top(path):
        t = trees.Tree([ROOT] + list(range(len(path) - 1)), list(path), None, "deterministic") if path else one
        last = [len(path) - 1] if path else [ROOT]
        return torch.topk(_path_logits([t], [last])[0, 0], 2).indices.tolist()

    want_tokens, want_parents, level = [], [], [((), ROOT)]
    for _ in range(2):
        nxt = []
        for path, node in level:
            for x in top(path):
                want_parents.append(node)
                want_tokens.append(x)
                nxt.append((path + (x,), len(want_tokens) - 1))
        level = nxt
    grower = TreeGrower((2, 2), 1)
    while not grower.done:
        grower.grow(_path_logits(grower.trees, grower.frontier))
    (got,) = grower.result()
    assert (list(got.parents), list(got.tokens)) == (want_parents, want_tokens)
    assert grower.grown == 2


@pytest.mark.parametrize("spec", [(2, 2), TreeShape((2, 1), sampled=True), DynamicTree(budget=5, max_depth=3)])
def test_a_grower_driven_by_hand_grows_what_grow_trees_grows(spec):
    from specref.tree_shapes import TreeGrower

    want = shapes.grow_trees(spec, _path_logits, 2, SamplingParams(), torch.Generator().manual_seed(3))
    grower = TreeGrower(spec, 2, SamplingParams(), torch.Generator().manual_seed(3))
    while not grower.done:
        grower.grow(_path_logits(grower.trees, grower.frontier))
    got = grower.result()
    assert [(t.parents, t.tokens) for t in got] == [(t.parents, t.tokens) for t in want]
    assert all(torch.equal(a.q, b.q) for a, b in zip(got, want))
    with pytest.raises(RuntimeError, match="grown"):
        grower.grow(_path_logits(grower.trees, grower.frontier))


def test_a_grower_refuses_bad_logits_and_stays_as_it_was():
    from specref.tree_shapes import TreeGrower

    grower = TreeGrower((2, 2), 2)
    with pytest.raises(ValueError, match=r"\[B, n, V\] = \[2, 1, V\]"):
        grower.grow(torch.zeros(1, 1, 5))
    nan = torch.zeros(2, 1, 5)
    nan[1, 0, 0] = float("nan")
    with pytest.raises(ValueError):
        grower.grow(nan)
    assert grower.grown == 0 and [t.n_nodes for t in grower.trees] == [0, 0] and not grower.done


def test_a_grow_that_fails_halfway_leaves_every_row_as_it_was():
    from specref.tree_shapes import TreeGrower

    class FailsOnThirdDraw:  # row 0 draws its two children, then row 1's first draw fails
        calls = 0

        def categorical(self, probs):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the rng failed")
            return 0

        def uniform(self):
            return 0.5

    grower = TreeGrower(TreeShape((2, 2), sampled=True), 2, SamplingParams(), rng=FailsOnThirdDraw())
    with pytest.raises(RuntimeError, match="rng failed"):
        grower.grow(torch.zeros(2, 1, 5))
    assert grower.grown == 0 and [t.n_nodes for t in grower.trees] == [0, 0]
    assert grower.frontier == [[ROOT], [ROOT]] and grower.scores == [[], []]


def test_ancestor_inputs_feed_each_frontier_with_its_ancestors_and_no_sibling():
    # Row 0: 0 -> 2 and 1 -> 3 (frontier 2, 3); row 1: 0 -> 2 -> 3, 0 -> 2 -> 4 (frontier 3, 4).
    t0 = trees.Tree([ROOT, ROOT, 0, 1], [5, 6, 7, 8], None, "deterministic")
    t1 = trees.Tree([ROOT, ROOT, 0, 2, 2], [9, 4, 3, 2, 1], None, "deterministic")
    ids, pos, mask, nodes, index = trees.ancestor_inputs([t0, t1], [[2, 3], [3, 4]], [10, 20])
    assert nodes == [[0, 1, 2, 3], [0, 2, 3, 4]]  # t1's node 1 is no ancestor: left out
    assert ids.tolist() == [[5, 6, 7, 8], [9, 3, 2, 1]]
    assert pos.tolist() == [[11, 11, 12, 12], [21, 22, 23, 23]]
    assert index.tolist() == [[2, 3], [2, 3]]
    assert mask[0, 3].tolist() == [False, True, False, True]  # node 3 sees its parent 1 and itself
    assert mask[1, 3].tolist() == [True, True, False, True]  # never its sibling (node 3, fed third)
    t2 = trees.Tree([ROOT], [1], None, "deterministic")
    ids, pos, mask, nodes, index = trees.ancestor_inputs([t0, t2], [[0], [0]], [0, 0])
    assert ids.tolist() == [[5], [1]] and mask.shape == (2, 1, 1)
    with pytest.raises(ValueError, match="each as long"):
        trees.ancestor_inputs([t0, t1], [[2, 3], [2]], [10, 20])


# -- greedy ----------------------------------------------------------------------------------


def _one_hot_rows(best: list[int], V: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(best), V).double()


def test_greedy_keeps_the_matching_path_and_adds_the_bonus():
    tree = Tree(SHAPE_2_2, [5, 6, 7, 8, 9, 4])
    # argmax after root = 6 (b), after b = 4 (b2), after b2 = 3: bonus.
    p = _one_hot_rows([6, 0, 0, 0, 0, 0, 3], 10)
    p[2, 4] = 2.0  # row 1 + b
    out = verify_tree_greedy(tree, p)
    assert out.path == [1, 5] and out.tokens == [6, 4, 3]


def test_greedy_corrects_where_no_child_matches():
    tree = Tree(SHAPE_2_2, [5, 6, 7, 8, 9, 4])
    out = verify_tree_greedy(tree, _one_hot_rows([5, 2, 0, 0, 0, 0, 0], 10))
    assert out.path == [0] and out.tokens == [5, 2]
    out = verify_tree_greedy(tree, _one_hot_rows([1, 0, 0, 0, 0, 0, 0], 10))
    assert out.path == [] and out.tokens == [1]


def test_greedy_takes_the_longest_path_among_duplicate_children():
    # Two sampled copies of token 3; only the second copy's subtree continues to match.
    q = torch.tensor([[0.5, 0.0, 0.0, 0.5]] * 2 + [[0.25] * 4] * 2, dtype=torch.float64)
    tree = Tree([-1, -1, 0, 1], [3, 3, 1, 2], q, "sampled")
    p = _one_hot_rows([3, 2, 2, 0, 0], 4)  # after 3 the target wants 2: only node 3 (under the 2nd copy)
    out = verify_tree_greedy(tree, p)
    assert out.path == [1, 3] and out.tokens == [3, 2, 0]


def test_greedy_with_an_empty_tree_is_plain_greedy_decoding():
    out = verify_tree_greedy(Tree([], []), torch.tensor([[0.1, 3.0, -1.0]]))
    assert out.tokens == [1] and out.path == []


# -- sampling: exact enumeration -------------------------------------------------------------

# (spec, V): deterministic top-k shapes (chains, wide, deep, children covering the whole
# vocabulary), sampled shapes (duplicates are common with V = 2 or 3) and a dynamic tree.
EXACT_CASES = [
    (TreeShape((1,)), 3),
    (TreeShape((3,)), 4),
    (TreeShape((4,)), 4),
    (TreeShape((1, 1, 1)), 3),
    (TreeShape((2, 2)), 4),
    (TreeShape((3, 2, 1)), 4),
    (TreeShape((2,), sampled=True), 3),
    (TreeShape((3,), sampled=True), 3),
    (TreeShape((1, 2), sampled=True), 3),
    (TreeShape((2, 2), sampled=True), 2),
    (DynamicTree(5, max_depth=3, top_k=2, beam=2), 4),
]


@pytest.mark.parametrize("spec,V", EXACT_CASES, ids=lambda x: repr(x))
def test_tree_step_emits_the_target_distribution_exactly(spec, V):
    target = PrefixModel(V, seed=1, concentration=0.7)
    draft = PrefixModel(V, seed=2, concentration=0.7)
    assert tree_step_error(spec, target, draft) < 1e-12


@pytest.mark.parametrize("spec,V", [(TreeShape((2, 2)), 3), (TreeShape((2, 1), sampled=True), 3)], ids=repr)
def test_tree_step_is_exact_when_p_equals_q(spec, V):
    model = PrefixModel(V, seed=4)
    assert tree_step_error(spec, model, model) < 1e-12


@pytest.mark.parametrize("spec", [TreeShape((3, 1)), TreeShape((2, 1), sampled=True)], ids=repr)
def test_tree_step_is_exact_with_zero_probabilities_and_a_top_k_draft(spec):
    # Zeros in p and q, and a draft processed with top_k=2 (q is 0 off its top two tokens).
    target = PrefixModel(4, seed=5, zero_prob=0.3)
    draft = PrefixModel(4, seed=6, zero_prob=0.3)
    assert tree_step_error(spec, target, draft, params=SamplingParams(1.0, top_k=2)) < 1e-12


def test_exact_enumeration_flags_top_k_children_verified_with_the_softmax_q():
    target, draft = PrefixModel(4, seed=1, concentration=0.7), PrefixModel(4, seed=2, concentration=0.7)
    assert tree_step_error(TreeShape((2, 2)), target, draft, rule=_topk_as_sampled) > 1e-2


@pytest.mark.parametrize("spec", [TreeShape((2,), sampled=True), TreeShape((2, 1))], ids=repr)
def test_exact_enumeration_flags_a_rule_that_does_not_update_p(spec, monkeypatch):
    monkeypatch.setattr(trees, "residual", lambda p, q: p)
    target, draft = PrefixModel(3, seed=1, concentration=0.7), PrefixModel(3, seed=2, concentration=0.7)
    assert tree_step_error(spec, target, draft) > 1e-2


# Negative controls: two top-2 children with one grandchild each has rejections, a residual and leaves to reach.
CONTROL_SHAPE = (2, 1)


def test_the_exact_tree_check_passes_the_real_rule():
    assert tree_step_error(CONTROL_SHAPE, PrefixModel(3, seed=1), PrefixModel(3, seed=2), verify_tree) < 1e-12


@pytest.mark.parametrize("name", sorted(BROKEN_TREE_RULES))
def test_the_exact_tree_check_flags_a_broken_rule(name):
    rule = BROKEN_TREE_RULES[name]
    assert tree_step_error(CONTROL_SHAPE, PrefixModel(3, seed=1), PrefixModel(3, seed=2), rule) > 1e-2, name


# -- sampling: Monte-Carlo with the foundation's test ----------------------------------------

MC_RUNS = 1000
MC_V = 4


@pytest.fixture(scope="module")
def mc_models():
    # Peaked distributions, so the broken rules below are far from the target.
    return PrefixModel(MC_V, seed=10, concentration=0.5), PrefixModel(MC_V, seed=20, concentration=0.5)


def _mc(spec, models, seed, rule=verify_tree):
    target, draft = models
    samples = sample_tree_steps(spec, target, draft, MC_RUNS, 2, torch.Generator().manual_seed(seed), rule)
    return distribution_test(target_distribution(target, 2), samples=samples)


def test_montecarlo_sampled_tree_follows_the_target(mc_models):
    assert _mc(TreeShape((3,), sampled=True), mc_models, seed=0).passed


def test_montecarlo_top_k_tree_follows_the_target(mc_models):
    assert _mc(TreeShape((2, 1)), mc_models, seed=1).passed


def test_montecarlo_flags_not_updating_p_after_a_rejection(mc_models, monkeypatch):
    monkeypatch.setattr(trees, "residual", lambda p, q: p)
    assert not _mc(TreeShape((3,), sampled=True), mc_models, seed=0).passed


def test_montecarlo_flags_top_k_children_treated_as_sampled(mc_models):
    assert not _mc(TreeShape((2, 1)), mc_models, seed=1, rule=_topk_as_sampled).passed


# -- sampling: the trace -------------------------------------------------------------------


def test_trace_of_a_sampled_step_follows_the_rule():
    target, draft = PrefixModel(4, seed=7), PrefixModel(4, seed=8)
    g = torch.Generator().manual_seed(3)
    for _ in range(30):
        tree = build_tree(TreeShape((3, 2), sampled=True), draft, generator=g)
        out = verify_tree(tree, target_rows(tree, target), generator=g)
        for t in out.trials:
            assert t.accepted == (t.u < t.threshold)
            assert t.q_x == pytest.approx(float(tree.q[t.node, t.token]))
        assert [t.node for t in out.trials if t.accepted] == out.path
        assert out.tokens[:-1] == [tree.tokens[i] for i in out.path]


def test_deterministic_child_is_accepted_with_probability_p_of_it():
    p = torch.tensor([[0.2, 0.5, 0.3], [1.0, 0, 0], [1.0, 0, 0]], dtype=torch.float64)
    q = torch.tensor([[0.9, 0.05, 0.05]] * 2, dtype=torch.float64)
    tree = Tree([-1, -1], [0, 2], q, "deterministic")
    g = torch.Generator().manual_seed(0)
    rejected = 0
    for _ in range(20):  # token 0 is rejected with probability 0.8: both outcomes occur (fixed seed)
        out = verify_tree(tree, p, generator=g)
        first = out.trials[0]
        assert first.q_x == 1.0 and first.p_x == pytest.approx(0.2)
        # Accepted, token 0 ends the path; rejected, token 2 is tried against (0, 0.5, 0.3) / 0.8.
        assert len(out.trials) == (1 if first.accepted else 2), out.trials
        rejected += not first.accepted
        assert first.accepted or out.trials[1].p_x == pytest.approx(0.3 / 0.8)
    assert 0 < rejected < 20, f"token 0 rejected {rejected} times in 20: one branch never ran"


# -- exercise graders: right answers pass, typical wrong ones fail with a hint ----------------


def _tree_from_mask(mask, diagonal=True, later=True, branch=True, breadth_first=True, nearest=True,
                    error=ValueError, shift=0, in_place=False):
    """Exercise 6's Task 1 as a learner writes it (an answer may not call specref.trees); the flags break it."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        raise error(f"mask must be [N, N], got {tuple(mask.shape)}")
    parents = []
    for i in range(mask.shape[0]):
        if diagonal and not mask[i, i]:
            raise error(f"node {i} does not see itself")
        if later and mask[i, i + 1:].any():
            raise error(f"node {i} sees a later node")
        seen = mask[i, :i].nonzero().flatten().tolist()
        parent = (seen[-1] if nearest else seen[0]) if seen else -1
        if branch and parent >= 0 and not torch.equal(mask[i, :parent], mask[parent, :parent]):
            raise error(f"node {i} sees nodes off its branch")
        if breadth_first and parents and parent < parents[-1]:
            raise error(f"node {i}: not breadth-first")
        parents.append(parent)
    if in_place:
        mask.fill_(False)
    return [par + shift if par >= 0 else par for par in parents]


def _bfs_trees(n: int) -> list[list[int]]:
    """Every breadth-first tree of n nodes (parents first, parents never decreasing)."""
    out: list[list[int]] = [[]]
    for i in range(n):
        out = [t + [par] for t in out for par in range(t[-1] if t else -1, i)]
    return out


def test_the_mask_graders_oracle_knows_every_small_trees_mask_and_no_other():
    """`tree_of_mask` against brute force: every boolean matrix of up to 3 nodes, and for 4 nodes every matrix with
    a True diagonal and nothing above it (the ones left to decide) and a few hundred others; `why_not_a_tree`
    gives a reason exactly for the masks that are no tree's."""
    from specref_grading.checks.trees import tree_of_mask, why_not_a_tree

    rng = np.random.default_rng(0)
    for n in range(5):
        trees_of = {tuple(tree_attention_mask(Tree(t, range(n))).flatten().tolist()): t for t in _bfs_trees(n)}
        assert len(trees_of) == len(_bfs_trees(n))  # no two trees share a mask
        if n <= 3:
            masks = [torch.tensor([(b >> k) & 1 for k in range(n * n)], dtype=torch.bool).reshape(n, n)
                     for b in range(2 ** (n * n))]
        else:
            low = [(i, j) for i in range(n) for j in range(i)]
            masks = []
            for b in range(2 ** len(low)):
                m = torch.eye(n, dtype=torch.bool)
                for k, (i, j) in enumerate(low):
                    m[i, j] = bool((b >> k) & 1)
                masks.append(m)
            masks += [torch.as_tensor(rng.integers(0, 2, (n, n)) == 1) for _ in range(300)]
        for m in masks:
            want = trees_of.get(tuple(m.flatten().tolist()))
            assert tree_of_mask(m) == want, (m, want)
            assert (why_not_a_tree(m) is None) == (want is not None), (m, why_not_a_tree(m))
    assert tree_of_mask(torch.ones((2, 3), dtype=torch.bool)) is None


def test_the_tree_from_mask_grader_passes_the_reference_and_any_sequence_of_parents():
    from specref_grading.checks.trees import check_tree_from_mask

    check_tree_from_mask(_tree_from_mask)
    check_tree_from_mask(_tree_from_mask, n_cases=200, seed=1)  # the hidden cases' size
    check_tree_from_mask(lambda m: torch.tensor(_tree_from_mask(m)))
    check_tree_from_mask(lambda m: tuple(float(par) for par in _tree_from_mask(m)))


def test_the_tree_from_mask_grader_draws_trees_and_no_trees_of_every_kind():
    from specref_grading.checks.trees import _mask_cases, tree_of_mask, why_not_a_tree

    for n_cases, seed in ((40, 0), (200, 1)):
        cases = _mask_cases(n_cases, seed)
        assert len(cases) == n_cases
        trees_ = sum(tree_of_mask(m) is not None for _, m in cases)
        assert n_cases // 3 < trees_ < 2 * n_cases // 3, trees_
        reasons = {why_not_a_tree(m).split(" ")[-1] for _, m in cases if tree_of_mask(m) is None}
        assert {"itself", "order", "root", "breadth-first", "N]"} <= reasons, reasons


@pytest.mark.parametrize("kwargs,hint", [
    ({"nearest": False}, "not only its parent"),
    ({"shift": 1}, "off by one"),
    ({"diagonal": False}, "does not see itself"),
    ({"later": False}, "comes after it"),
    ({"branch": False}, "not all on one branch"),
    ({"breadth_first": False}, "not listed breadth-first"),
    ({"diagonal": False, "later": False, "branch": False, "breadth_first": False}, "raise ValueError"),
    ({"error": TypeError}, "refused with ValueError"),
    ({"in_place": True}, "in place"),
])
def test_the_tree_from_mask_grader_fails_wrong_answers_with_a_hint(kwargs, hint):
    from specref_grading.checks.trees import check_tree_from_mask

    with pytest.raises(AssertionError, match=hint):
        check_tree_from_mask(lambda m: _tree_from_mask(m, **kwargs))


def test_the_tree_from_mask_grader_fails_an_answer_that_refuses_everything():
    from specref_grading.checks.trees import check_tree_from_mask

    def refuse(mask):
        raise ValueError("no tree")

    with pytest.raises(AssertionError, match="a tree has it"):
        check_tree_from_mask(refuse)


def _one_level(p, children, q, deterministic, rng, onehot=True, update=True):
    """The multi-candidate rule at one node, as a learner writes it; the flags break it on purpose."""
    for i, x in enumerate(children):
        q_i = torch.nn.functional.one_hot(torch.tensor(x), p.shape[0]).double() if (deterministic and onehot) else q
        if rng.uniform() < min(1.0, float(p[x] / q_i[x])):
            return i, x
        if update:
            p = trees.residual(p, q_i)
    return None, rng.categorical(p)


def test_multi_candidate_grader_passes_the_reference():
    from specref_grading.checks.trees import check_multi_candidate

    check_multi_candidate(_one_level, n_cases=15)


@pytest.mark.parametrize("kwargs,hint", [
    ({"onehot": False}, "onehot"),
    ({"update": False}, "residual"),
])
def test_multi_candidate_grader_fails_the_broken_rules(kwargs, hint):
    from specref_grading.checks.trees import check_multi_candidate

    with pytest.raises(AssertionError, match=hint):
        check_multi_candidate(lambda *a: _one_level(*a, **kwargs), n_cases=15)



def _node_acceptance(p, q, m, deterministic, update=True, onehot=True):
    """How often a node accepts one of m children, as a learner derives it; the flags break it on purpose."""
    from specref import residual

    if deterministic and onehot:
        return float(p[torch.topk(q, m).indices].sum())
    reject = 1.0
    for _ in range(m):
        reject *= 1.0 - float(torch.minimum(p, q).sum())
        p = residual(p, q) if update else p
    return 1.0 - reject


def test_node_acceptance_closed_form_equals_the_enumeration_of_verify_tree():
    from specref_grading.checks import trees as grader

    for seed in range(3):
        for _, p, q, m, det, small in grader._acceptance_cases(30, seed):
            if small:
                assert abs(grader._acceptance_closed_form(p, q, m, det)
                           - grader._acceptance_by_enumeration(p, q, m, det)) < 1e-12


def test_node_acceptance_grader_passes_the_derivation():
    from specref_grading.checks.trees import check_node_acceptance

    check_node_acceptance(_node_acceptance)
    check_node_acceptance(_node_acceptance, n_cases=60, seed=5)


@pytest.mark.parametrize("wrong,hint", [
    (lambda p, q, m, det: _node_acceptance(p, q, m, det, update=False), "residual"),  # every child against p
    (lambda p, q, m, det: _node_acceptance(p, q, m, det, onehot=False), "onehot"),  # top-k children as draws from q
    (lambda p, q, m, det: float(torch.minimum(p, q).sum()), "wrong answer"),  # one child's beta, whatever m
    (lambda p, q, m, det: 1.0, "wrong answer"),
])
def test_node_acceptance_grader_fails_wrong_derivations(wrong, hint):
    from specref_grading.checks.trees import check_node_acceptance

    with pytest.raises(AssertionError, match=hint):
        check_node_acceptance(wrong)


def test_node_acceptance_grader_refuses_the_stub_and_the_reference():
    from specref_grading.checks.trees import check_node_acceptance

    def stub(p, q, m, deterministic):
        raise NotImplementedError("Task 3: write node_acceptance (see the task above)")

    with pytest.raises(NotImplementedError, match="Task 3 is not done yet"):
        check_node_acceptance(stub)

    def by_reference(p, q, m, deterministic):
        trees.verify_tree  # noqa: B018 - a forbidden reference, whatever it computes
        return _node_acceptance(p, q, m, deterministic)

    with pytest.raises(AssertionError, match="specref.trees"):
        check_node_acceptance(by_reference)


def test_dynamic_tree_stops_growing_when_no_deeper_node_can_make_the_cut():
    calls = []
    flat = torch.full((8,), 1 / 8, dtype=torch.float64)

    def draft(path):
        calls.append(path)
        return flat

    # Every depth-2 node scores 1/64 < 1/8, so a budget of 4 is filled at depth 1 and no pass beyond depth 2 helps.
    tree = build_tree(DynamicTree(budget=4, max_depth=6, top_k=4, beam=2), draft)
    assert tree.depth == 1 and tree.n_nodes == 4
    assert max(len(p) for p in calls) == 1  # the root pass and one pass for depth 2, then it stops
