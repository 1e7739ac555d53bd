"""SelfDraft: the target's own first layers, ln_f and LM head as the draft; lossless through the one verifier.

The early-exit model is the target cut after block n (shared weights); on the grown target it runs the
grown blocks and accepts as on the bundled one; a sampled step's exact output distribution is p (enumerated
on a 6-token model); the draft's cache after a rollback is a recompute of the kept tokens; a bad n_layers
is refused; and on the bundled target acceptance rises with the layers (counted, float64). What every draft
must do (greedy output equal to the target's, chains and trees, bundled and grown) is
tests/test_draft_contract.py's.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import small_gpt2

from specref.checks.exact import enumerate_step, merge
from specref.decoding.chain import generate, speculative_generate, speculative_step
from specref.decoding.loop import Sequences, SpecStats, prefill
from specref.drafts import load_draft
from specref.drafts.base import draw
from specref.drafts.early_exit import DEFAULT_LAYERS, SelfDraft, early_exit_model
from specref.drafts.load import DRAFTS
from specref.models.grow import widen
from specref.models.pair import heldout_prompts, load_pair
from specref.perf.draft_costs import kv_bytes_per_token, own_parameters, step_passes
from specref.sampling import SamplingParams


@pytest.fixture(scope="module")
def target64():
    return load_pair(dtype=torch.float64)[0]


@pytest.fixture(scope="module")
def heldout():
    return torch.tensor(heldout_prompts(4, 32))


# -- what the draft is ------------------------------------------------------------------------------


def test_the_early_exit_model_is_the_target_cut_after_block_n(target64, heldout):
    """Its logits are lm_head(ln_f(h_n)), h_n the target's residual stream after block n - 1 (no copy of a weight)."""
    n = 3
    model = early_exit_model(target64, n)
    with torch.no_grad():
        h_n = target64(heldout, return_hidden=True).hidden_states[n]  # the input of block n
        want = target64.lm_head(target64.transformer.ln_f(h_n))
        got = model(heldout)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    shared = {p.data_ptr() for p in target64.parameters()}
    assert all(p.data_ptr() in shared for p in model.parameters())
    assert model.config.n_layer == n and len(model.transformer.h) == n


def test_it_adds_no_parameters_and_caches_only_its_own_layers(target64, heldout):
    draft = SelfDraft(target64, 3)
    assert own_parameters(draft, target64) == 0
    speculative_generate(target64, draft, heldout[:1], k=2, max_new_tokens=4, temperature=0)
    c = target64.config
    assert kv_bytes_per_token(draft) == 2 * 3 * c.n_embd * 8  # K and V, 3 layers, float64
    passes = step_passes(draft, target64, 4)
    assert len(passes) == 4 and all(p.target_head for p in passes)
    block = sum(p.numel() for p in target64.transformer.h[0].parameters())
    assert sum(int(torch.tensor(s).prod()) for s in passes[0].shapes) == 3 * block + 2 * c.n_embd


def test_load_draft_builds_it_with_the_default_depth_or_the_one_asked(target64):
    draft = load_draft("early_exit", target64)
    assert type(draft) is SelfDraft and draft.n_layers == DEFAULT_LAYERS
    assert load_draft("early_exit", target64, n_layers=5).n_layers == 5
    assert "early_exit" not in DRAFTS  # made of the target: nothing shipped
    with pytest.raises(ValueError, match="n_layers is the early-exit draft's depth"):
        load_draft("medusa", target64, n_layers=2)


@pytest.mark.parametrize("bad", [0, -1, 13])
def test_a_depth_outside_the_target_is_refused(target64, bad):
    with pytest.raises(ValueError, match="n_layers"):
        SelfDraft(target64, bad)


@pytest.mark.parametrize("bad", [2.0, True, "3", None])
def test_a_depth_that_is_not_an_int_is_refused(target64, bad):
    with pytest.raises(TypeError, match="n_layers"):
        SelfDraft(target64, bad)


def test_a_target_that_is_not_a_gpt2_is_refused():
    with pytest.raises(TypeError, match="target"):
        SelfDraft(torch.nn.Linear(2, 2), 1)


# -- on the grown target -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grown64(target64):
    return widen(target64, 2)


def test_on_the_grown_target_it_runs_the_grown_blocks_and_accepts_as_on_the_bundled_one(target64, grown64, heldout):
    """The grown target's own wide first layers (its cost), the same function: the same output and counts."""
    draft = SelfDraft(grown64, DEFAULT_LAYERS)
    assert draft.model.config.n_embd == grown64.config.n_embd
    assert draft.model.transformer.h[0] is grown64.transformer.h[0]
    x = heldout[:2]
    out, on_big = speculative_generate(grown64, draft, x, k=3, max_new_tokens=16, temperature=0)
    assert torch.equal(out, generate(grown64, x, 16, temperature=0))
    _, on_small = speculative_generate(target64, SelfDraft(target64, DEFAULT_LAYERS), x, k=3, max_new_tokens=16,
                                       temperature=0)
    assert (on_small.accepted, on_small.emitted, on_small.steps) == (on_big.accepted, on_big.emitted, on_big.steps)


# -- sampling: one step's exact output distribution is p ----------------------------------------------

V = 6
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def tiny():
    return small_gpt2(vocab=V, n_embd=16, n_layer=3, seed=5, n_positions=16, scale=3.0)


