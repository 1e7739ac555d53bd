"""Exercise 8's samplers: speculative samplers of a Markov chain, some lossless and some not.

Every sampler has one contract:

    sampler(target, draft, start, n, rng) -> a list of n token ids

target and draft are [V, V] float64 transition matrices of first-order chains (row y: the next-token
distribution after y); the sampler is meant to produce the first n tokens after `start` of the TARGET chain
processed at TEMPERATURE (softmax(log(target) / TEMPERATURE) row by row), using the draft to speculate, and
draws its randomness only through rng.uniform() and rng.categorical(probs). A sampler is built from a `Spec`:
how drafts are drawn and reported, how they are verified, the bonus, an input written in place. These are the
exercise's problem statement, given as code: whether each one is lossless is what the exercise asks, and the
grader decides it by exact enumeration on its own cases. `reference_cases` are the exercise's chains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .toy import random_chain

TEMPERATURE = 0.7

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


def make_sampler(spec: Spec) -> Sampler:
    def sampler(target: torch.Tensor, draft: torch.Tensor, start: int, n: int, rng: object) -> list:
        """n tokens of the target chain at TEMPERATURE, by speculation with the draft chain."""
        return _speculate(target, draft, start, n, rng, spec)

    return sampler


# Visible: what exercise 8 classifies. The names say nothing; whether each is lossless is for the learner to prove.
VISIBLE = {"A": Spec(), "B": Spec(sampled="argmax", reported="softmax"), "C": Spec(sampled="raw", reported="raw"),
            "D": Spec(verify="count"), "E": Spec(bonus="none"), "F": Spec(k=1, inplace="target")}
SAMPLERS: dict[str, Sampler] = {name: make_sampler(spec) for name, spec in VISIBLE.items()}


def reference_cases(n_cases: int = 3, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(target, draft, start) over 3 tokens: random chains of several sharpnesses, and one draft equal to its target.

    The draft is unrelated to the target, so every broken sampler of the exercise moves the output of two tokens
    by a TV of 0.03 or more on at least one case, for seeds 0 and 1 (the grader's tests); a distribution
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
