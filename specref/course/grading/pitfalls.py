"""Graders for exercise 8: which speculative samplers are lossless, and a check that proves it.

Every sampler has one contract (the exercise states it):

    sampler(target, draft, start, n, rng) -> a list of n token ids

target and draft are [V, V] float64 transition matrices of first-order chains (row y: the next-token
distribution after y); the sampler must produce the first n tokens after `start` of the TARGET chain
processed at TEMPERATURE (softmax(log(target) / TEMPERATURE) row by row), using the draft to speculate.
It draws randomness only through rng.uniform() and rng.categorical(probs).

A sampler is lossless iff, on every pair of chains, the distribution of its n tokens is the processed
target's joint. The grader decides that itself, by exact enumeration (`specref.checks.rng.exact_distribution`)
on its own cases, with the inputs checked unchanged after every call. It does not keep a table of answers:
whether a sampler is lossless is what it does.

* `check_classification(answer)`: the learner's {name: True (lossless) / False} for the visible `SAMPLERS`;
* `check_lossless_check(fn)`: the learner's is_lossless(sampler) -> bool must give the right verdict on every
  visible sampler, and (hidden tests) on samplers the learner has not seen. Either way the check runs on fresh
  samplers the grader builds, under opaque names, in an order the learner cannot know in advance.

Every `check_*` function raises AssertionError with the input, the expected and the received answer and a
hint, or returns None and prints one line on success.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable

import torch

from ...checks.rng import exact_distribution
from ...checks.toy import MarkovChain, random_chain
from .report import _call, _fail, _passed

TEMPERATURE = 0.7
TOL = 1e-9

Sampler = Callable[..., list]


# --------------------------------------------------------------------------------------
# The samplers: one generator of speculative steps, and the ways it can be built
# --------------------------------------------------------------------------------------


def _processed(rows: torch.Tensor, temperature: float) -> list[list[float]]:
    """softmax(log(rows) / T) per row, as Python lists (the samplers run on plain floats: fast to enumerate)."""
    out = []
    for r in rows.tolist():
        w = [x ** (1 / temperature) for x in r]
        total = sum(w)
        out.append([x / total for x in w])
    return out


def _one_hot_argmax(rows: list[list[float]]) -> list[list[float]]:
    out = []
    for r in rows:
        best = max(range(len(r)), key=r.__getitem__)
        out.append([1.0 if j == best else 0.0 for j in range(len(r))])
    return out


def _residual(p: list[float], q: list[float]) -> list[float]:
    diff = [max(0.0, a - b) for a, b in zip(p, q)]
    mass = sum(diff)
    return [d / mass for d in diff] if mass > 0 else list(p)


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def _speculate(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object, k: int, how: str) -> list:
    """n tokens of the target at TEMPERATURE by speculation with k drafts per step; `how` picks the variant."""
    if how == "inplace":  # the temperature applied to the caller's tensor, in place
        target.copy_(torch.softmax(torch.log(target) / TEMPERATURE, -1))
        P = target.tolist()
    else:
        P = _processed(target, TEMPERATURE)
    if how == "raw":  # sampled and reported raw: consistent
        sampled = reported = draft.double().tolist()
    elif how == "q_raw":  # sampled processed, reported raw
        sampled, reported = _processed(draft, TEMPERATURE), draft.double().tolist()
    elif how in ("argmax", "argmax_softmax"):
        reported = _processed(draft, TEMPERATURE)
        sampled = _one_hot_argmax(reported)
        if how == "argmax":
            reported = sampled
    else:
        sampled = reported = _processed(draft, TEMPERATURE)
    out: list[int] = []
    last = start
    while len(out) < n:
        xs, ctx = [], last
        for _ in range(k):
            x = rng.categorical(sampled[ctx])
            xs.append(x)
            ctx = x
        ctxs = [last] + xs  # ctxs[i]: the context of position i
        emitted: list[int] = []
        if how == "count":  # every accept test drawn first, then counted, not stopped at the first failure
            passed = [rng.uniform() < min(1.0, P[ctxs[i]][x] / reported[ctxs[i]][x]) for i, x in enumerate(xs)]
            a = sum(passed)
            emitted = xs[:a]
            last_dist = P[ctxs[k]] if a == k else _residual(P[ctxs[a]], reported[ctxs[a]])
            emitted.append(rng.categorical(last_dist))
        else:
            a = 0
            for i, x in enumerate(xs):
                p_i, q_i = P[ctxs[i]], reported[ctxs[i]]
                if how == "typical":
                    keep = p_i[x] > min(0.09, 0.3 * math.exp(-_entropy(p_i)))
                elif how == "always":
                    keep = True
                else:
                    keep = rng.uniform() < min(1.0, p_i[x] / q_i[x])
                if not keep:
                    break
                emitted.append(x)
                a += 1
            if a < k:  # rejected at position a
                p_a, q_a = P[ctxs[a]], reported[ctxs[a]]
                if how == "typical":
                    emitted.append(max(range(len(p_a)), key=p_a.__getitem__))
                elif how == "skip_residual":
                    emitted.append(rng.categorical(p_a))
                else:
                    emitted.append(rng.categorical(_residual(p_a, q_a)))
            elif how == "typical":
                bonus = P[ctxs[k]]
                emitted.append(max(range(len(bonus)), key=bonus.__getitem__))
            elif how == "bonus_off_by_one":
                emitted.append(rng.categorical(P[ctxs[k - 1]]))
            elif how != "no_bonus":
                emitted.append(rng.categorical(P[ctxs[k]]))
        out += emitted
        last = out[-1] if emitted else last
    return out[:n]


def _make(k: int, how: str) -> Sampler:
    def sampler(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        """n tokens of the target chain at TEMPERATURE, by speculation with the draft chain."""
        return _speculate(target, draft, start, n, rng, k, how)

    return sampler


# Visible: what the learner classifies. The names say nothing; the constructions below are the grader's.
_VISIBLE = {"A": (2, "exact"), "B": (2, "argmax_softmax"), "C": (2, "raw"), "D": (2, "count"),
            "E": (2, "no_bonus"), "F": (1, "inplace")}
# Hidden: samplers the learner's check has never run on.
_HIDDEN = [(1, "exact"), (0, "exact"), (2, "argmax"), (1, "no_bonus"), (2, "q_raw"), (1, "skip_residual"),
           (1, "bonus_off_by_one"), (1, "always"), (2, "typical"), (2, "inplace")]
SAMPLERS: dict[str, Sampler] = {name: _make(k, how) for name, (k, how) in _VISIBLE.items()}


# --------------------------------------------------------------------------------------
# The grader's own verdict: exact enumeration on its cases
# --------------------------------------------------------------------------------------


def reference_cases(n_cases: int = 3, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(target, draft, start) over 3 tokens: random chains of several sharpnesses, and one draft equal to its target.

    The draft is unrelated to the target, so every broken sampler of the exercise moves the output of two tokens
    by a TV of 0.03 or more on at least one case, for seeds 0 and 1 (tests/test_grading_ex08.py); a distribution
    test of 20 000 samples resolves about 0.02 over the 9 cells.
    """
    cases = []
    for i in range(n_cases):
        g = torch.Generator().manual_seed(1000 * seed + i)
        sharp_t, sharp_d = ((1.0, 1.0), (2.0, 2.0), (1.5, 3.0))[i % 3]
        t = random_chain(3, sharp_t, g)
        d = t if i == 2 else random_chain(3, sharp_d, g)  # one case with p == q: the residual is never needed
        cases.append((t.transition, d.transition, i % 3))
    return cases


