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

Samplers are built from a `Spec` (how drafts are drawn and reported, how they are verified, the bonus, an
input written in place). The six visible ones (`SAMPLERS`, "A" to "F") are fixed; the hidden ones are
composed anew from the hidden seed (`hidden_specs`): random lossless variants, and broken ones with one
flaw of a random kind and random parameters, kept only when exactly lossless or clearly broken.

* `check_lossless_check(is_lossless)`: the right verdict on fresh copies of the six, or (hidden) on
  samplers built from the seed;
* `check_resolution(tv_threshold, samples_needed)`: a sampled check's threshold, valid for every target
  distribution at the level it is given and, on an outcome space of a thousand cells, below the union bound that
  the course's own distribution test uses (`specref.checks.montecarlo.tv_bound`: copying the package's rule is no
  answer), and the sample size at which it flags a given TV (see its docstring). It cannot tell a derived threshold
  from a shaved copy of the union bound; the derivation is graded by hand.

False-fail rates: `check_lossless_check` 0 (it draws no sample: the grader's truth and a correct answer's are
both exact enumerations, so a correct answer passes at every seed; the seed only composes the samplers).
`check_resolution` simulates multinomial counts from a seeded generator and fails an answer only where a count
exceeds its binomial quantile at 1 - 1e-6: a correct answer fails with probability below 1e-6 per
configuration, below 1e-4 over all of them (tests/grading/test_false_fail.py runs the solution over many seeds).

Samplers handed to the learner's code are fresh function objects under opaque names, in an order drawn anew; a
failure shows what the learner's code returned and which property failed, never which verdict is wrong.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable

import numpy as np
import torch

from specref.checks.montecarlo import tv_bound
from specref.checks.rng import exact_distribution
from specref.checks.samplers import SAMPLERS, TEMPERATURE, VISIBLE, Sampler, Spec, make_sampler, reference_cases  # noqa: F401
from specref.checks.toy import MarkovChain

from .report import as_bool, as_float, call_learner, failure, passed
from .rules import graded

TOL = 1e-9
_make, _VISIBLE = make_sampler, VISIBLE  # the names this module and its tests used before the move


# The ways a hidden sampler is built: lossless variants, and flaws (one per broken sampler).
_LOSSLESS_DRAFTS = [("processed", "processed"), ("raw", "raw"), ("argmax", "argmax"), ("mix", "mix")]
_FLAWS = ["temperature", "q_mismatch", "count", "always", "typical", "inverted", "skip_residual", "q_residual",
          "bonus_same", "inplace"]


def _random_spec(rnd: random.Random) -> Spec:
    """A sampler composed anew: lossless options at random, and with probability 1/2 one flaw of a random kind."""
    k = rnd.choice([1, 1, 2, 2, 0]) if rnd.random() < 0.9 else 2
    sampled, reported = rnd.choice(_LOSSLESS_DRAFTS)
    if sampled == "mix":
        sampled = reported = f"mix:{rnd.uniform(0.2, 0.9):.3f}"
    fields = dict(k=k, sampled=sampled, reported=reported, verify=rnd.choice(["exact", "exact", "extra_draw"]),
                  bonus=rnd.choice(["next", "next", "none"]))
    if rnd.random() < 0.5:
        flaw = rnd.choice(_FLAWS)
        fields["k"] = max(k, 1)  # a flaw of the verification needs drafts to show
        if flaw == "temperature":
            fields["temperature"] = round(TEMPERATURE + rnd.choice([-1, 1]) * rnd.uniform(0.2, 0.5), 3)
        elif flaw == "q_mismatch":
            fields["sampled"], fields["reported"] = rnd.choice(
                [("processed", "raw"), ("raw", "processed"), ("argmax", "softmax"),
                 (f"mix:{rnd.uniform(0.1, 0.4):.3f}", f"mix:{rnd.uniform(0.7, 1.0):.3f}")])
        elif flaw in ("count", "always", "inverted"):
            fields["verify"] = flaw
        elif flaw == "typical":
            fields["verify"] = f"typical:{rnd.uniform(0.05, 0.3):.3f}"
        elif flaw in ("skip_residual", "q_residual"):
            fields["final"] = flaw
        elif flaw == "bonus_same":
            fields["bonus"], fields["k"] = "same", 1  # k < N: the wrong bonus is among the tokens checked
        else:
            fields["inplace"] = rnd.choice(["target", "draft"])
    return Spec(**fields)


