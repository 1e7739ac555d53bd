"""Exercise 4: the decoder's output and the counted steps are tied to the target passes that decoded them.

Threat: the kernel holds its own copy of the pair, so a decoder (or a count) can decode off the books and book dummy
passes on the handed target and draft to match the counts the checks take. The decoder and count checks replay the
counted passes (`gpt2_pair._greedy_replay`): after the prompt, each target pass scores the last token and the
draft's greedy drafts (fed to the handed draft), and emits the greedy rule's outcome on them (`_step_outcome` at
temperature 0). The attacks below fail it; with the replay patched off (the negative control) they pass; the
solution and honest variants (fewer drafts near the budget, a draft that catches up lazily, a pass that emits the
first token from the prompt) pass.
"""

from __future__ import annotations

import pytest
import torch

from specref.models import heldout_prompts
from specref_grading.checks import gpt2_pair as G

from .test_ex04 import COUNT, STEP, TIMED_KS, TIMED_NEW, TIMED_PROMPTS, make_decoder
from .test_ex04_counted_passes import _own_pair


def _own_greedy(prompt, n):
    """Plain greedy decoding on the kernel's own copy: uncounted."""
    own_t, _ = _own_pair()
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(own_t(torch.tensor([prompt + out]))[0, -1].argmax()))
    return out


def _own_steps(prompt, k, n, out):
    """The steps speculation takes, counted on the kernel's own draft: uncounted."""
    _, own_d = _own_pair()
    steps, pos = 0, 0
    with torch.no_grad():
        while pos < n:
            drafts: list[int] = []
            for _ in range(k):
                drafts.append(int(own_d(torch.tensor([prompt + out[:pos] + drafts]))[0, -1].argmax()))
            acc = next((a for a, d in enumerate(drafts) if pos + a >= n or d != out[pos + a]), k)
            pos, steps = pos + acc + 1, steps + 1
    return steps