def _verdict(sampler: Sampler, cases: list, n: int = 2) -> tuple[bool, str]:
    """(lossless?, why not) by exact enumeration of n tokens, each call on copies checked unchanged afterwards."""
    for target, draft, start in cases:
        want = MarkovChain(target).processed(TEMPERATURE).joint(start, n)

        def run(rng: object, target: torch.Tensor = target, draft: torch.Tensor = draft, start: int = start) -> tuple:
            t_in, d_in = target.clone(), draft.clone()
            out = sampler(t_in, d_in, start, n, rng)
            if not (torch.equal(t_in, target) and torch.equal(d_in, draft)):
                raise _InputsChanged
            return tuple(int(x) for x in out)

        try:
            got = exact_distribution(run)
        except _InputsChanged:
            return False, "it changes its inputs in place"
        for seq, prob in got.items():
            if len(seq) != n:
                return False, f"it returned {len(seq)} tokens instead of {n}"
        cells = set(got) | {tuple(int(v) for v in idx) for idx in torch.nonzero(want > 0).tolist()}
        worst = max(abs(got.get(c, 0.0) - float(want[c])) for c in cells)
        if worst > TOL:
            return False, f"P(tokens) is off by up to {worst:.3g}"
    return True, ""


class _InputsChanged(Exception):
    pass


