"""Graders for exercise 5: prompt-lookup drafting, written by the learner.

Task 1, lookup_proposal(context, k, max_ngram, min_ngram) -> k token ids (the rule of
`specref.drafts.prompt_lookup`): its proposals against the reference `lookup` on random token streams.

Task 2, the class LookupDraft(vocab_size, max_ngram, min_ngram) with begin(batch_size),
propose(tokens, lengths, k) -> (drafts [B, k], q [B, k, V]) and rollback(n_valid): the draft that makes
prompt lookup a lossless draft at temperature 1. Graded by driving it directly (proposals after a rollback
follow the kept buffer, shapes, inputs unchanged), then by a distribution test: the first two tokens of
thousands of speculative generations at temperature 1 on a small random GPT-2 built from the seed,
against their exact distribution (`specref.checks.montecarlo.distribution_test`). The test has power
at its sample size: a draft that reports a smoothed q for the same proposals fails it
(tests/grading/test_ex05.py). The sample size is RUNS = 16,000 generations: at 4,000 (with the level below) a
draft reporting q = 0.9 one-hot + 0.1 uniform passed 14 hidden seeds in 100, at 16,000 none of 100 (its
chi-square at least 1.37 x the critical value); the batched generations cost about 0.3 s more per grading.
Its false-fail rate at a random seed is at most FALSE_FAIL_RATE = 5e-4 (1 in
2,000): a correct draft fails when the chi-square p-value is below SAMPLING_ALPHA = 2.5e-4 or the TV exceeds
its Bretagnolle-Huber-Carol bound at that level (each with probability at most SAMPLING_ALPHA);
tests/grading/test_false_fail.py measures it.

Task 3, compare_tau(a, b, level) -> ((tau_a, low_a, high_a), (tau_b, low_b, high_b), verdict): tokens per
target pass from per-step counts, each with its two-sided t-interval, and the decision the intervals allow (+1: a
above b, -1: below, 0: they overlap). Graded against the same statistics computed here with scipy on seeded
per-step counts (sizes 2 to 400, levels 0.80 to 0.99, pairs that overlap and pairs that do not, none on the
edge); no sampling in the check, so a correct answer never fails (FALSE_FAIL_RATE_TAU = 0). Tolerance
INTERVAL_RTOL = 1e-6 relative: float32 arithmetic of a mean and a quantile stays within it, and the usual
mistakes (a normal quantile for the t one, ddof = 0, a one-sided quantile) are at least 50 times further out
on the check's cases (tests/grading/test_ex05.py).

The reference rule (`specref_grading.checks.rules`): a task that calls the specref function it asks the
learner to write scores 0, with a message that says why.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from scipy import stats

from specref.checks.montecarlo import distribution_test
from specref.decoding.chain import speculative_generate
from specref.drafts import Draft
from specref.drafts.prompt_lookup import lookup
from specref.models.gpt2 import GPT2, GPT2Config
from specref.sampling import SamplingParams

from .report import as_float, as_int, as_ints, as_items, call_learner, failure, passed
from .rules import graded

Proposal = Callable[[list[int], int, int, int], object]

# What the tasks must not call: the reference they ask the learner to write, and the graders' insides.
ALLOWED = ("specref_grading.checks.prompt_lookup.check_proposals", "specref_grading.checks.prompt_lookup.check_draft",
           "specref_grading.checks.prompt_lookup.check_tau_interval",
           "specref_grading.checks.draft_positions.check_acceptance_counts")
# specref.perf.intervals holds notebook 05's intervals and their comparison, which is Task 3's answer.
FORBIDDEN = ("specref.drafts.prompt_lookup", "specref.perf.intervals", "specref_grading")


def _as_proposal(out: object, k: int) -> list[int] | None:
    """The learner's answer as k plain ints (`as_ints`: any sequence of k whole numbers), or None."""
    if isinstance(out, (torch.Tensor, np.ndarray)) and out.ndim != 1:
        return None
    return as_ints(out, k)


