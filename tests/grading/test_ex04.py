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
    with pytest.raises(AssertionError, match="do not follow the target's distribution|an outcome of those counted"):
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
    with pytest.raises(AssertionError, match="rarely accept a draft|an outcome of those counted"):
        G.check_first_two_tokens(_reject_every_draft, sampling=dict(G.SAMPLING, n=200))


# -- Task 4: the timed run's counts and the prediction (no point depends on a timing) ----------------------------

TIMED_PROMPTS = heldout_prompts(n=6, n_tokens=24)[4:]  # the exercise's timed run, as its setup cell states it
TIMED_NEW, TIMED_KS = 24, (2, 4)


def make_count_steps(*bugs: str):
    """count_steps as the solution writes it (around the reference step), with `bugs` in."""

    def count_steps(target, draft, prompts, k, max_new_tokens):
        tokens = steps = 0
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for prompt in prompts:
                target_cache, draft_cache = target.new_cache(1), draft.new_cache(1)
                target(torch.tensor([prompt[:-1]]), cache=target_cache)
                draft(torch.tensor([prompt[:-1]]), cache=draft_cache)
                steps += "prompt_pass_as_step" in bugs
                seq = list(prompt)
                while len(seq) - len(prompt) < max_new_tokens:
                    emitted = STEP(target, draft, seq, target_cache, draft_cache, k, 0.0, None, generator)
                    seq += emitted[: max_new_tokens - (len(seq) - len(prompt))]
                    steps += 1
                tokens += len(seq) - len(prompt)
        return (tokens, steps + ("one_step_more" in bugs))

    return count_steps


COUNT = make_count_steps()


def _timed_counts() -> dict[int, tuple[int, int]]:
    return {k: G.greedy_count(TIMED_PROMPTS, k, TIMED_NEW)[:2] for k in TIMED_KS}


def test_the_solution_times_the_run_these_tests_hold_to_the_count_margin():
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[2] / "solutions" / "ex04_gpt2_pair.ipynb").read_text())
    setup = "".join(next(c["source"] for c in nb["cells"] if "".join(c["source"]).startswith("import copy")))
    assert "TIMED_PROMPTS = heldout_prompts(n=6, n_tokens=24)[4:]" in setup
    assert "TIMED_NEW, TIMED_KS = 24, (2, 4)" in setup


def test_the_timed_run_clears_the_count_margin_by_far_more_than_float32_moves_the_logits():
    """The check compares float32 counts with float64 ones: every decision of the run is COUNT_MARGIN from a tie,
    and float32 (the grown target, the bundled draft) moves these logits by less than a quarter of that."""
    from specref import load_grown_pair
    for k in TIMED_KS:
        assert G.greedy_count(TIMED_PROMPTS, k, TIMED_NEW)[2] > G.COUNT_MARGIN
    target64, draft64 = G._pair64()
    grown, draft32, _, _ = load_grown_pair()
    worst = 0.0
    with torch.no_grad():
        for prompt in TIMED_PROMPTS:
            seq = torch.tensor([prompt + G._target_greedy(prompt, TIMED_NEW)[0]])
            for m32, m64 in ((grown, target64), (draft32, draft64)):
                worst = max(worst, float((m32(seq).double() - m64(seq)).abs().max()))
    assert worst < G.COUNT_MARGIN / 4, worst


def test_counts_of_the_timed_run_on_the_grown_float32_pair_pass_the_check(capsys):
    from specref import load_grown_pair
    grown, draft32, _, _ = load_grown_pair()
    counts = {k: COUNT(grown, draft32, TIMED_PROMPTS, k, TIMED_NEW) for k in TIMED_KS}
    G.check_timed_counts(COUNT, counts, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)
    assert "your timed run's counts equal the grader's count" in capsys.readouterr().out


def test_the_hidden_count_check_passes_the_reference():
    G.check_step_counts(COUNT, seed=1)


@pytest.mark.parametrize("bug, message", [("prompt_pass_as_step", "expected .* steps"),
                                          ("one_step_more", "expected .* steps")])
def test_the_count_check_flags_a_miscounted_step(bug, message):
    with pytest.raises(AssertionError, match=message):
        G.check_timed_counts(make_count_steps(bug), _timed_counts(), TIMED_PROMPTS, TIMED_NEW, TIMED_KS)


def test_the_count_check_flags_plain_decoding_counted_as_steps():
    def plain(target, draft, prompts, k, max_new_tokens):
        tokens = 0
        with torch.no_grad():
            for prompt in prompts:
                cache, seq = target.new_cache(1), list(prompt)
                logits = target(torch.tensor([seq]), cache=cache)[0, -1]
                for _ in range(max_new_tokens):
                    seq.append(int(logits.argmax()))
                    logits = target(torch.tensor([seq[-1:]]), cache=cache)[0, -1]
                tokens += max_new_tokens
        return tokens, tokens

    with pytest.raises(AssertionError, match="the target was called"):
        G.check_timed_counts(plain, _timed_counts(), TIMED_PROMPTS, TIMED_NEW, TIMED_KS)


@pytest.mark.parametrize("reported", [
    "off_by_one", "swapped", "one_k_missing", "a_ratio"], ids=str)
