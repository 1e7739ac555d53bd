"""Bugs real implementations shipped, each reproduced (specref.checks.broken) and caught by the check named for it.

Every check runs twice with the same seed and N: the broken variant must be flagged and the
correct rule must pass. Exact checks are float64 enumerations (TV < 1e-12 is "equal");
sampled ones use `distribution_test` at ALPHA = 1e-3.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

from specref.chain_verify import verify_chain
from specref.checks import broken as B
from specref.checks import pitfalls as P
from specref.checks.montecarlo import distribution_test, simulate
from specref.checks.toy import MarkovChain, MisreportedDraft, toy_pair
from specref.drafts import ModelDraft
from specref.models import heldout_prompts, load_pair
from specref.sampling import SamplingParams

RUNS = 20_000  # every sampled check, correct and broken alike
EXACT = 1e-12
START, K, N_TOKENS = 0, 3, 3


@cache
def _toy() -> tuple[MarkovChain, MarkovChain]:
    return toy_pair(torch.Generator().manual_seed(0), vocab_size=6)


@cache
def _step() -> tuple[torch.Tensor, torch.Tensor]:  # p [3, 4], q [2, 4]: one step with fixed distributions
    rng = np.random.default_rng(0)
    return torch.tensor(rng.dirichlet(np.ones(4), 3)), torch.tensor(rng.dirichlet(np.ones(4), 2))


@cache
def _pair64():
    target, draft, _ = load_pair(dtype=torch.float64)
    return target, draft


def _joint_test(target: MarkovChain, draft: object, rule=verify_chain, seed: int = 1):
    sim = simulate(target, draft, START, K, N_TOKENS, RUNS, torch.Generator().manual_seed(seed), rule)
    return distribution_test(target.joint(START, N_TOKENS), samples=sim.tokens)


# -- an argmax draft scored with a softmax q ----------------------------------------------------------


def test_argmax_draft_with_softmax_q_is_flagged_exactly_and_the_one_hot_q_is_exact():
    target, draft = _toy()
    greedy = P.argmax_chain(draft)
    assert P.chain_tv(target, MisreportedDraft(greedy, draft), START, K, N_TOKENS) > 0.5
    assert P.chain_tv(target, greedy, START, K, N_TOKENS) < EXACT


def test_argmax_softmax_draft_on_the_pair_shifts_the_first_token_and_one_hot_does_not():
    target, draft = _pair64()
    prompt = heldout_prompts(n=1, n_tokens=24)[0]
    params = SamplingParams(1.0, 8, None)  # top-8 keeps the enumeration small
    bad = B.ArgmaxSoftmaxDraft(draft)
    bad.begin(1)
    x, q = bad.propose(torch.tensor([prompt]), torch.tensor([len(prompt)]), 2, params)
    assert torch.equal(x[0, 0], params.probs(draft(torch.tensor([prompt]))[0, -1]).argmax())
    first, p1 = P.deterministic_first_token(target, prompt, x[0], q[0], params)
    assert abs(float(first.sum()) - 1) < EXACT
    assert P.tv_distance(first, p1) > 1e-3
    one_hot = torch.nn.functional.one_hot(x[0], q.shape[-1]).double()
    first, p1 = P.deterministic_first_token(target, prompt, x[0], one_hot, params)
    assert P.tv_distance(first, p1) < EXACT
    with pytest.raises(ValueError, match="temperature > 0"):
        bad.propose(torch.tensor([prompt]), torch.tensor([len(prompt)]), 2, SamplingParams(0.0))


# -- q not processed like p -------------------------------------------------------------------------


def test_q_not_processed_like_p_is_flagged_exactly_and_by_the_distribution_test():
    target, draft = _toy()
    tp, dp = target.processed(0.7, top_p=0.9), draft.processed(0.7, top_p=0.9)
    wrong = MisreportedDraft(dp, draft)  # drafts from the processed q, the raw q reported
    assert P.chain_tv(tp, wrong, START, K, N_TOKENS) > 0.05
    assert P.chain_tv(tp, dp, START, K, N_TOKENS) < EXACT
    assert not _joint_test(tp, wrong).passed
    assert _joint_test(tp, dp).passed


def test_a_draft_that_is_raw_throughout_is_still_exact_only_slower():
    target, draft = _toy()
    tp, dp = target.processed(0.7, top_p=0.9), draft.processed(0.7, top_p=0.9)
    assert P.chain_tv(tp, draft, START, K, N_TOKENS) < EXACT  # sampled and reported q agree: exact
    context = torch.zeros((1, 1), dtype=torch.long)
    p = tp.score(context, torch.zeros((1, 0), dtype=torch.long))[0, 0]
    beta = lambda q: float(torch.minimum(p, q).sum())  # noqa: E731
    assert beta(draft.score(context, torch.zeros((1, 0), dtype=torch.long))[0, 0]) < beta(
        dp.score(context, torch.zeros((1, 0), dtype=torch.long))[0, 0])


def test_unprocessed_q_model_draft_reports_the_raw_softmax():
    _, draft = _pair64()
    prompt = heldout_prompts(n=1, n_tokens=16)[0]
    params = SamplingParams(0.7, None, 0.9)
    bad = B.UnprocessedQModelDraft(draft)
    bad.begin(1)
    x, q = bad.propose(torch.tensor([prompt]), torch.tensor([len(prompt)]), 1, params, torch.Generator().manual_seed(0))
    logits = draft(torch.tensor([prompt]))[0, -1]
    assert torch.allclose(q[0, 0], torch.softmax(logits, -1), atol=1e-12)
    assert params.probs(logits)[x[0, 0]] > 0  # the draft came from the processed distribution


# -- a target cache not rolled back --------------------------------------------------------------------


def test_a_target_cache_not_rolled_back_breaks_greedy_equality_and_the_real_one_keeps_it():
    target, draft = _pair64()
    prompts = heldout_prompts(n=1, n_tokens=16)
    assert P.greedy_mismatch(target, target, ModelDraft(draft), prompts, 4, 20) == [None]
    assert P.greedy_mismatch(target, B.StaleCacheTarget(target), ModelDraft(draft), prompts, 4, 20)[0] is not None


def test_a_stale_cache_target_forgets_a_dead_cache_whose_id_comes_back():
    # CPython reuses the id of a freed object; here the inner model hands back one recycled cache object,
    # so the second generation's cache has the first one's id. Nothing the first one wrote is stale in it.
    target, _ = _pair64()
    recycled = target.new_cache(1, max_len=target.config.n_positions)

    class Recycling(torch.nn.Module):
        config, device, dtype = target.config, target.device, target.dtype

        def new_cache(self, batch_size, max_len=None, device=None, dtype=None):
            recycled.lengths = torch.zeros(1, dtype=torch.long)
            return recycled

        def forward(self, input_ids, cache=None, *args, **kwargs):
            return target(input_ids, cache, *args, **kwargs)

    stale = B.StaleCacheTarget(Recycling())
    ids = torch.tensor([heldout_prompts(n=1, n_tokens=16)[0]])
    stale(ids[:, :10], stale.new_cache(1))
    cache = stale.new_cache(1)
    stale(ids[:, :3], cache)
    assert cache.lengths.tolist() == [3]


# -- in-place edits of p -------------------------------------------------------------------------------


def test_in_place_edits_of_p_are_caught_by_the_inputs_check_and_on_reuse():
    p, q = _step()
    drafts = torch.stack([torch.arange(4) % 4, (torch.arange(4) + 1) % 4], 1)  # [4, 2]: some rows reject
    Q, Pp = q.expand(4, 2, 4).clone(), p.expand(4, 3, 4).clone()
    assert P.changed_inputs(B.verify_inplace_residual, drafts, Q, Pp, torch.Generator().manual_seed(0)) == ["p"]
    assert P.changed_inputs(verify_chain, drafts, Q, Pp, torch.Generator().manual_seed(0)) == []
    # Used once, its output is right; read p again and the second use is wrong.
    assert P.step_test(B.verify_inplace_residual, p, q, RUNS, torch.Generator().manual_seed(2)).passed
    assert not P.step_test(B.verify_inplace_residual, p, q, RUNS, torch.Generator().manual_seed(2), reuse=True).passed
    assert P.step_test(verify_chain, p, q, RUNS, torch.Generator().manual_seed(2), reuse=True).passed


# -- an accept count that is not the accepted prefix ------------------------------------------------------


def test_an_accept_count_that_is_not_the_prefix_is_flagged_by_the_step_test():
    p, q = _step()
    assert not P.step_test(B.verify_count_not_prefix, p, q, RUNS, torch.Generator().manual_seed(3)).passed
    assert P.step_test(verify_chain, p, q, RUNS, torch.Generator().manual_seed(3)).passed
    # The same uniforms, the same outcome whenever the accepted draws form a prefix.
    u = torch.tensor([[0.0, 0.0, 0.5], [0.999, 0.0, 0.5]], dtype=torch.float64)
    d = torch.tensor([[0, 1], [0, 1]])
    good = verify_chain(d, q.expand(2, 2, 4), p.expand(2, 3, 4), u=u)
    bad = B.verify_count_not_prefix(d, q.expand(2, 2, 4), p.expand(2, 3, 4), u=u)
    assert torch.equal(good[0][0], bad[0][0]) and int(good[1][1]) == 0 and int(bad[1][1]) == 1


# -- the step cells and the helpers ------------------------------------------------------------------------


def test_step_cells_number_every_outcome_once():
    V, k = 3, 2
    seqs = [(a,) for a in range(V)] + [(a, b) for a in range(V) for b in range(V)] + [
        (a, b, c) for a in range(V) for b in range(V) for c in range(V)]
    tokens = torch.tensor([list(s) + [-1] * (k + 1 - len(s)) for s in seqs])
    assert P.step_cells(tokens, V).tolist() == list(range(len(seqs)))
    table = P.step_table({(2,): 0.5, (0, 1, 2): 0.5}, k, V)
    assert table[2] == 0.5 and table[V + V * V + 5] == 0.5 and table.sum() == 1


def test_tv_distance_on_tensors_and_dicts_and_bad_input():
    assert P.tv_distance(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])) == 0.5
    assert P.tv_distance({(0,): 1.0}, {(1,): 1.0}) == 1.0
    with pytest.raises(ValueError, match="one shape"):
        P.tv_distance(torch.ones(2), torch.ones(3))
    with pytest.raises(TypeError, match="both"):
        P.tv_distance(torch.ones(2), {(0,): 1.0})
    with pytest.raises(ValueError, match=r"p must be \[k\+1, V\]"):
        P.step_test(verify_chain, torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, 10, torch.Generator())
    p, q = _step()
    with pytest.raises(ValueError, match="runs must be >= 1"):
        P.step_test(verify_chain, p, q, 0, torch.Generator())
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        P.step_test(verify_chain, p, q, 10, 0)
    with pytest.raises(TypeError, match="p must be a tensor"):
        P.changed_inputs(verify_chain, torch.zeros((1, 2), dtype=torch.long), q[None], p.tolist())


@pytest.mark.parametrize("cls", [B.MisreportedModelDraft, B.ArgmaxSoftmaxDraft, B.UnprocessedQModelDraft])
def test_the_drafts_broken_on_the_sampling_path_refuse_greedy_decoding(cls):
    _, draft = _pair64()
    bad = cls(draft)
    bad.begin(1)
    with pytest.raises(ValueError, match=f"{cls.__name__} breaks sampling: use a temperature > 0"):
        bad.propose(torch.tensor([[1, 2, 3]]), torch.tensor([3]), 2, SamplingParams(0.0))


# -- a lossy rule: typical acceptance -------------------------------------------------------------------


def test_typical_acceptance_fails_the_checks_the_exact_rule_passes():
    from specref.typical import TypicalAcceptance

    target, draft = _toy()
    typical = P.acceptance_rule(TypicalAcceptance())  # Medusa's defaults; argmax next token
    assert P.chain_tv(target, draft, START, K, N_TOKENS, typical) > 0.05
    assert P.chain_tv(target, draft, START, K, N_TOKENS) < EXACT
    sampled = P.acceptance_rule(TypicalAcceptance(next_token="sample"))
    p, q = _step()
    assert not P.step_test(sampled, p, q, RUNS, torch.Generator().manual_seed(4)).passed
    assert P.step_test(verify_chain, p, q, RUNS, torch.Generator().manual_seed(4)).passed
    with pytest.raises(ValueError, match="deterministic next token"):
        sampled(torch.zeros((1, 2), dtype=torch.long), q[None], p[None], u=torch.zeros(1, 3))


def test_the_closed_form_for_a_misreported_q_is_what_the_rule_does():
    from specref.checks.exact import enumerate_step, merge

    rng = np.random.default_rng(5)
    for _ in range(5):
        p, qs, qr = (torch.tensor(rng.dirichlet(np.ones(5))) for _ in range(3))
        qs[int(rng.integers(5))] = 0
        qs = qs / qs.sum()
        drafts = torch.nonzero(qs > 0)  # [R, 1] every draft the sampler can make
        w = qs[drafts[:, 0]]
        R = drafts.shape[0]
        tokens, prob = enumerate_step(drafts, qr.expand(R, 1, 5), p.expand(R, 2, 5), w)
        first = torch.zeros(5, dtype=torch.float64)
        for seq, x in merge(tokens, prob).items():
            first[seq[0]] += x
        assert torch.allclose(P.misreported_first_token(p, qs, qr), first, atol=1e-12, rtol=0)
        assert torch.allclose(P.misreported_first_token(p, qr, qr), p, atol=1e-12, rtol=0)


def test_first_token_exact_on_the_pair_is_p_for_the_exact_rule_and_not_for_typical_acceptance():
    from specref.typical import TypicalAcceptance

    target, draft = _pair64()
    prompt = heldout_prompts(n=1, n_tokens=20)[0]
    params = SamplingParams(1.0, 6, None)
    first, p1 = P.first_token_exact(target, draft, prompt, params)
    assert abs(float(first.sum()) - 1) < EXACT and P.tv_distance(first, p1) < EXACT
    first, p1 = P.first_token_exact(target, draft, prompt, params, P.acceptance_rule(TypicalAcceptance()))
    assert P.tv_distance(first, p1) > 1e-3
    with pytest.raises(ValueError, match="small top_k"):
        P.first_token_exact(target, draft, prompt, SamplingParams(1.0))