def _cases(n_cases: int, seed: int) -> list[tuple[list[int], int, int, int]]:
    """(context, k, max_ngram, min_ngram): the worked examples, then random streams over small vocabularies."""
    cases = [
        ([1, 2, 3, 1, 2], 3, 3, 1),  # "1 2" was followed by 3
        ([1, 2, 9, 2, 4, 1, 2], 1, 3, 1),  # the longest suffix wins
        ([5, 6, 5, 7, 5], 2, 3, 1),  # the latest occurrence wins
        ([1, 2, 1, 2, 1, 2], 5, 3, 1),  # the match overlaps the suffix; the copy runs on
        ([1, 2, 3], 2, 3, 1),  # no match: repeat the last token
        ([7], 3, 3, 1),  # one token
        ([4, 4, 1, 4], 2, 2, 2),  # min_ngram = 2: the single 4 does not count
    ]
    rng = random.Random(seed)
    while len(cases) < n_cases:
        vocab = rng.choice([2, 3, 4, 6])
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
        max_ngram = rng.randint(1, 4)
        cases.append((context, rng.randint(0, 9), max_ngram, rng.randint(1, max_ngram)))
    return cases[:n_cases]


def _proposal_hint(context: list[int], k: int, max_ngram: int, min_ngram: int, got: list[int]) -> str:
    earliest = _variant(context, k, max_ngram, min_ngram, latest=False)
    shortest = _variant(context, k, max_ngram, min_ngram, longest_first=False)
    if got == earliest:
        return "that copies after the EARLIEST occurrence; use the latest one (the start closest to the end)."
    if got == shortest:
        return "that tries the shortest n-gram first; try n = max_ngram first, down to min_ngram."
    if got == _variant(context, k, max_ngram, min_ngram, wrap=False):
        return ("your copy stops where the context ends. Read context + proposal as one text: the copy goes on through "
                "the tokens it has just proposed.")
    return ("compare your proposal with the contract: which match wins, where the copy starts, and what it copies "
            "once it reaches the end of the context (context + proposal is one text: the copy does not stop there).")


def _variant(context: list[int], k: int, max_ngram: int, min_ngram: int, latest: bool = True,
             longest_first: bool = True, wrap: bool = True) -> list[int]:
    """The usual mistakes, for hints: the earliest occurrence, the shortest n-gram first, or a copy that stops
    where the context ends (and pads with the last token)."""
    L = len(context)
    s = L - 1
    ns = range(min(max_ngram, L - 1), min_ngram - 1, -1)
    for n in (ns if longest_first else reversed(ns)):
        starts = range(L - n - 1, -1, -1) if latest else range(0, L - n)
        i = next((i for i in starts if context[i : i + n] == context[L - n :]), None)
        if i is not None:
            s = i + n
            break
    if not wrap:
        return context[s : s + k] + [context[-1]] * max(0, k - (L - s))
    return [context[s + j % (L - s)] for j in range(k)]