def _scripted(tokens):
    """A sampler that emits the given drafts in turn, with the q `draw` computes (the draft's own processing)."""
    it = iter(tokens)

    def sampler(logits, params, generator):
        _, q = draw(logits, params, generator)
        return torch.full(logits.shape[:-1], next(it), dtype=torch.long), q

    return sampler


def _self_draft_step(target, n_layers, params, report=None):
    """Every outcome of one sampled step (k = 2) of a SelfDraft after PROMPT, with its exact probability.

    Each draft pair (x1, x2) is weighted q1(x1) q2(x2 | x1), with q as the draft computes it; `report`
    (if given) replaces the q handed to the rule (a negative control)."""
    g = torch.Generator().manual_seed(0)
    drafts, qs, ps, weights = [], [], [], []
    for x1 in range(V):
        for x2 in range(V):
            draft = SelfDraft(target, n_layers, sampler=_scripted([x1, x2]))
            draft.begin(1)
            ids = torch.tensor([PROMPT])
            _, q = draft.propose(ids, torch.tensor([len(PROMPT)]), 2, params, g)  # [1, 2, V]
            w = q[0, 0, x1] * q[0, 1, x2]
            if w == 0:
                continue
            with torch.no_grad():
                p = params.probs(target(torch.tensor([PROMPT + [x1, x2]]))[0, -3:])  # [3, V]
            drafts.append([x1, x2])
            qs.append(q[0] if report is None else report(q[0]))
            ps.append(p)
            weights.append(w)
    tokens, prob = enumerate_step(torch.tensor(drafts), torch.stack(qs), torch.stack(ps), torch.stack(weights))
    return merge(tokens, prob)


def _first_token(step: dict) -> torch.Tensor:
    out = torch.zeros(V, dtype=torch.float64)
    for seq, w in step.items():
        out[seq[0]] += w
    return out


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=3)], ids=str)
def test_a_sampled_step_emits_exactly_the_targets_distribution(tiny, params):
    with torch.no_grad():
        p = params.probs(tiny(torch.tensor([PROMPT]))[0, -1])
    step = _self_draft_step(tiny, 1, params)
    assert sum(step.values()) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(_first_token(step), p, atol=1e-12, rtol=0)
    assert any(len(seq) == 3 for seq in step), "no outcome accepted both drafts: the test would miss draft 2's q"


def test_negative_control_a_q_not_processed_like_p_is_caught(tiny):
    """The same enumeration, handing the rule q at temperature 1 while drafting at 0.7 with top-3: not p."""
    params = SamplingParams(0.7, top_k=3)
    with torch.no_grad():
        p = params.probs(tiny(torch.tensor([PROMPT]))[0, -1])
        raw = early_exit_model(tiny, 1)(torch.tensor([PROMPT]))[0, -1].softmax(-1)

    def unprocessed(q):  # the first position's q replaced by the unprocessed softmax
        return torch.stack([raw, q[1]])

    step = _self_draft_step(tiny, 1, params, report=unprocessed)
    assert (_first_token(step) - p).abs().sum() > 1e-3


# -- rollback: the cache holds exactly the kept tokens ---------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_after_rollback_equals_a_recompute_of_the_kept_tokens(temperature):
    target = small_gpt2(vocab=64, n_embd=32, n_layer=3, seed=0, scale=4.0)
    draft = SelfDraft(target, 1)
    ids = torch.tensor([[1, 2, 3, 4], [9, 8, 7, 6]])
    seqs = Sequences(ids, 40)
    cache = target.new_cache(2)
    draft.begin(2)
    prefill(target, ids, cache, SpecStats(k=1))
    g = torch.Generator().manual_seed(0)
    rejected = 0
    while not seqs.done:
        step = speculative_step(target, draft, seqs, cache, 4, SamplingParams(temperature), g)
        rejected += sum(n < step.drafts.shape[1] for n in step.n_accepted)
        kv = draft.cache.kv
        for b, n in enumerate(kv.lengths.tolist()):
            assert seqs.lengths_h[b] - 2 <= n <= seqs.lengths_h[b]
            fresh = draft.model.new_cache(1)
            draft.model(seqs.tokens[b : b + 1, :n], cache=fresh)
            torch.testing.assert_close(kv.k[:, b, :, :n], fresh.k[:, 0, :, :n], atol=1e-10, rtol=0)
            torch.testing.assert_close(kv.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-10, rtol=0)
    assert rejected > 0, "no draft was rejected: the test would not notice a rollback that does nothing"


# -- counted: acceptance rises with the layers ----------------------------------------------------------


def test_acceptance_rises_with_the_layers_and_the_whole_target_accepts_everything(target64, heldout):
    """Greedy, float64, fixed held-out prompts: accepted drafts counted for 1, 8, 10 and all 12 blocks.

    Up to about half the depth the exit accepts about as often as one block does; the last blocks
    are what raise it (the count at 1 block is well below the count at 8, which is below 10).
    """
    accepted = {}
    for n in (1, 8, 10, 12):
        _, stats = speculative_generate(target64, SelfDraft(target64, n), heldout, k=2, max_new_tokens=32,
                                        temperature=0)
        accepted[n] = stats.accepted
        if n == 12:
            assert stats.accepted == stats.examined, "the target drafting for itself is never rejected"
    assert accepted[1] < accepted[8] < accepted[10] < accepted[12]