MIN_TV = 0.08  # a broken hidden sampler moves the output by at least this much on some reference case


def hidden_specs(seed: int, count: int = 8) -> list[Spec]:
    """`count` samplers composed from `seed`, about half lossless: each one exactly lossless, visibly broken
    (an exact TV of MIN_TV or more on some reference case, which a distribution test of a few thousand
    samples resolves), or writing into its inputs. Candidates in between are drawn again."""
    rnd = random.Random(f"ex08-hidden-{seed}")
    specs: list[Spec] = []
    lossless = 0
    while len(specs) < count:
        spec = _random_spec(rnd)
        if spec in specs:
            continue
        is_lossless, found = _truth(spec)
        if not is_lossless and not isinstance(found, str) and found < MIN_TV:
            continue  # broken, but too subtly for a sampled check at a size a notebook affords
        room = count - count // 2 - lossless if is_lossless else count // 2 - (len(specs) - lossless)
        if room <= 0:  # half of each kind: a constant verdict is wrong on half of them
            continue
        specs.append(spec)
        lossless += is_lossless
    return specs


# --------------------------------------------------------------------------------------
# The grader's own verdict: exact enumeration on its cases
# --------------------------------------------------------------------------------------


def _evidence_of(sampler: Sampler, cases: list, n: int = 2) -> tuple[str | None, float]:
    """(the input the sampler writes into, "target" or "draft", else None; its largest exact TV over the cases).

    Exact enumeration of the first n tokens on each case, each call on copies compared with the originals
    afterwards. The first case on which some call changes an input decides: "target" if the target changed
    on some path, else "draft" (the TV is then not computed: NaN). Outcomes of the wrong length count as mass
    outside the target's cells.
    """
    worst = 0.0
    for target, draft, start in cases:
        want = MarkovChain(target).processed(TEMPERATURE).joint(start, n)
        changed: set[str] = set()

        def run(rng: object, target: torch.Tensor = target, draft: torch.Tensor = draft, start: int = start,
                changed: set[str] = changed) -> tuple:
            t_in, d_in = target.clone(), draft.clone()
            out = tuple(int(x) for x in sampler(t_in, d_in, start, n, rng))
            changed.update(name for name, a, b in (("target", t_in, target), ("draft", d_in, draft))
                           if not torch.equal(a, b))
            return out

        got = exact_distribution(run)
        if changed:
            return ("target" if "target" in changed else "draft"), math.nan
        cells = set(got) | {tuple(int(v) for v in idx) for idx in torch.nonzero(want > 0).tolist()}
        tv = 0.5 * sum(abs(got.get(c, 0.0) - (float(want[c]) if len(c) == n else 0.0)) for c in cells)
        worst = max(worst, tv)
    return None, worst


@functools.lru_cache(maxsize=256)
def _truth(spec: Spec, seed: int = 0) -> tuple[bool, str | float]:
    """The grader's (lossless?, evidence) for one construction on the cases of `seed` (once per process)."""
    changed, tv = _evidence_of(make_sampler(spec), reference_cases(seed=seed))
    if changed is not None:
        return False, changed
    return tv <= TOL, tv


# --------------------------------------------------------------------------------------
# The learner's check, on fresh samplers under opaque names
# --------------------------------------------------------------------------------------