def _book(target, draft, prompt, out, k, steps):
    """Dummy passes booked to match what the checks count: the prompt, then `steps` passes that each score the last
    token and the next tokens of the output as "drafts" (fed to the draft too), the caches rolled back to match."""
    tc, dc = target.new_cache(1), draft.new_cache(1)
    target(torch.tensor([prompt[:-1]]), cache=tc)
    draft(torch.tensor([prompt[:-1]]), cache=dc)
    seq, pos = list(prompt), 0
    for s in range(steps):
        size = -(-(len(out) - pos) // (steps - s))  # spread what is left over the passes left
        drafts = out[pos : pos + min(size, k)]
        target(torch.tensor([seq[-1:] + drafts]), cache=tc)
        draft(torch.tensor([seq[-1:] + drafts[:-1]]), cache=dc)
        seq, pos = seq + out[pos : pos + size], pos + size
        tc.truncate(len(seq) - 1)
        dc.truncate(min(int(dc.lengths[0]), len(seq) - 1))


def off_the_books_decode(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None, generator=None):
    out = _own_greedy(list(prompt), max_new_tokens)
    _book(target, draft, list(prompt), out, k, _own_steps(list(prompt), k, max_new_tokens, out))
    return out


def off_the_books_count(target, draft, prompts, k, max_new_tokens):
    steps = 0
    for prompt in prompts:
        out = _own_greedy(list(prompt), max_new_tokens)
        s = _own_steps(list(prompt), k, max_new_tokens, out)
        _book(target, draft, list(prompt), out, k, s)
        steps += s
    return len(prompts) * max_new_tokens, steps


DECODE_SETTING = {"n_prompts": 1, "ks": (1, 3)}


def test_an_off_the_books_decoder_fails_the_decode_check():
    with pytest.raises(AssertionError, match="never tokens of models of your own"):
        G.check_speculative_decode(off_the_books_decode, **DECODE_SETTING)


def test_an_off_the_books_count_fails_both_count_checks():
    counts = {k: G.greedy_count(TIMED_PROMPTS, k, TIMED_NEW)[:2] for k in TIMED_KS}
    with pytest.raises(AssertionError, match="never tokens of models of your own"):
        G.check_timed_counts(off_the_books_count, counts, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)
    with pytest.raises(AssertionError, match="never tokens of models of your own"):
        G.check_step_counts(off_the_books_count, seed=1)


def test_control_without_the_replay_the_off_the_books_decoder_and_count_pass(monkeypatch, capsys):
    monkeypatch.setattr(G, "_greedy_replay", lambda *args: None)
    G.check_speculative_decode(off_the_books_decode, **DECODE_SETTING)
    counts = {k: G.greedy_count(TIMED_PROMPTS, k, TIMED_NEW)[:2] for k in TIMED_KS}
    G.check_timed_counts(off_the_books_count, counts, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)
    G.check_step_counts(off_the_books_count, seed=1)
    assert capsys.readouterr().out.count("passed") == 3


def test_the_graded_settings_are_replayed_and_their_logits_round_below_the_replay_margin():
    """A run within REPLAY_MARGIN of an argmax tie is not replayed: the exercise's graded settings clear it, and their
    logits stay below 32 in magnitude (float32 rounds them by at most 2e-6, the margin's premise)."""
    target, draft = G._pair64()
    runs = [(p, k, n) for first, ks, n in ((0, (1, 3, 5), 24), (2, (2, 4), 40))  # the visible and hidden decode checks
            for p in heldout_prompts(n=first + 2, n_tokens=24)[first:] for k in ks]
    runs += [(p, k, TIMED_NEW) for p in TIMED_PROMPTS for k in TIMED_KS]  # the timed counts
    for prompt, k, n in runs:
        expected = G._target_greedy(prompt, n)[0]
        margin = min(G._target_greedy(prompt, n + k + 1)[1], G._greedy_run(tuple(prompt), k, n, tuple(expected))[1])
        assert margin > G.REPLAY_MARGIN, (prompt[:3], k, margin)
    with torch.no_grad():
        for prompt, _, n in runs[::2]:
            ids = torch.tensor([prompt + G._target_greedy(prompt, n)[0]])
            assert max(float(target(ids).abs().max()), float(draft(ids).abs().max())) < 32


def test_the_solution_passes_the_tied_decode_and_count_checks(capsys):
    _, _, decode = make_decoder()
    G.check_speculative_decode(decode)
    G.check_timed_counts(COUNT, {k: G.greedy_count(TIMED_PROMPTS, k, TIMED_NEW)[:2] for k in TIMED_KS},
                         TIMED_PROMPTS, TIMED_NEW, TIMED_KS)
    assert capsys.readouterr().out.count("passed") == 2


def _honest_decode(variant):
    """Honest decoders that book their passes differently from the solution's."""

    def decode(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None, generator=None):
        tc, dc = target.new_cache(1), draft.new_cache(1)
        seq, new = list(prompt), []
        if variant == "prompt_pass_emits":  # the prompt's pass gives the first token; the cache then holds seq[:-1]
            new.append(int(target(torch.tensor([seq]), cache=tc)[0, -1].argmax()))
            seq.append(new[-1])
        else:
            target(torch.tensor([seq[:-1]]), cache=tc)
        if variant != "lazy_draft":  # a lazy draft is fed the whole prompt by its first proposal
            draft(torch.tensor([seq[:-1]]), cache=dc)
        while len(new) < max_new_tokens:
            left = max_new_tokens - len(new)
            kk = min(k, left - 1) if variant == "fewer_drafts_near_budget" else k
            if kk == 0:  # one token left: a plain pass of the target
                emitted = [int(target(torch.tensor([seq[-1:]]), cache=tc)[0, -1].argmax())]
            else:
                emitted = STEP(target, draft, seq, tc, dc, kk, temperature, top_k, generator)[:left]
            seq += emitted
            new += emitted
        return new

    return decode


@pytest.mark.parametrize("variant", ["fewer_drafts_near_budget", "lazy_draft", "prompt_pass_emits"])
def test_honest_decoders_that_book_their_passes_differently_pass(variant, capsys):
    G.check_speculative_decode(_honest_decode(variant), **DECODE_SETTING)
    assert "check_speculative_decode: passed" in capsys.readouterr().out
