"""Exercise 4: the passes a step is counted for are the passes that produced what it emitted.

Threat: the kernel holds its own copy of the pair (it can load_pair() itself), so a step can decode off the books on
its own models and book one pass of the target it was handed, fed fake drafts; counts alone cannot see it. The check
ties the emission to the counted passes (`gpt2_pair._step_outcome`): the drafts the target's pass scored were fed to
the handed draft and lie in q's support, and the emitted tokens are an outcome of the rule on those p and q. The
attacks below fail it; with the tie patched off (the negative control) the same attacks pass; the solution passes.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from specref.models import load_pair
from specref_grading.checks import gpt2_pair as G

from .test_ex04 import PROPOSE, STEP


@functools.lru_cache(maxsize=1)
def _own_pair():
    """The kernel's own copy of the pair (the notebook may call load_pair() itself), in float64."""
    target, draft, _ = load_pair()
    return copy.deepcopy(target).double().eval(), copy.deepcopy(draft).double().eval()


def _own_step(seq, k, temperature, top_k, generator):
    """A correct step on models the wrappers never see: uncounted."""
    own_t, own_d = _own_pair()
    tc, dc = own_t.new_cache(1, max_len=len(seq) + k + 2), own_d.new_cache(1, max_len=len(seq) + k + 2)
    with torch.no_grad():
        own_t(torch.tensor([seq[:-1]]), cache=tc)
        own_d(torch.tensor([seq[:-1]]), cache=dc)
    return STEP(own_t, own_d, list(seq), tc, dc, k, temperature, top_k, generator)


def make_off_the_books(feed_draft_the_fakes: bool):
    """The attack: decode off the books, then book one target pass on [seq[-1]] + the emitted tokens padded with a
    fake token (0), one draft call, and both caches rolled to where a real step leaves them."""

    def step(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
        emitted = _own_step(seq, k, temperature, top_k, generator)
        drafts = (emitted[:-1] + [0] * k)[:k]
        target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)
        target_cache.truncate(len(seq) + len(emitted) - 1)
        fed = drafts[:-1] if feed_draft_the_fakes else emitted[:-1]
        draft(torch.tensor([seq[-1:] + fed]), cache=draft_cache)
        draft_cache.truncate(len(seq) + len(emitted) - 1 - (len(emitted) == k + 1))
        return emitted

    return step


@pytest.mark.parametrize("feed", [False, True], ids=["fakes_not_fed_to_the_draft", "fakes_fed_to_the_draft"])
def test_a_step_decoded_off_the_books_fails_the_step_check(feed):
    with pytest.raises(AssertionError, match="never of models of your own"):
        G.check_step_caches(make_off_the_books(feed))


@pytest.mark.parametrize("feed", [False, True], ids=["fakes_not_fed_to_the_draft", "fakes_fed_to_the_draft"])
def test_control_without_the_tie_the_off_the_books_step_passes(feed, monkeypatch, capsys):
    monkeypatch.setattr(G, "_step_outcome", lambda *args: None)
    monkeypatch.setattr(G, "_fed_in_order", lambda fed, tokens: True)
    G.check_step_caches(make_off_the_books(feed))
    assert "check_step_caches: passed" in capsys.readouterr().out


def test_the_solution_passes_the_tied_step_checks(capsys):
    G.check_step_caches(STEP)
    G.check_first_two_tokens(STEP, sampling=dict(G.SAMPLING, n=300), seed=3)
    assert capsys.readouterr().out.count("passed") == 2


def test_the_outcome_rule_is_the_greedy_rule_at_temperature_zero():
    """At temperature 0 p and q are one-hot: the only outcome is what the greedy rule emits, every other is refused."""
    cases = [c for c in G._step_cases() if c[3] == 0.0]
    for _, seq, k, _, _, _ in cases:
        want = G._greedy_reference_step(seq, k)
        target, draft = G._pair64()
        drafts: list[int] = []
        with torch.no_grad():
            for _ in range(k):
                drafts.append(int(draft(torch.tensor([seq + drafts]))[0, -1].argmax()))
        assert G._step_outcome(tuple(seq), tuple(drafts), tuple(want), 0.0, None) is None
        wrong = want[:-1] + [(want[-1] + 1) % target.config.vocab_size]
        assert G._step_outcome(tuple(seq), tuple(drafts), tuple(wrong), 0.0, None) is not None


def _accept_when_possible(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
    """Drafts from q and one verifying pass, then every draft p allows is accepted (no min(1, p/q) coin)."""
    from specref.sampling import process_logits
    drafts, _ = PROPOSE(draft, draft_cache, seq, k, temperature, top_k, generator)
    p = process_logits(target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)[0], temperature, top_k)
    n = next((i for i, x in enumerate(drafts) if float(p[i, x]) <= 0), k)
    target_cache.truncate(len(seq) + n)
    draft_cache.truncate(min(int(draft_cache.lengths[0]), len(seq) + n))
    if n < k:  # a y of the residual's support, as the rule would draw it
        q = process_logits(draft(torch.tensor([seq + drafts[:n]]))[0, -1], temperature, top_k)
        r = (p[n] - q).clamp(min=0)
        return drafts[:n] + [int(torch.multinomial(r / r.sum(), 1, generator=generator))]
    return drafts + [int(torch.multinomial(p[k], 1, generator=generator))]


def test_a_step_that_accepts_every_draft_it_can_fails_the_sampling_check():
    with pytest.raises(AssertionError, match="more drafts than the rule can"):
        G.check_first_two_tokens(_accept_when_possible, sampling=dict(G.SAMPLING, n=300))


def _float32_step(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
    """An honest step that processes the logits in float32 (p and q near a tie may round the other way)."""
    from specref import verify_chain
    from specref.sampling import process_logits
    m = int(draft_cache.lengths[0])
    logits = draft(torch.tensor([seq[m:]]), cache=draft_cache)[0, -1].float()
    drafts, qs = [], []
    for i in range(k):
        q = process_logits(logits, temperature, top_k)
        drafts.append(int(torch.multinomial(q, 1, generator=generator)))
        qs.append(q)
        if i < k - 1:
            logits = draft(torch.tensor([[drafts[-1]]]), cache=draft_cache)[0, -1].float()
    p = process_logits(target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)[0].float(), temperature, top_k)
    tokens, n = verify_chain(torch.tensor(drafts), torch.stack(qs), p, generator)
    target_cache.truncate(len(seq) + n)
    draft_cache.truncate(min(int(draft_cache.lengths[0]), len(seq) + n))
    return tokens.tolist()


def test_an_honest_float32_step_passes_the_tied_checks(capsys):
    G.check_step_caches(_float32_step)
    G.check_first_two_tokens(_float32_step, seed=5)
    G.check_first_two_tokens(_float32_step, G.SAMPLING_HIDDEN, seed=6)
    assert capsys.readouterr().out.count("passed") == 3