def test_the_count_check_flags_timed_counts_that_are_not_the_run(reported):
    right = _timed_counts()
    counts = {"off_by_one": {k: (t, s + 1) for k, (t, s) in right.items()},
              "swapped": dict(zip(TIMED_KS, reversed(list(right.values())))),
              "one_k_missing": {TIMED_KS[0]: right[TIMED_KS[0]]},
              "a_ratio": {k: t / s for k, (t, s) in right.items()}}[reported]
    with pytest.raises(AssertionError, match="counts of your timed run"):
        G.check_timed_counts(COUNT, counts, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)


def test_timed_counts_are_read_by_value():
    right = _timed_counts()
    as_tensors = {k: torch.tensor(v) for k, v in right.items()}
    as_list = [list(right[k]) for k in TIMED_KS]  # aligned with ks
    for counts in (as_tensors, as_list, {float(k): (float(t), float(s)) for k, (t, s) in right.items()}):
        G.check_timed_counts(COUNT, counts, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)


def test_a_count_that_calls_specrefs_loop_scores_zero():
    from specref.decoding.chain import speculative_generate

    def count(target, draft, prompts, k, max_new_tokens):
        return speculative_generate(target, draft, torch.tensor([prompts[0]]), k=k, max_new_tokens=max_new_tokens)

    with pytest.raises(AssertionError, match="asks you to write yourself"):
        G.check_timed_counts(count, _timed_counts(), TIMED_PROMPTS, TIMED_NEW, TIMED_KS)


V_REPEATS = {2: [1.04, 0.98, 1.31, 1.02, 1.10], 4: [1.01, 1.07, 1.60, 0.99, 1.05]}  # skewed: mean != median
C_REPEATS = [0.061, 0.083, 0.066, 0.070, 0.064]
COUNTS = {2: (48, 17), 4: (48, 13)}


def _prediction(counts=COUNTS, v=V_REPEATS, c=C_REPEATS, centre=None):
    import statistics
    centre = centre or statistics.median
    return {k: (t / s) / (centre(v[k]) + centre(c) * k) for k, (t, s) in counts.items()}


def test_the_prediction_check_passes_the_learners_own_arithmetic_in_float64_and_float32(capsys):
    G.check_prediction(COUNTS, V_REPEATS, C_REPEATS, _prediction(), TIMED_KS)
    # the same arithmetic in float32 tensors: within the rounding PREDICTION_RTOL allows for
    v32 = {k: torch.tensor(v, dtype=torch.float32) for k, v in V_REPEATS.items()}
    c32 = torch.tensor(C_REPEATS, dtype=torch.float32)
    p32 = {k: (torch.tensor(float(t), dtype=torch.float32) / s) / (v32[k].sort().values[2] + c32.sort().values[2] * k)
           for k, (t, s) in COUNTS.items()}
    G.check_prediction(COUNTS, v32, c32, p32, TIMED_KS)
    assert capsys.readouterr().out.count("passed") == 2


@pytest.mark.parametrize("wrong", ["mean", "c_times_k_plus_1", "no_draft_cost", "alpha_formula", "off_1e-5"])
def test_the_prediction_check_flags_a_prediction_not_made_from_the_reported_values(wrong):
    import statistics
    if wrong == "mean":
        pred = _prediction(centre=statistics.mean)
    elif wrong == "c_times_k_plus_1":
        pred = {k: (t / s) / (statistics.median(V_REPEATS[k]) + statistics.median(C_REPEATS) * (k + 1))
                for k, (t, s) in COUNTS.items()}
    elif wrong == "no_draft_cost":
        pred = {k: (t / s) / statistics.median(V_REPEATS[k]) for k, (t, s) in COUNTS.items()}
    elif wrong == "alpha_formula":  # E(alpha, k) at an alpha from the counts instead of the counted tokens per step
        alpha = {k: (t / s - 1) / k for k, (t, s) in COUNTS.items()}
        pred = {k: ((1 - a ** (k + 1)) / (1 - a)) / (statistics.median(V_REPEATS[k]) + statistics.median(C_REPEATS) * k)
                for k, a in alpha.items()}
    else:
        pred = {k: x * (1 + 1e-5) for k, x in _prediction().items()}
    with pytest.raises(AssertionError, match="you predicted"):
        G.check_prediction(COUNTS, V_REPEATS, C_REPEATS, pred, TIMED_KS)


def test_the_prediction_check_asks_for_an_odd_number_of_repeats_and_every_k():
    even = {k: v[:4] for k, v in V_REPEATS.items()}
    with pytest.raises(AssertionError, match="odd number"):
        G.check_prediction(COUNTS, even, C_REPEATS, _prediction(), TIMED_KS)
    with pytest.raises(AssertionError, match="odd number"):
        G.check_prediction(COUNTS, V_REPEATS, C_REPEATS[:4], _prediction(), TIMED_KS)
    with pytest.raises(AssertionError, match="maps each k"):
        G.check_prediction(COUNTS, V_REPEATS, C_REPEATS, {2: _prediction()[2]}, TIMED_KS)


def test_an_unsolved_count_reaches_the_learner_as_not_implemented():
    def stub(*args):
        raise NotImplementedError("Task 4: write count_steps (see the task above)")

    with pytest.raises(NotImplementedError, match="Task 4 is not done yet"):
        G.check_timed_counts(stub, None, TIMED_PROMPTS, TIMED_NEW, TIMED_KS)
    with pytest.raises(NotImplementedError, match="Task 4 is not done yet"):
        G.check_step_counts(stub, seed=1)