@functools.lru_cache(maxsize=None)
def _truth(k: int, how: str, seed: int) -> tuple[bool, str]:
    """The grader's verdict on one construction, on the cases of `seed` (computed once per process)."""
    return _verdict(_make(k, how), reference_cases(seed=seed))


# --------------------------------------------------------------------------------------
# Task 1: the classification
# --------------------------------------------------------------------------------------


def check_classification(answer: object) -> None:
    """Grade {name: True if lossless else False} for every sampler in SAMPLERS."""
    g = "check_classification"
    if type(answer) is not dict:  # a plain dict: a subclass could answer differently each time it is read
        raise _fail(g, "the answer is not a dict.", [f"got {type(answer).__name__}"],
                    'give {"A": True or False, ...}: True means lossless.')
    answer = dict(answer)
    missing = sorted(set(SAMPLERS) - set(answer))
    if missing:
        raise _fail(g, "some samplers are not classified.", [f"missing: {missing}"], "classify every sampler in SAMPLERS.")
    wrong = []
    for name in SAMPLERS:
        said = answer[name]
        if not isinstance(said, bool):
            raise _fail(g, f"the verdict for {name} is not a bool.", [f"got {said!r}"], "True (lossless) or False.")
        if said != _truth(*_VISIBLE[name], 0)[0]:
            wrong.append(name)
    if wrong:
        raise _fail(g, f"{len(wrong)} of {len(SAMPLERS)} verdicts are wrong.", [f"first wrong verdict: {wrong[0]}"],
                    "run your check on it: compare its exact output distribution with the processed target's joint, "
                    "and look at its inputs after the call.")
    _passed(g, f"{len(SAMPLERS)} samplers classified")


# --------------------------------------------------------------------------------------
# Task 2: the learner's check, on the visible samplers and on unseen ones
# --------------------------------------------------------------------------------------


def _opaque(sampler: Sampler, rnd: random.Random) -> tuple[str, Sampler]:
    """A fresh function object with a random name: a check can only tell samplers apart by running them."""
    name = "sampler_" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))

    def wrapped(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        return sampler(target, draft, start, n, rng)

    wrapped.__name__ = wrapped.__qualname__ = name
    return name, wrapped


def check_lossless_check(fn: Callable[[Sampler], object], hidden: bool = False, seed: int | None = None) -> None:
    """Grade is_lossless(sampler) -> bool: the right verdict on every visible sampler (or on the hidden ones).

    The learner's check is called once per sampler, on a fresh function object built here (never an object
    of SAMPLERS, which the learner's notebook holds and could replace), in an order drawn from `seed`: None,
    the default of the exercise's tests, draws it from the OS, so no sequence of verdicts can be replayed.
    It sees only a function, never its name in SAMPLERS or how it was built.
    """
    g = "check_lossless_check"
    rnd = random.Random(seed)
    keys = list(_HIDDEN) if hidden else list(_VISIBLE.values())
    labels = [None] * len(keys) if hidden else [f"SAMPLERS[{name!r}]" for name in _VISIBLE]
    order = list(range(len(keys)))
    rnd.shuffle(order)
    n_lossless = 0
    for i in order:
        name, sampler = _opaque(_make(*keys[i]), rnd)
        label = labels[i] or name
        want, why = _truth(*keys[i], 0)  # a construction's verdict does not depend on the order: computed once
        n_lossless += want
        where = f"wrong verdict on {label}."
        got = _call(g, where, [f"sampler: {label}"], fn, sampler)
        if not isinstance(got, bool):
            raise _fail(g, where, [f"your check returned {got!r}"], "return True (lossless) or False.")
        if got != want:
            hint = (f"this sampler is not lossless ({why}); your check passed it." if not want else
                    "this sampler is lossless; your check flagged it. Compare distributions exactly (with a "
                    "tolerance like 1e-9) or with a test whose threshold a correct sampler passes.")
            raise _fail(g, where, [f"expected {want}, your check said {got}"], hint)
    _passed(g, f"{len(keys)} samplers, {n_lossless} lossless" + (", unseen ones included" if hidden else ""))
