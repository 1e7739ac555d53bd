"""Exercise 4's graders: the reference decoder passes, and each broken decoder is flagged by the check meant for it.

The sampling check must have power at the sample size it uses: the broken decoders that still
give the target's greedy output (skipping the residual, handing the rule an unprocessed q) are
flagged by `check_first_two_tokens` at its own N, and so is a target cache that is never rolled back.
"""

from __future__ import annotations

import pytest
import scipy.stats
import torch

from specref import process_logits, verify_chain
from specref.checks.montecarlo import verify_skip_residual
from specref.models import heldout_prompts
from specref_grading.checks import gpt2_pair as G

# --------------------------------------------------------------------------------------
# The reference solution, written with the learner's interface, and its broken twins
# --------------------------------------------------------------------------------------


def make_decoder(*bugs: str):
    """(propose, speculative_step, speculative_decode) as the solution notebook writes them, with `bugs` in."""

    def propose(draft, draft_cache, seq, k, temperature, top_k, generator):
        m = 0 if "draft_without_cache" in bugs else int(draft_cache.lengths[0])
        cache = None if "draft_without_cache" in bugs else draft_cache
        logits = draft(torch.tensor([seq[m:]]), cache=cache)[0, -1]
        drafts, qs = [], []
        for i in range(k):
            q = process_logits(logits, temperature, top_k)
            x = int(torch.multinomial(q, 1, generator=generator))
            drafts.append(x)
            qs.append(torch.softmax(logits, -1) if "q_unprocessed" in bugs else q)
            if i < k - 1:
                if cache is None:
                    logits = draft(torch.tensor([seq + drafts]))[0, -1]
                else:
                    logits = draft(torch.tensor([[x]]), cache=cache)[0, -1]
        return drafts, torch.stack(qs)

    def speculative_step(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
        drafts, q = propose(draft, draft_cache, seq, k, temperature, top_k, generator)
        if "pass_per_draft" in bugs:
            rows = [target(torch.tensor([seq[-1:] + drafts[:i]]), cache=target_cache.clone())[0, -1] for i in range(k)]
            logits = target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)[0]
            logits[:k] = torch.stack(rows)
        else:
            logits = target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)[0]
        p = process_logits(logits, temperature, top_k)
        if "skip_residual" in bugs:
            tokens, n = verify_skip_residual(torch.tensor([drafts]), q[None], p[None], generator)
            tokens, n = tokens[0, : int(n[0]) + 1], int(n[0])
        else:
            tokens, n = verify_chain(torch.tensor(drafts), q, p, generator)
        if "no_target_rollback" not in bugs:
            target_cache.truncate(len(seq) + n)
        if "no_draft_rollback" not in bugs:
            draft_cache.truncate(min(int(draft_cache.lengths[0]), len(seq) + n))
        return tokens.tolist()

    def speculative_decode(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None, generator=None):
        target_cache, draft_cache = target.new_cache(1), draft.new_cache(1)
        if len(prompt) > 1:
            target(torch.tensor([prompt[:-1]]), cache=target_cache)
            draft(torch.tensor([prompt[:-1]]), cache=draft_cache)
        seq, new = list(prompt), []
        while len(new) < max_new_tokens:
            emitted = speculative_step(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator)
            if "over_budget" not in bugs:
                emitted = emitted[: max_new_tokens - len(new)]
            seq += emitted
            new += emitted
        return list(prompt) + new if "with_prompt" in bugs else new

    return propose, speculative_step, speculative_decode


PROPOSE, STEP, DECODE = make_decoder()


# --------------------------------------------------------------------------------------
# The grader's own machinery
# --------------------------------------------------------------------------------------