def _opaque(spec: Spec, rnd: random.Random) -> tuple[str, Sampler]:
    """A fresh function object with a random name: a check can only tell samplers apart by running them."""
    name = "sampler_" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
    inner = make_sampler(spec)

    def wrapped(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        return inner(target, draft, start, n, rng)

    wrapped.__name__ = wrapped.__qualname__ = name
    return name, wrapped


def _specs(hidden: bool, seed: int | None) -> list[Spec]:
    if not hidden:
        return list(VISIBLE.values())
    return hidden_specs(0 if seed is None else seed)


# What the tasks must not call: the graders' insides (the exercise's own setup names stay allowed).
# The given names live in specref.checks.samplers; this module re-exports them, so both spellings are allowed.
ALLOWED = ("specref_grading.checks.pitfalls.reference_cases", "specref_grading.checks.pitfalls.check_lossless_check",
           "specref_grading.checks.pitfalls.check_resolution", "specref_grading.checks.pitfalls.SAMPLERS",
           "specref_grading.checks.pitfalls.TEMPERATURE", "specref.checks.samplers.reference_cases",
           "specref.checks.samplers.SAMPLERS", "specref.checks.samplers.TEMPERATURE")
# specref.checks.montecarlo: its distribution_test computes a TV threshold from the sample size (the union bound
# Task 2 asks the learner to improve on), and simulates samplers in bulk.
FORBIDDEN = ("specref_grading", "specref.checks.montecarlo")

# The hint invites nothing the grading wall cannot carry: exact enumeration makes a few hundred calls per sampler,
# a sampled test at Task 2's sample size hundreds of thousands (every run and every draw crosses the wall).
_CHECK_HINT = ("lossless means the first N tokens have exactly the processed target's joint on every case, and a "
               "sampler that writes into its inputs is not lossless. Compare exact distributions (exact_distribution "
               "follows every draw; a tolerance like 1e-9) on every reference case, and check the inputs after "
               "every call.")


@graded(1, "check_lossless_check", FORBIDDEN, ALLOWED)
def check_lossless_check(fn: Callable[[Sampler], object], hidden: bool = False, seed: int | None = None,
                         order_seed: int | None = None) -> None:
    """Grade is_lossless(sampler) -> bool on fresh copies of the six (hidden=False) or on samplers built from `seed`.

    Each sampler is a fresh function object under a random name, in an order drawn from `order_seed` (None: from
    the OS, so no sequence of verdicts can be replayed). A failure never says which verdict is wrong: it shows
    what the check returned and which property of a check failed.
    """
    g = "check_lossless_check"
    rnd = random.Random(order_seed)
    specs = _specs(hidden, seed)
    rnd.shuffle(specs)
    wrong = 0
    for spec in specs:
        name, sampler = _opaque(spec, rnd)
        out = call_learner(g, f"your check raised on {name}.", [f"sampler: {name}"], fn, sampler)
        got = as_bool(out)  # numpy's bool and a one-element bool tensor are verdicts too
        if got is None:
            raise failure(g, f"your check returned {out!r} for {name}.", [], "return True (lossless) or False.")
        wrong += got != _truth(spec)[0]
    if wrong:
        raise failure(g, f"your check's verdicts are not all right on these {len(specs)} samplers"
                    + (" (built from the hidden seed)" if hidden else "") + ".", [], _CHECK_HINT)
    n_lossless = sum(_truth(spec)[0] for spec in specs)
    passed(g, f"{len(specs)} samplers, {n_lossless} lossless" + (", unseen ones included" if hidden else ""))


# --------------------------------------------------------------------------------------
# Task 2: a sampled check's resolution, from the sample size
# --------------------------------------------------------------------------------------

_FALSE_FAIL = 1e-6  # per configuration: a count is held against its binomial quantile at 1 - _FALSE_FAIL
_LOOSE = 2.5  # a threshold above 2.5 x the uniform target's simulated (1 - level) quantile has too little power
_LARGE = (1000, 20_000)  # (n_cells, n): an outcome space where the union bound is loose; the threshold must beat it


def _targets(m: int, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """Target distributions over m cells: uniform (the largest empirical TV), a random one, one heavy cell."""
    heavy = np.full(m, 0.3 / (m - 1))
    heavy[0] = 0.7
    return [("uniform", np.full(m, 1.0 / m)), ("random", rng.dirichlet(np.full(m, 0.5))), ("one heavy cell", heavy)]


def _empirical_tv(rng: np.random.Generator, sample_from: np.ndarray, target: np.ndarray, n: int,
                  repeats: int) -> np.ndarray:
    """[repeats]: the TV between the empirical distribution of n samples from `sample_from` and `target`."""
    counts = rng.multinomial(n, sample_from, size=repeats)  # [repeats, m]
    return 0.5 * np.abs(counts / n - target).sum(1)


def _shifted(target: np.ndarray, tv: float, spread: bool) -> np.ndarray:
    """A distribution exactly `tv` from target: mass tv moved from the largest cell to the smallest (spread: from
    the larger half of the cells to the smaller half, in proportion)."""
    order = np.argsort(-target)
    out = target.copy()
    if not spread:
        left = tv
        for i in order[:-1]:  # from the largest cells down, each keeping at least half its mass
            take = min(left, out[i] / 2)
            out[i] -= take
            left -= take
        out[order[-1]] += tv
    else:
        top, bottom = order[: len(order) // 2], order[len(order) // 2:]
        out[top] -= tv * target[top] / target[top].sum()
        out[bottom] += tv / len(bottom)
    assert out.min() >= 0 and abs(0.5 * np.abs(out - target).sum() - tv) < 1e-12
    return out


def _grader_samples(tv: float, m: int, level: float) -> int:
    """The grader's own sample size: bounded differences put the empirical TV of a correct sampler above
    0.5 sqrt((m - 1) / n) + sqrt(ln(1 / level) / (2 n)) with probability at most level; a sampler tv away stays above
    tv minus that, so n with twice the threshold at most tv flags it with probability at least 1 - level."""
    a = 0.5 * math.sqrt(m - 1) + math.sqrt(math.log(1 / level) / 2)
    return math.ceil((2 * a / tv) ** 2)


def _learner_float(g: str, where: str, inputs: list[str], fn: Callable[..., object], *args: object) -> float:
    got = call_learner(g, where, inputs, fn, *args)
    value = as_float(got)
    if value is None or not math.isfinite(value) or value <= 0:
        raise failure(g, where, inputs + [f"got {got!r}"], "return a positive, finite number.")
    return value


@graded(2, "check_resolution", FORBIDDEN, ALLOWED, learner_args=2)
def check_resolution(tv_threshold: Callable[..., object], samples_needed: Callable[..., object],
                     seed: int = 0, repeats: int = 4000) -> None:
    """Grade tv_threshold(n_cells, n, level) -> t and samples_needed(tv, n_cells, level) -> n by simulation.

    Valid: for every configuration below and each of three targets, the empirical TV of n samples from the target
    exceeds t in a fraction of `repeats` simulations that a true rate of `level` explains (binomial quantile at
    1 - 1e-6). Useful: t at most 2.5 times the uniform target's simulated (1 - level) quantile. Tighter than the
    union bound: at n_cells = 1000, n = 20000, t below `tv_bound` (the course test's threshold). Powerful:
    at samples_needed(tv, ...) samples, a sampler exactly tv away (two kinds of shift) exceeds t(n) in all but a
    fraction that `level` explains; and that n is at most three times the grader's own bound's.

    What no number can show is the derivation: a constant times the union bound (0.99, 0.9, down to about 0.68 of
    it) passes every test above, while sound derivations land near 0.85 to 0.93 of it, so a shaved copy of the
    printed bound cannot be told from a derived threshold. This check grades validity, tightness and power; the
    derivation is a hand-graded answer of its own (ex08's `ex08_resolution_derivation`, with its rubric), which
    carries the task's points: this check is a gate worth none (a threshold that fails it earns 0 for the task), and
    its failures name no bound a learner could scale (neither the union bound's value nor its formula, nor the
    grader's own sample size).
    """
    from scipy.stats import binom

    g = "check_resolution"
    rng = np.random.default_rng([int(seed) % 2**63, 8])
    allowed_misses = lambda level: int(binom.ppf(1 - _FALSE_FAIL, repeats, level))  # noqa: E731
    for m in (2, 9, 27):
        for n in (50, 1000):
            for level in (0.05, 0.01):
                inputs = [f"n_cells = {m}", f"n = {n}", f"level = {level}"]
                where = f"tv_threshold({m}, {n}, {level})"
                t = _learner_float(g, f"{where} failed.", inputs, tv_threshold, m, n, level)
                for name, target in _targets(m, rng):
                    over = int((_empirical_tv(rng, target, target, n, repeats) > t).sum())
                    if over > allowed_misses(level):
                        raise failure(g, f"{where} = {t:.4f} is not valid: a correct sampler exceeds it too often.",
                                      inputs + [f"target: {name} over {m} cells",
                                                f"{over} of {repeats} simulated tests of a correct sampler exceed it "
                                                f"(a rate of {level} allows at most {allowed_misses(level)})"],
                                      "the threshold must hold for every target distribution, small n included.")
                q = float(np.quantile(_empirical_tv(rng, np.full(m, 1 / m), np.full(m, 1 / m), n, 20000), 1 - level))
                if t > _LOOSE * q:
                    raise failure(g, f"{where} = {t:.4f} is too loose to resolve anything.", inputs + [
                        f"a correct sampler's empirical TV stays below {q:.4f} in {1 - level:.0%} of simulations"],
                        f"a useful threshold is at most {_LOOSE} times that: bound the TV as a whole, not each "
                        "cell on its own.")
    m, n = _LARGE
    large = {name: _empirical_tv(rng, target, target, n, repeats) for name, target in _targets(m, rng)}
    for level in (0.05, 0.01):
        inputs = [f"n_cells = {m}", f"n = {n}", f"level = {level}"]
        where = f"tv_threshold({m}, {n}, {level})"
        t = _learner_float(g, f"{where} failed.", inputs, tv_threshold, m, n, level)
        union = tv_bound(m, n, level)
        if t >= union:  # the message names neither the bound's value nor its formula: no fraction of it to take
            raise failure(g, f"{where} = {t:.4f} is not below the union bound of the course's own test.", inputs,
                          "derive your own along the task's hints: a union over all 2^n_cells events pays for every "
                          "one of them, and with many cells that costs more than the noise of the TV itself.")
        for name, tvs in large.items():
            over = int((tvs > t).sum())
            if over > allowed_misses(level):
                raise failure(g, f"{where} = {t:.4f} is not valid: a correct sampler exceeds it too often.",
                              inputs + [f"target: {name} over {m} cells",
                                        f"{over} of {repeats} simulated tests of a correct sampler exceed it "
                                        f"(a rate of {level} allows at most {allowed_misses(level)})"],
                              "the threshold must hold for every target distribution, large n_cells included.")
        q = float(np.quantile(large["uniform"], 1 - level))
        if t > _LOOSE * q:
            raise failure(g, f"{where} = {t:.4f} is too loose to resolve anything.", inputs + [
                f"a correct sampler's empirical TV stays below {q:.4f} in {1 - level:.0%} of simulations"],
                f"a useful threshold is at most {_LOOSE} times that.")
    for tv, m, level in ((0.08, 9, 0.01), (0.2, 4, 0.05), (0.05, 27, 0.01)):
        inputs = [f"tv = {tv}", f"n_cells = {m}", f"level = {level}"]
        where = f"samples_needed({tv}, {m}, {level})"
        got = call_learner(g, f"{where} failed.", inputs, samples_needed, tv, m, level)
        n = as_float(got)
        if n is None or not math.isfinite(n) or n != int(n) or n < 1:
            raise failure(g, f"{where} is not a positive whole number.", inputs + [f"got {got!r}"], "return an int.")
        n = int(n)
        ceiling = 3 * _grader_samples(tv, m, level)
        if n > ceiling:
            raise failure(g, f"{where} = {n} asks for too many samples.", inputs,
                          "a sound derivation needs far fewer: use your threshold's own size at n.")
        t = _learner_float(g, f"tv_threshold({m}, {n}, {level}) failed.", inputs, tv_threshold, m, n, level)
        target = rng.dirichlet(np.ones(m))
        target = 0.5 * target + 0.5 / m  # every cell at least 1 / (2m): room for the shifts
        for spread in (False, True):
            broken = _shifted(target, tv, spread)
            missed = int((_empirical_tv(rng, broken, target, n, repeats) <= t).sum())
            if missed > allowed_misses(level):
                raise failure(g, f"at {where} = {n} samples your test misses a sampler {tv} away too often.",
                              inputs + [f"tv_threshold({m}, {n}, {level}) = {t:.4f}",
                                        f"{missed} of {repeats} simulated tests pass a sampler exactly {tv} away "
                                        f"(a rate of {level} allows at most {allowed_misses(level)})"],
                              "a sampler tv away can look closer by as much as a correct sampler's own noise.")
    passed(g, "thresholds valid on 3 targets x 14 configurations, not loose, below the union bound on 1000 cells, "
              "and sample sizes with power")