@graded(1, "check_proposals", FORBIDDEN, ALLOWED)
def check_proposals(fn: Proposal, n_cases: int = 150, seed: int = 0) -> None:
    """Grade lookup_proposal(context, k, max_ngram, min_ngram) against the reference on random token streams."""
    g = "check_proposals"
    for n, (context, k, max_ngram, min_ngram) in enumerate(_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."
        inputs = [f"context = {context}", f"k = {k}, max_ngram = {max_ngram}, min_ngram = {min_ngram}"]
        arg = list(context)
        out = call_learner(g, where, inputs, fn, arg, k, max_ngram, min_ngram)
        if arg != context:
            raise failure(g, where, inputs, "your function changed `context` in place; build a new list instead.")
        got = _as_proposal(out, k)
        if got is None:
            raise failure(g, where, inputs + [f"got {out!r}"], f"return a list of {k} token ids (ints).")
        want = lookup(context, k, max_ngram, min_ngram)
        if got != want:
            raise failure(g, where, inputs + [f"expected {want}", f"got      {got}"],
                        _proposal_hint(context, k, max_ngram, min_ngram, got))
    passed(g, f"{n_cases} token streams, proposals equal the reference")


# --------------------------------------------------------------------------------------
# Task 2: the learner's draft, driven directly and then through the speculative loop
# --------------------------------------------------------------------------------------


class _Adapter(Draft):
    """The loop's `Draft` around the learner's object: the loop's interface without asking what the object is.

    The learner's draft is deterministic: it is handed the buffer, the lengths and k, never the sampling
    parameters or a generator (it needs neither). Only tensors and ints cross; the object is only called.
    """

    def __init__(self, learner: object, vocab_size: int):
        self.learner, self.vocab_size = learner, vocab_size

    def begin(self, batch_size: int) -> None:
        self.learner.begin(batch_size)

    def propose(self, tokens: torch.Tensor, lengths: torch.Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.learner.propose(tokens.clone(), lengths.clone(), k)
        drafts, q = _as_draft_output(out, tokens.shape[0], k, self.vocab_size)
        return drafts, q

    def rollback(self, n_valid: torch.Tensor) -> None:
        self.learner.rollback(n_valid.clone())


class _BadDraft(Exception):
    pass


class _BadProposal(Exception):
    def __init__(self, context: list[int], k: int, out: object):
        super().__init__(f"for a context ending {context[-6:]} and k = {k}, your function returned {out!r}")


def _as_draft_output(out: object, B: int, k: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [B, k] long, q [B, k, V] float64) from the learner's answer, or _BadDraft saying what is wrong."""
    pair = as_items(out, 2)
    if pair is None:
        raise _BadDraft(f"propose returned {type(out).__name__}; return a pair (drafts, q)")
    drafts, q = pair
    ids = [as_ints(row, k) for row in as_items(drafts, B) or [None]]
    if len(ids) != B or any(row is None for row in ids):
        raise _BadDraft(f"drafts must be whole-number token ids of shape [B, k] = [{B}, {k}], got "
                        f"{getattr(drafts, 'dtype', type(drafts).__name__)} {tuple(getattr(drafts, 'shape', ()))}")
    drafts = torch.tensor(ids, dtype=torch.long).reshape(B, k)
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float64 or tuple(q.shape) != (B, k, V):
        raise _BadDraft(f"q must be a float64 tensor of shape [B, k, V] = [{B}, {k}, {V}], got "
                        f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    if bool(((drafts < 0) | (drafts >= V)).any()):
        raise _BadDraft(f"drafts hold ids outside the vocabulary [0, {V})")
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()) or (k and float((q.sum(-1) - 1).abs().max()) > 1e-9):
        raise _BadDraft("each q[b, i] must be a probability distribution over the V tokens (>= 0, summing to 1)")
    return drafts.long(), q


def _buffer(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A token buffer [B, width] (zeros past each row's tokens) and its lengths [B]."""
    tokens = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, : len(r)] = torch.tensor(r)
    return tokens, torch.tensor([len(r) for r in rows])


def _drive(g: str, draft_cls: object, seed: int, V: int = 16) -> None:
    """begin / propose / rollback / propose on buffers of the grader's: proposals follow the kept tokens only."""
    rnd = random.Random(seed)
    draft = call_learner(g, "LookupDraft(vocab_size, max_ngram, min_ngram) failed.", [f"LookupDraft({V}, 3, 1)"],
                  draft_cls, V, 3, 1)
    for trial in range(3):
        B, k, width = rnd.randint(1, 3), rnd.randint(1, 5), 40
        rows = [[rnd.randrange(4) for _ in range(rnd.randint(2, 14))] for _ in range(B)]
        call_learner(g, "begin(batch_size) failed.", [f"begin({B})"], draft.begin, B)
        for step in range(3):
            tokens, lengths = _buffer(rows, width)
            t_in, l_in = tokens.clone(), lengths.clone()
            inputs = [f"rows (the valid tokens of the buffer): {rows}", f"k = {k}"]
            where = f"wrong proposal (generation {trial + 1}, step {step + 1})."
            out = call_learner(g, where, inputs, draft.propose, t_in, l_in, k)
            if not (torch.equal(t_in, tokens) and torch.equal(l_in, lengths)):
                raise failure(g, where, inputs, "propose changed the buffer or the lengths in place; read them only.")
            try:
                drafts, _ = _as_draft_output(out, B, k, V)
            except _BadDraft as e:
                raise failure(g, where, inputs, str(e)) from None
            want = [lookup(r, k, 3, 1) for r in rows]
            if drafts.tolist() != want:
                raise failure(g, where, inputs + [f"expected {want}", f"got      {drafts.tolist()}"],
                            "each row's drafts are lookup_proposal(that row's valid tokens, k, max_ngram, min_ngram); "
                            "after rollback(n_valid), only the first n_valid[b] tokens of row b are still valid.")
            # The verifier keeps a prefix of each row and adds its own tokens: roll back, then write new ones.
            n_valid = [rnd.randint(1, len(r)) for r in rows]
            call_learner(g, "rollback(n_valid) failed.", inputs + [f"n_valid = {n_valid}"], draft.rollback,
                  torch.tensor(n_valid))
            rows = [r[:n] + [rnd.randrange(4) for _ in range(rnd.randint(1, 6))] for r, n in zip(rows, n_valid)]


def tiny_target(seed: int, vocab_size: int = 8) -> GPT2:
    """A small random GPT-2 (float64, one block), built from `seed` without touching the global generator."""
    with torch.random.fork_rng(devices=[]):
        model = GPT2(GPT2Config(vocab_size=vocab_size, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # sharp, varied next-token distributions
            p.copy_(0.6 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.to(torch.float64).eval()


@torch.no_grad()
def exact_first_two(target: GPT2, prompt: list[int]) -> torch.Tensor:  # [V, V]
    """P(x1, x2) at temperature 1: p(x1 | prompt) p(x2 | prompt, x1), from the target alone."""
    V = target.config.vocab_size
    probs = torch.softmax(target(torch.tensor([prompt + [x1] for x1 in range(V)])).double(), -1)  # [V, T+1, V]
    return probs[0, -2, :, None] * probs[:, -1, :]


SAMPLING_ALPHA = 2.5e-4  # the distribution test's level (chi-square and TV each): see the module docstring
FALSE_FAIL_RATE = 2 * SAMPLING_ALPHA  # check_draft on a correct draft, at a random seed
RUNS = 16000  # check_draft's generations: power against a mildly smoothed q at SAMPLING_ALPHA (module docstring)


def first_two_test(draft: Draft, target: GPT2, prompt: list[int], runs: int, seed: int, k: int = 2):
    """distribution_test of the first two tokens of `runs` speculative generations at temperature 1."""
    ids = torch.tensor([prompt] * runs)
    out, _ = speculative_generate(target, draft, ids, k=k, max_new_tokens=2, temperature=1.0,
                                  generator=torch.Generator().manual_seed(seed))
    return distribution_test(exact_first_two(target, prompt), samples=out[:, len(prompt):], alpha=SAMPLING_ALPHA)


def _prompt(seed: int, V: int) -> list[int]:
    """A prompt whose last two tokens occurred before: prompt lookup proposes a copy."""
    rnd = random.Random(seed)
    head = [rnd.randrange(V) for _ in range(5)]
    return head + head[:2]


@graded(2, "check_draft", FORBIDDEN, ALLOWED)
def check_draft(draft_cls: object, seed: int = 0, runs: int = RUNS) -> None:
    """LookupDraft: proposals after rollbacks follow the rule, then the first two tokens at temperature 1 are p's."""
    g = "check_draft"
    _drive(g, draft_cls, seed)
    target = tiny_target(1000 + seed)
    V = target.config.vocab_size
    prompt = _prompt(seed, V)
    learner = call_learner(g, "LookupDraft(vocab_size, max_ngram, min_ngram) failed.", [f"LookupDraft({V}, 3, 1)"],
                    draft_cls, V, 3, 1)
    where = f"the first two tokens at temperature 1 are not the target's ({runs} generations of one prompt, k = 2)."
    try:
        test = first_two_test(_Adapter(learner, V), target, prompt, runs, seed)
    except _BadDraft as e:
        raise failure(g, where, [f"prompt = {prompt}", str(e)]) from None
    except NotImplementedError:
        raise
    except Exception as e:
        raise failure(g, where, [f"prompt = {prompt}", f"speculative decoding with your draft raised "
                               f"{type(e).__name__}: {e}"]) from e
    if not test.passed:
        raise failure(g, where, [f"prompt = {prompt}", f"distribution test: {test}"],
                    "the rule accepts x with probability min(1, p(x)/q(x)): q must be the distribution your "
                    "proposal really came from. How likely is it that prompt lookup proposes x?")
    passed(g, f"proposals follow the rule after rollbacks; first two tokens at temperature 1 match p "
               f"(TV {test.tv:.3f} <= {test.tv_bound:.3f}, N = {runs})")


# --------------------------------------------------------------------------------------
# Task 3: tau with its interval, and the decision the intervals allow
# --------------------------------------------------------------------------------------

INTERVAL_RTOL = 1e-6  # relative tolerance on tau and the interval's ends: see the module docstring
FALSE_FAIL_RATE_TAU = 0.0  # check_tau_interval draws no samples: a correct answer always passes


def _t_interval(steps: list[int], level: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided t-interval of the mean at `level`, sample standard deviation (ddof 1)."""
    x = np.asarray(steps, dtype=np.float64)
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return float(x.mean()), float(x.mean()) - half, float(x.mean()) + half


def _verdict(a: tuple[float, float, float], b: tuple[float, float, float]) -> int:
    return 1 if a[1] > b[2] else -1 if a[2] < b[1] else 0


def tau_cases(n_cases: int, seed: int) -> list[tuple[list[int], list[int], float]]:
    """(steps_a, steps_b, level): per-step token counts 1..k+1 of two drafts, none with a verdict on the edge."""
    rng = np.random.default_rng(seed)
    cases: list[tuple[list[int], list[int], float]] = [
        ([1, 2, 1, 3, 1, 1, 2, 1], [5, 4, 5, 5, 3, 5, 5, 4], 0.95),  # clearly apart: b above a
        ([2, 3, 1, 2, 2, 3], [2, 1, 3, 2, 3, 2], 0.95),  # the same counts, reordered: they overlap
        ([1, 2], [4, 5], 0.95),  # two steps each: the t quantile is large
    ]
    while len(cases) < n_cases:
        k = int(rng.integers(2, 9))
        level = float(rng.choice([0.8, 0.9, 0.95, 0.99]))
        runs = []
        for _ in range(2):  # one draft's steps: 1 + accepted drafts, each accepted with one rate
            alpha, n = rng.uniform(0.1, 0.9), int(rng.integers(2, 401))
            runs.append([int(x) for x in 1 + rng.binomial(k, alpha, size=n)])
        a, b = runs
        ia, ib = _t_interval(a, level), _t_interval(b, level)
        if len(set(a)) < 2 or len(set(b)) < 2:
            continue  # a constant sample has no spread to estimate
        if min(abs(ia[1] - ib[2]), abs(ia[2] - ib[1])) < 1e-3 * max(ia[0], ib[0]):
            continue  # on the edge: a rounding could flip the verdict
        cases.append((a, b, level))
    return cases[:n_cases]


def _as_triple(x: object) -> tuple[float, float, float] | None:
    """(tau, low, high) by value: any sequence of three finite numbers (`as_items`, `as_float`), else None."""
    items = as_items(x, 3)
    t = None if items is None else tuple(as_float(v) for v in items)
    return t if t is not None and all(v is not None and np.isfinite(v) for v in t) else None  # type: ignore[return-value]


@graded(3, "check_tau_interval", FORBIDDEN, ALLOWED)
def check_tau_interval(fn: Callable, n_cases: int = 60, seed: int = 0) -> None:
    """compare_tau(a, b, level): both (tau, low, high) triples and the verdict, on seeded per-step counts."""
    g = "check_tau_interval"
    for n, (a, b, level) in enumerate(tau_cases(n_cases, seed), 1):
        where = f"wrong answer on case {n} of {n_cases}."

        def show(xs: list) -> str:
            return str(xs) if len(xs) <= 12 else f"{xs[:12]}... ({len(xs)} steps)"

        inputs = [f"a = {show(a)}", f"b = {show(b)}", f"level = {level}"]
        arg_a, arg_b = list(a), list(b)
        out = call_learner(g, where, inputs, fn, arg_a, arg_b, level)
        if arg_a != a or arg_b != b:
            raise failure(g, where, inputs, "your function changed its input lists in place; read them only.")
        parts = as_items(out, 3)
        if parts is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "return ((tau, low, high), (tau, low, high), verdict).")
        got_a, got_b, verdict = _as_triple(parts[0]), _as_triple(parts[1]), parts[2]
        if got_a is None or got_b is None:
            raise failure(g, where, inputs + [f"got {out!r}"], "each of the first two items is (tau, low, high), "
                                                               "three finite numbers.")
        want_a, want_b = _t_interval(a, level), _t_interval(b, level)
        for label, got, want in (("a", got_a, want_a), ("b", got_b, want_b)):
            if not np.allclose(got, want, rtol=INTERVAL_RTOL, atol=0):
                hint = ("tau is the mean tokens per step." if not np.isclose(got[0], want[0], rtol=INTERVAL_RTOL) else
                        "the interval misses the contract: in the model of normal steps with unknown mean and "
                        "variance it must cover the mean with probability exactly `level`, on both sides. Check which "
                        "statistic has a known distribution there (with how many degrees of freedom), which quantile "
                        "a two-sided interval needs, and which estimate of the spread makes the coverage exact.")
                raise failure(g, where, inputs + [f"expected for {label}: {tuple(round(v, 6) for v in want)}",
                                                  f"got          {tuple(round(v, 6) for v in got)}"], hint)
        if as_int(verdict) != _verdict(want_a, want_b):
            raise failure(g, where, inputs + [(f"intervals: a {want_a[1]:.4f}..{want_a[2]:.4f}, "
                                               f"b {want_b[1]:.4f}..{want_b[2]:.4f}"),
                                              f"expected verdict {_verdict(want_a, want_b)}", f"got {verdict!r}"],
                          "the verdict is 1 when a's interval lies wholly above b's, -1 when wholly below, and 0 "
                          "when they overlap: a difference inside the intervals decides nothing.")
    passed(g, f"{n_cases} pairs of drafts: tau, intervals and verdicts equal the reference")