def test_the_memo_returns_what_the_model_computes_and_writes_the_same_cache():
    target, _ = G._pair64()
    memo_model = G._Memo(target)
    seq = heldout_prompts(n=1, n_tokens=12)[0]
    with torch.no_grad():
        for _ in range(2):  # the second round is served from the memo
            c_memo = memo_model.new_cache(1, max_len=20)
            c_real = target.new_cache(1, max_len=20)
            outs = []
            for cache, model in ((c_memo, memo_model), (c_real, target)):
                a = model(torch.tensor([seq[:8]]), cache=cache)
                b = model(torch.tensor([seq[8:11]]), cache=cache)
                cache.truncate(9)
                c = model(torch.tensor([seq[9:12]]), cache=cache, logits_to_keep=1)
                outs.append((a, b, c))
            for x, y in zip(*outs):
                assert torch.equal(x, y)
            assert torch.equal(c_memo.lengths, c_real.lengths)
            assert torch.equal(c_memo.k[:, :, :, :12], c_real.k[:, :, :, :12])
            assert torch.equal(c_memo.v[:, :, :, :12], c_real.v[:, :, :, :12])
    assert memo_model.calls == 6 and len(memo_model._memo) == 3


def test_exact_first_two_is_a_distribution_over_a_small_support():
    s = G.SAMPLING
    target, _ = G._pair64()
    prompt = heldout_prompts(n=s["prompt"] + 1, n_tokens=s["n_tokens"])[s["prompt"]]
    exact = G.exact_first_two(target, prompt, s["temperature"], s["top_k"])
    assert abs(sum(exact.values()) - 1) < 1e-12
    assert len(exact) <= s["top_k"] ** 2
    assert len({y1 for y1, _ in exact}) == s["top_k"]


@pytest.mark.parametrize("setting", [G.SAMPLING, G.SAMPLING_HIDDEN], ids=["visible", "hidden"])
def test_the_sampling_settings_give_the_check_power_against_both_sampling_bugs(setting):
    """The effect sizes quoted in gpt2_pair's SAMPLING comment: exact, and far beyond what N samples resolve."""
    power = G.sampling_power(setting)
    assert power["tv_correct"] < 1e-12 and power["ncp_correct"] < 1e-20  # the rule itself is exact
    assert abs(power["beta"] - 0.50) < 0.01
    assert power["cells"] <= setting["top_k"] ** 2
    critical = scipy.stats.chi2.isf(1e-3, power["cells"] - 1)
    for bug in ("skip_residual", "q_unprocessed"):
        assert power[f"tv_{bug}"] > 3 * power["tv_bound"]
        lam = setting["n"] * power[f"ncp_{bug}"]  # the first token alone; the joint test sees at least as much
        assert lam > 10 * critical
        assert scipy.stats.ncx2.sf(critical, power["cells"] - 1, lam) > 1 - 1e-9
    assert power["tv_bound_full_vocabulary"] > 0.8  # what restricting the support buys


# --------------------------------------------------------------------------------------
# The reference passes; each broken decoder is flagged
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_reference_decoder_passes_every_check(capsys):
    G.check_propose(PROPOSE)
    G.check_speculative_step(STEP)
    G.check_speculative_decode(DECODE)
    assert capsys.readouterr().out.count("passed") == 3


@pytest.mark.slow
def test_the_hidden_checks_pass_the_reference():
    G.check_first_two_tokens(STEP, G.SAMPLING_HIDDEN, seed=1)
    G.check_speculative_decode(DECODE, n_prompts=2, first_prompt=2, ks=(2, 4), max_new_tokens=40)


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["skip_residual", "q_unprocessed", "no_target_rollback"])
def test_the_sampling_check_flags_a_broken_decoder_at_its_own_sample_size(bug):
    _, step, _ = make_decoder(bug)
    with pytest.raises(AssertionError, match="do not follow the target's distribution"):
        G.check_first_two_tokens(step)


@pytest.mark.parametrize(
    "bug, message",
    [
        ("no_target_rollback", "the target cache holds"),
        ("no_draft_rollback", "the draft cache holds"),
        ("draft_without_cache", "the draft cache holds"),
        ("pass_per_draft", "called the target"),
    ],
)
def test_the_step_check_flags_broken_caches_and_extra_passes(bug, message):
    _, step, _ = make_decoder(bug)
    with pytest.raises(AssertionError, match=message):
        G.check_step_caches(step)


@pytest.mark.parametrize(
    "bug, message", [("q_unprocessed", "looks unprocessed"), ("draft_without_cache", "never recompute")]
)
def test_the_propose_check_flags_an_unprocessed_q_and_a_draft_without_cache(bug, message):
    propose, _, _ = make_decoder(bug)
    with pytest.raises(AssertionError, match=message):
        G.check_propose(propose)


