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
* `check_evidence(evidence, REPORT)`: the six verdicts each together with its evidence (the input the sampler
  writes into, or its exact largest TV from the target over `reference_cases()`), and (hidden) the learner's
  evidence on samplers built from the seed.

False-fail rate: 0. Neither check draws a sample: the grader's truth and a correct answer's are both exact
enumerations, so a correct answer passes at every seed (the seed only composes the samplers;
tests/test_grade_false_fail.py runs the solution's answers over many seeds).

Samplers handed to the learner's code are fresh function objects under opaque names, in an order drawn anew; a
failure shows what the learner's code returned and which property failed, never which verdict is wrong.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specref.checks.rng import exact_distribution
from specref.checks.toy import MarkovChain, random_chain
from .report import as_float, call_learner, failure, passed
from .rules import graded

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


@dataclass(frozen=True)
class Spec:
    """How a sampler is built: every field at its first value is the exact rule at TEMPERATURE.

    k: drafts per step. temperature: what the sampler processes the target with. sampled / reported:
    the draft distributions the drafts come from and the one handed to the rule ("processed": the draft
    at the sampler's temperature, "raw": unprocessed, "argmax": one-hot on the processed argmax,
    "softmax": the processed draft where the drafts were argmax, "mix:w": w x processed + (1 - w) x uniform).
    verify: "exact", "count" (every test drawn first, then counted), "always", "typical:h" (keep a draft
    whose p exceeds h; argmax next token), "inverted" (accept with min(1, q/p)), "extra_draw" (an unused
    uniform first: lossless). final: "residual", "skip_residual" (p_a after a rejection), "q_residual"
    (max(0, q - p)). bonus: "next" (p_{k+1}), "same" (p_k again), "none" (no bonus: lossless).
    inplace: "" or the input ("target" or "draft") the sampler writes into.
    """

    k: int = 2
    temperature: float = TEMPERATURE
    sampled: str = "processed"
    reported: str = "processed"
    verify: str = "exact"
    final: str = "residual"
    bonus: str = "next"
    inplace: str = ""


def _draft_rows(draft: torch.Tensor, how: str, temperature: float) -> list[list[float]]:
    if how == "raw":
        return draft.double().tolist()
    rows = _processed(draft, temperature)
    if how == "argmax":
        return _one_hot_argmax(rows)
    if how.startswith("mix:"):
        w = float(how[4:])
        return [[w * x + (1 - w) / len(r) for x in r] for r in rows]
    return rows  # "processed", "softmax"


def _speculate(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object, spec: Spec) -> list:
    """n tokens of the target at TEMPERATURE (if the spec is right) by speculation with spec.k drafts per step."""
    T = spec.temperature
    if spec.inplace == "target":  # the temperature applied to the caller's tensor, in place
        target.copy_(torch.softmax(torch.log(target) / T, -1))
        P = target.tolist()
    else:
        P = _processed(target, T)
    sampled = _draft_rows(draft, spec.sampled, T)
    reported = _draft_rows(draft, spec.reported, T)
    if spec.inplace == "draft":  # the draft's rows normalised in place after use: the caller's tensor changes
        draft.copy_(torch.softmax(torch.log(draft) / T, -1))
    k = spec.k
    out: list[int] = []
    last = start
    while len(out) < n:
        if spec.verify == "extra_draw":
            rng.uniform()  # drawn and never used: changes nothing
        xs, ctx = [], last
        for _ in range(k):
            x = rng.categorical(sampled[ctx])
            xs.append(x)
            ctx = x
        ctxs = [last] + xs  # ctxs[i]: the context of position i
        emitted: list[int] = []
        if spec.verify == "count":  # every accept test drawn first, then counted, not stopped at the first failure
            kept = [rng.uniform() < min(1.0, P[ctxs[i]][x] / reported[ctxs[i]][x]) for i, x in enumerate(xs)]
            a = sum(kept)
            emitted = xs[:a]
            last_dist = P[ctxs[k]] if a == k else _residual(P[ctxs[a]], reported[ctxs[a]])
            emitted.append(rng.categorical(last_dist))
        else:
            a = 0
            for i, x in enumerate(xs):
                p_i, q_i = P[ctxs[i]], reported[ctxs[i]]
                if spec.verify.startswith("typical:"):
                    keep = p_i[x] > float(spec.verify[8:])
                elif spec.verify == "always":
                    keep = True
                elif spec.verify == "inverted":
                    keep = rng.uniform() < min(1.0, q_i[x] / p_i[x]) if p_i[x] > 0 else False
                else:
                    keep = rng.uniform() < min(1.0, p_i[x] / q_i[x])
                if not keep:
                    break
                emitted.append(x)
                a += 1
            typical = spec.verify.startswith("typical:")
            if a < k:  # rejected at position a
                p_a, q_a = P[ctxs[a]], reported[ctxs[a]]
                if typical:
                    emitted.append(max(range(len(p_a)), key=p_a.__getitem__))
                elif spec.final == "skip_residual":
                    emitted.append(rng.categorical(p_a))
                elif spec.final == "q_residual":
                    emitted.append(rng.categorical(_residual(q_a, p_a)))
                else:
                    emitted.append(rng.categorical(_residual(p_a, q_a)))
            elif typical:
                bonus = P[ctxs[k]]
                emitted.append(max(range(len(bonus)), key=bonus.__getitem__))
            elif spec.bonus == "same" and k > 0:
                emitted.append(rng.categorical(P[ctxs[k - 1]]))
            elif spec.bonus != "none" or k == 0:
                emitted.append(rng.categorical(P[ctxs[k]]))
        out += emitted
        last = out[-1] if emitted else last
    return out[:n]


def _make(spec: Spec) -> Sampler:
    def sampler(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        """n tokens of the target chain at TEMPERATURE, by speculation with the draft chain."""
        return _speculate(target, draft, start, n, rng, spec)

    return sampler


# Visible: what the learner classifies. The names say nothing; the constructions are the grader's.
_VISIBLE = {"A": Spec(), "B": Spec(sampled="argmax", reported="softmax"), "C": Spec(sampled="raw", reported="raw"),
            "D": Spec(verify="count"), "E": Spec(bonus="none"), "F": Spec(k=1, inplace="target")}
SAMPLERS: dict[str, Sampler] = {name: _make(spec) for name, spec in _VISIBLE.items()}

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

        def run(rng: object, target: torch.Tensor = target, draft: torch.Tensor = draft, start: int = start) -> tuple:
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
    changed, tv = _evidence_of(_make(spec), reference_cases(seed=seed))
    if changed is not None:
        return False, changed
    return tv <= TOL, tv


# --------------------------------------------------------------------------------------
# The learner's check and evidence, on fresh samplers under opaque names
# --------------------------------------------------------------------------------------


def _opaque(spec: Spec, rnd: random.Random) -> tuple[str, Sampler]:
    """A fresh function object with a random name: a check can only tell samplers apart by running them."""
    name = "sampler_" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
    inner = _make(spec)

    def wrapped(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        return inner(target, draft, start, n, rng)

    wrapped.__name__ = wrapped.__qualname__ = name
    return name, wrapped


def _specs(hidden: bool, seed: int | None) -> list[Spec]:
    if not hidden:
        return list(_VISIBLE.values())
    return hidden_specs(0 if seed is None else seed)


# What the tasks must not call: the graders' insides (the exercise's own setup names stay allowed).
ALLOWED = tuple(f"specref_grading.checks.pitfalls.{n}" for n in (
    "reference_cases", "check_lossless_check", "check_evidence", "SAMPLERS", "TEMPERATURE"))
FORBIDDEN = ("specref_grading",)

_CHECK_HINT = ("lossless means the first N tokens have exactly the processed target's joint on every case, and a "
               "sampler that writes into its inputs is not lossless. Compare exact distributions (a tolerance like "
               "1e-9) or use a distribution test whose threshold a correct sampler passes, with enough samples to "
               "resolve a TV of 0.08 over 9 cells; check the inputs after every call.")


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
        got = call_learner(g, f"your check raised on {name}.", [f"sampler: {name}"], fn, sampler)
        if not isinstance(got, bool):
            raise failure(g, f"your check returned {got!r} for {name}.", [], "return True (lossless) or False.")
        wrong += got != _truth(spec)[0]
    if wrong:
        raise failure(g, f"your check's verdicts are not all right on these {len(specs)} samplers"
                    + (" (built from the hidden seed)" if hidden else "") + ".", [], _CHECK_HINT)
    n_lossless = sum(_truth(spec)[0] for spec in specs)
    passed(g, f"{len(specs)} samplers, {n_lossless} lossless" + (", unseen ones included" if hidden else ""))


def _judge(g: str, verdict: object, found: object, shown: list[str]) -> None:
    """The properties of one (verdict, evidence) pair that need no answer key: types, and agreement with each other."""
    if not isinstance(verdict, bool):
        raise failure(g, "a verdict is not a bool.", shown, "True (lossless) or False.")
    if isinstance(found, str):
        if found not in ("target", "draft"):
            raise failure(g, "evidence that is a string must name an input.", shown, 'say "target" or "draft".')
        if verdict:
            raise failure(g, "a verdict contradicts its own evidence.", shown,
                        "a sampler that writes into its inputs is not lossless.")
        return
    tv = as_float(found)
    if tv is None or not math.isfinite(tv) or not -TOL <= tv <= 1 + TOL:
        raise failure(g, "evidence is neither an input's name nor a total variation in [0, 1].", shown,
                    'give "target", "draft" or the largest exact TV over reference_cases().')
    if verdict != (tv <= TOL):
        raise failure(g, "a verdict contradicts its own evidence.", shown,
                    f"a sampler is lossless exactly when its TV from the target is 0 (to {TOL:g}).")


def _matches(found: object, want: str | float) -> bool:
    if isinstance(want, str) or isinstance(found, str):
        return found == want
    return abs(as_float(found) - want) <= TOL


_EVIDENCE_HINT = ("for each sampler: the input it writes into, else the largest exact TV of its first N tokens from the "
                  "processed target's joint over reference_cases() (every outcome of the enumeration, and every cell "
                  "of the joint).")


@graded(2, "check_evidence", FORBIDDEN, ALLOWED)
def check_evidence(evidence: Callable[[Sampler], object], report: object, hidden: bool = False,
                   seed: int | None = None, order_seed: int | None = None, n_hidden: int = 4) -> None:
    """Grade Task 2: REPORT, the six verdicts each with its evidence; hidden, evidence(s) on samplers built from `seed`.

    report: {name: (verdict, evidence)} for every sampler in SAMPLERS, plain data. evidence(s): the input s writes
    into ("target" or "draft", on the first case where it does, the target first), else the largest exact TV over
    reference_cases() between its first N = 2 tokens and the processed target's joint. Both are compared with the
    grader's own enumeration, to 1e-9. A failure says which property of the learner's own answer failed, never
    which verdict or evidence the grader expects.
    """
    g = "check_evidence"
    if not hidden:
        if type(report) is not dict:  # a plain dict: a subclass could answer differently each time it is read
            raise failure(g, "REPORT is not a dict.", [f"got {type(report).__name__}"],
                        "give {name: (verdict, evidence)} for every sampler in SAMPLERS.")
        report = dict(report)
        if sorted(report) != sorted(_VISIBLE):
            raise failure(g, "REPORT does not have one entry per sampler.", [f"keys: {sorted(report)!r}"],
                        f"give an entry for each of {sorted(_VISIBLE)}, and nothing else.")
        right = True
        for name in sorted(_VISIBLE):
            entry = report[name]
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise failure(g, f"REPORT[{name!r}] is not a pair.", [f"got {entry!r}"], "(verdict, evidence).")
            _judge(g, entry[0], entry[1], [f"REPORT[{name!r}] = {entry!r}"])
            lossless, want = _truth(_VISIBLE[name])
            right &= entry[0] == lossless and _matches(entry[1], want)
        if not right:
            raise failure(g, "not every verdict and its evidence in REPORT match what the six samplers do.", [],
                        _EVIDENCE_HINT)
        passed(g, f"{len(_VISIBLE)} verdicts, each with its evidence")
        return
    rnd = random.Random(order_seed)
    specs = hidden_specs(0 if seed is None else seed)
    rnd.shuffle(specs)  # half of the n_hidden lossless and half not: a constant evidence is wrong on half of them
    lossless = [s for s in specs if _truth(s)[0]]
    specs = lossless[: n_hidden // 2] + [s for s in specs if s not in lossless][: n_hidden - n_hidden // 2]
    rnd.shuffle(specs)
    right = True
    for spec in specs:
        name, sampler = _opaque(spec, rnd)
        found = call_learner(g, f"your evidence raised on {name}.", [f"sampler: {name}"], evidence, sampler)
        lossless, want = _truth(spec)
        _judge(g, not isinstance(found, str) and (as_float(found) or 0.0) <= TOL, found,
               [f"sampler: {name}", f"evidence: {found!r}"])
        right &= _matches(found, want)
    if not right:
        raise failure(g, f"not all the evidence matches what these {len(specs)} samplers (built from the hidden seed) do.",
                    [], _EVIDENCE_HINT)
    passed(g, f"evidence on {len(specs)} samplers built from the hidden seed")