@pytest.mark.parametrize(
    "bug, message",
    [("no_target_rollback", "first difference"), ("with_prompt", "first difference"),
     ("over_budget", "first difference"),
     ("pass_per_draft", "called the target")],
)
def test_the_decode_check_flags_wrong_output_and_extra_passes(bug, message):
    _, _, decode = make_decoder(bug)
    with pytest.raises(AssertionError, match=message):
        G.check_speculative_decode(decode)


def test_plain_decoding_is_not_speculation():
    def plain(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None, generator=None):
        cache, out = target.new_cache(1), []
        logits = target(torch.tensor([prompt]), cache=cache)[0, -1]
        for _ in range(max_new_tokens):
            out.append(int(logits.argmax()))
            logits = target(torch.tensor([[out[-1]]]), cache=cache)[0, -1]
        return out

    with pytest.raises(AssertionError, match="called the target"):
        G.check_speculative_decode(plain, n_prompts=1)


def test_an_unsolved_stub_reaches_the_learner_as_not_implemented():
    def stub(*args):
        raise NotImplementedError()

    for check in (G.check_propose, G.check_step_caches, G.check_first_two_tokens, G.check_speculative_decode):
        with pytest.raises(NotImplementedError):
            check(stub)


# -- ex04: the wrappers count every pass, and the checks see speculation happen (red team a03, a04) --------

def test_the_model_behind_the_pass_counter_is_not_reachable_by_a_public_name():
    target, _ = G._graded_pair(G._learners_pair())
    assert not hasattr(target, "model")
    assert list(target.children()) == [] and list(target.parameters()) == []
    with pytest.raises(AttributeError):
        target.get_submodule("_inner")
    for name in ("get_parameter", "get_buffer"):
        with pytest.raises(AttributeError):
            getattr(target, name)("_inner.lm_head.weight")


def test_plain_decoding_with_dummy_counted_passes_fails_the_decode_check():
    """a03: plain greedy decoding on a model the wrapper does not see, then as many one-token counted passes as
    speculation needs (the output and the pass count are right; the passes did not decode it)."""
    prompt = heldout_prompts(n=1, n_tokens=24)[0]
    model, _ = G._pair64()  # stands for any model the wrapper does not see (the notebook's own pair)
    plain: list[int] = []
    with torch.no_grad():
        for _ in range(24):
            plain.append(int(model(torch.tensor([prompt + plain]))[0, -1].argmax()))
    steps = G._greedy_steps(prompt, 3, 24, plain)

    def decode(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None, generator=None):
        for _ in range(steps + 1):
            target(torch.tensor([[0]]))
        return list(plain)

    with pytest.raises(AssertionError, match="were not fed the prompt and the tokens"):
        G.check_speculative_decode(decode, n_prompts=1, ks=(3,))


def _sample_from_target_alone(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
    """a04 (sampled steps): one token from the target, no drafts: the right distribution, no speculation."""
    from specref.sampling import process_logits
    with torch.no_grad():
        logits = target(torch.tensor([seq[-1:]]), cache=target_cache)[0, -1]
    return [int(torch.multinomial(process_logits(logits, temperature, top_k), 1, generator=generator))]


def test_a_step_that_never_drafts_fails_the_sampling_check():
    small = dict(G.SAMPLING, n=50)
    with pytest.raises(AssertionError, match="never called the draft"):
        G.check_first_two_tokens(_sample_from_target_alone, sampling=small)


def _reject_every_draft(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
    """Drafts and one verifying pass, then a token from p_1 alone: the right first token, no draft ever accepted."""
    drafts, _ = PROPOSE(draft, draft_cache, seq, k, temperature, top_k, generator)
    logits = target(torch.tensor([seq[-1:] + drafts]), cache=target_cache)[0]
    target_cache.truncate(len(seq))
    draft_cache.truncate(min(int(draft_cache.lengths[0]), len(seq)))
    return [int(torch.multinomial(process_logits(logits[0], temperature, top_k), 1, generator=generator))]


def test_a_step_that_rejects_every_draft_fails_the_sampling_check():
    with pytest.raises(AssertionError, match="rarely accept a draft"):
        G.check_first_two_tokens(_reject_every_draft, sampling=dict(G.SAMPLING, n=200))
