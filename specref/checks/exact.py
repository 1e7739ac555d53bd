"""Exact output distributions of speculative decoding, by enumerating every outcome (float64).

The enumeration runs the code, not a re-derivation of it. A rule such as
`verify_chain` is a deterministic function of the drafts, q, p and its k + 1
uniforms u. Given the drafts, u-space [0, 1)^(k+1) splits into boxes on which the
rule's outcome is constant: along u_i (i < k) the accept cell [0, t_i) and the
reject cell [t_i, 1), t_i = min(1, p_i(x_i) / q_i(x_i)); along the last uniform
the cells between the CDF breakpoints of the distributions a final token may come
from (p, q and the residual at the first rejected position a, and the bonus
p_{k+1}). We call the rule with explicit u at three points of every box (near
its lower corner, its centre, near its upper corner), insist that all three give
the same tokens, and weight the outcome by P(drafts) times the box's volume. A
rule that thresholds differently, or samples from a distribution other than
those, changes its outcome inside a box and is reported; a rule that is
piecewise constant on the boxes (the correct one, or the broken ones in
`specref.checks.montecarlo`) gets its exact output distribution, right or wrong.
Boxes too thin to place three distinguishable points in (width below 1e-11 of
their position, from nearly equal breakpoints) skip the three-point check; their
total volume is of the order of float64 rounding.
"""

from __future__ import annotations

import itertools

import torch

from .._validate import check_int, check_probs
from ..chain_verify import verify_chain
from ..rejection import ChainRule, residual
from .toy import MarkovChain, MisreportedDraft, check_cells

# Evaluations per rule call: bounds memory (each row holds [2k+1, V] float64).
_CHUNK = 60_000


def _cartesian(V: int, k: int) -> torch.Tensor:  # [V**k, k] every sequence of k tokens
    if k == 0:
        return torch.zeros((1, 0), dtype=torch.long)
    grids = torch.meshgrid(*[torch.arange(V)] * k, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], -1)


def _cdf_breakpoints(dists: torch.Tensor) -> torch.Tensor:  # [M, D, V] -> [M, D*V + 1] sorted
    """The u values where inverse-CDF sampling (`specref.sample`) of each distribution switches token."""
    cdf = dists.cumsum(-1)
    points = (cdf / cdf[..., -1:]).reshape(dists.shape[0], -1).clamp(0, 1)
    return torch.cat([torch.zeros_like(points[:, :1]), points], 1).sort(-1).values


def _interior_points(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:  # [M, d] x2 -> [M, 3, d]
    """Near the lower corner, the centre and near the upper corner of each box [lo, hi)."""
    w = hi - lo
    points = torch.stack([lo + w / 64, lo + w / 2, hi - w / 64], 1)
    # A box ending at 1 and thinner than float spacing there would round a point up to 1 itself.
    return points.clamp(max=1 - 2**-53)


def enumerate_step(
    draft_tokens: torch.Tensor,  # [R, k] long
    q: torch.Tensor,  # [R, k, V] the q handed to the rule
    p: torch.Tensor,  # [R, k+1, V]
    weight: torch.Tensor,  # [R] probability of each row's drafts
    rule: ChainRule = verify_chain,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [M, k+1] padded -1, probability [M]
    """Every outcome of one step of `rule` on each row, with its probability (see the module doc).

    Rows whose q gives a draft probability 0 must not be passed (a draft is never
    sampled where q is 0, and `verify_chain` refuses it). Outcomes are not merged:
    the same token sequence can appear many times; sum them with `merge`.
    """
    R, k = draft_tokens.shape
    dt = torch.float64
    p, q, weight = p.to(dt), q.to(dt), weight.to(dt)
    px = p[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [R, k]
    qx = q.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [R, k]
    t = torch.where(qx > 0, (px / qx).clamp(max=1), torch.zeros_like(px))  # [R, k]

    # Every accept/reject pattern of the k draft uniforms: bit i set = u_i in the accept cell.
    bits = ((torch.arange(2**k)[:, None] >> torch.arange(k)) & 1).bool()  # [P, k]
    lo = torch.where(bits, 0.0, t[:, None]).to(dt)  # [R, P, k]
    hi = torch.where(bits, t[:, None], 1.0).to(dt)
    vol = (hi - lo).prod(-1) * weight[:, None]  # [R, P]
    row, pat = torch.nonzero(vol > 0, as_tuple=True)
    lo, hi, vol = lo[row, pat], hi[row, pat], vol[row, pat]  # [M, k], [M]
    a = bits[pat].long().cumprod(-1).sum(-1)  # [M] first rejected position (k: none)

    # The distributions the final token may be drawn from: p_a, q_a, residual_a and the bonus p_k.
    pa, pk = p[row, a], p[row, k]  # [M, V]
    if k > 0:
        qa = q[row, a.clamp(max=k - 1)]
        rejected = (a < k)[:, None]
        qa = torch.where(rejected, qa, pk)
        ra = torch.where(rejected, residual(pa, qa), pk)
    else:
        qa = ra = pk
    bp = _cdf_breakpoints(torch.stack([pa, qa, ra, pk], 1))  # [M, 4V+1]
    flo, fhi = bp[:, :-1], bp[:, 1:]  # [M, 4V] cells of the last uniform
    m, c = torch.nonzero(fhi > flo, as_tuple=True)
    lo = torch.cat([lo[m], flo[m, c, None]], 1)  # [M', k+1]
    hi = torch.cat([hi[m], fhi[m, c, None]], 1)
    vol = vol[m] * (fhi[m, c] - flo[m, c])
    row = row[m]

    tokens = []
    n_rows = lo.shape[0]
    step = max(1, _CHUNK // 3)
    for s in range(0, n_rows, step):
        sl = slice(s, s + step)
        r = row[sl]
        M = r.shape[0]
        u = _interior_points(lo[sl], hi[sl])  # [M, 3, k+1]
        rep = r.repeat_interleave(3)
        out, _ = rule(draft_tokens[rep], q[rep], p[rep], u=u.reshape(3 * M, k + 1))
        out = out.reshape(M, 3, k + 1)
        width = hi[sl] - lo[sl]
        checkable = (width > 1e-11 * hi[sl]).all(-1)  # [M]
        differs = (out != out[:, 1:2]).any(-1).any(-1) & checkable
        if differs.any():
            i = int(torch.nonzero(differs)[0])
            raise ValueError(
                "rule's outcome changes inside a cell of u-space: it does not accept by "
                f"u < min(1, p/q) or samples from none of p, q, residual, bonus; at u = "
                f"{u[i].tolist()} it returned {out[i].tolist()}"
            )
        tokens.append(out[:, 1])
    tokens_all = torch.cat(tokens) if tokens else torch.zeros((0, k + 1), dtype=torch.long)
    return tokens_all, vol


def merge(
    tokens: torch.Tensor,  # [M, L] padded -1
    prob: torch.Tensor,  # [M]
) -> dict[tuple[int, ...], float]:
    """Sum the probability of identical outcomes: {emitted tokens: probability}."""
    if tokens.shape[0] == 0:
        return {}
    uniq, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    total = torch.zeros(uniq.shape[0], dtype=torch.float64).index_add_(0, inverse, prob.to(torch.float64))
    return {tuple(x for x in seq if x >= 0): float(w) for seq, w in zip(uniq.tolist(), total.tolist())}


def _check_step(p: object, q: object) -> tuple[torch.Tensor, torch.Tensor, int]:
    p = check_probs("p", p, min_dim=2)
    q = check_probs("q", q, min_dim=2)
    if p.dim() != 2 or q.dim() != 2 or q.shape[0] + 1 != p.shape[0] or q.shape[1] != p.shape[1]:
        raise ValueError(f"p must be [k+1, V] and q [k, V] (same V), got {tuple(p.shape)} and {tuple(q.shape)}")
    return p.to(torch.float64), q.to(torch.float64), q.shape[0]


def step_distribution(
    p: torch.Tensor,  # [k+1, V] target distribution at each position
    q: torch.Tensor,  # [k, V] draft distribution at each position
    rule: ChainRule = verify_chain,
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the tokens one step of `rule` emits, drafts x_i ~ q_i independently.

    The per-position p_i and q_i are fixed (they do not depend on the drafted prefix).
    Keys are the emitted sequences (1 to k+1 tokens), values their probabilities.
    """
    p, q, k = _check_step(p, q)
    V = p.shape[-1]
    check_cells(V**k * 2**k, f"a step of k={k} drafts over V={V}")
    drafts = _cartesian(V, k)  # [V**k, k]
    prob = q[torch.arange(k), drafts].prod(-1) if k else torch.ones(1, dtype=torch.float64)
    keep = prob > 0
    drafts, prob = drafts[keep], prob[keep]
    R = drafts.shape[0]
    tokens, w = enumerate_step(drafts, q.expand(R, k, V), p.expand(R, k + 1, V), prob, rule)
    return merge(tokens, w)


def step_distribution_formula(
    p: torch.Tensor,  # [k+1, V]
    q: torch.Tensor,  # [k, V]
) -> dict[tuple[int, ...], float]:
    """The same distribution in closed form, from the proof (no rule is run).

    P(emit y_0..y_a) = prod_{i<a} min(p_i, q_i)(y_i) * (max(0, p_a - q_a)(y_a) if a < k else p_k(y_a)):
    draft y_i is drawn and kept with probability q_i(y) min(1, p_i(y)/q_i(y)) = min(p_i, q_i)(y);
    rejecting at a and drawing y from the residual has probability (1 - beta_a) residual_a(y) = max(0, p_a - q_a)(y).
    """
    p, q, k = _check_step(p, q)
    kept = torch.minimum(p[:k], q)  # [k, V]
    return chain_outputs(kept, [(p[a] - q[a]).clamp(min=0) for a in range(k)] + [p[k]])


def chain_outputs(
    kept: torch.Tensor,  # [k, V]: the mass of drawing and keeping draft y at position i
    last: list[torch.Tensor],  # k + 1 tensors [V]: the mass of emitting y after a accepted drafts
) -> dict[tuple[int, ...], float]:
    """P(emit y_0..y_a) = prod_{i<a} kept_i(y_i) * last_a(y_a), for every a in 0..k and every sequence (nonzero only).

    The shape every chain rule's exact output takes: the exact rule's (`step_distribution_formula`) and
    lossy variants' (a different `kept` or `last`).
    """
    V, k = kept.shape[-1], kept.shape[0]
    out: dict[tuple[int, ...], float] = {}
    for a in range(k + 1):
        for seq in itertools.product(range(V), repeat=a + 1):
            w = float(last[a][seq[-1]])
            for i, y in enumerate(seq[:-1]):
                w *= float(kept[i, y])
            if w > 0:
                out[seq] = w
    return out


def one_step_distribution(
    p: torch.Tensor,  # [V]
    q: torch.Tensor,  # [V]
    rule: ChainRule = verify_chain,
) -> torch.Tensor:  # [V]
    """P(the rule emits x) for one position: draft x ~ q, accept w.p. min(1, p/q), else residual.

    Runs `rule` with k = 1 (the bonus distribution is p again) and keeps the first emitted token.
    """
    p = check_probs("p", p)
    q = check_probs("q", q)
    if p.dim() != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must both have shape [V], got {tuple(p.shape)} and {tuple(q.shape)}")
    dist = step_distribution(torch.stack([p, p]), q[None], rule)
    out = torch.zeros(p.shape[0], dtype=torch.float64)
    for seq, w in dist.items():
        out[seq[0]] += w
    return out


def accepted_count_distribution(step: dict[tuple[int, ...], float], k: int) -> torch.Tensor:  # [k+1]
    """P(A = a), a = 0..k accepted drafts, from a step distribution (a step emits a + 1 tokens)."""
    out = torch.zeros(k + 1, dtype=torch.float64)
    for seq, w in step.items():
        if not 1 <= len(seq) <= k + 1:
            raise ValueError(f"step holds an outcome of {len(seq)} tokens; k = {k} allows 1 to {k + 1}")
        out[len(seq) - 1] += w
    return out


def _draft_chains(draft: MarkovChain | MisreportedDraft) -> tuple[MarkovChain, MarkovChain]:
    """(the chain drafts are sampled from, the chain whose q the rule is given)."""
    if isinstance(draft, MisreportedDraft):
        return draft.sampled, draft.reported
    if isinstance(draft, MarkovChain):
        return draft, draft
    raise TypeError(f"draft must be a MarkovChain or MisreportedDraft, got {type(draft).__name__}")


def chain_step_distribution(
    target: MarkovChain,
    draft: MarkovChain | MisreportedDraft,
    context_token: int,
    k: int,
    rule: ChainRule = verify_chain,
) -> dict[tuple[int, ...], float]:
    """Exact distribution of one speculative step on toy chains, after `context_token`.

    Every draft sequence is enumerated with its probability under the draft chain; q and
    p come from the chains' `score`, exactly what a real step hands the rule.
    """
    if not isinstance(target, MarkovChain):
        raise TypeError(f"target must be a MarkovChain, got {type(target).__name__}")
    sampled, reported = _draft_chains(draft)
    if sampled.vocab_size != target.vocab_size:
        raise ValueError(
            f"target and draft must share one vocabulary, got {target.vocab_size} and {sampled.vocab_size}"
        )
    check_int("k", k, 0, "draft tokens per step", wrong_type=ValueError)
    V = target.vocab_size
    check_cells(V**k * 2**k, f"a step of k={k} drafts over V={V}")
    drafts = _cartesian(V, k)  # [V**k, k]
    prob = sampled.joint(context_token, k).reshape(-1)  # same lexicographic order as _cartesian
    keep = prob > 0
    drafts, prob = drafts[keep], prob[keep]
    context = torch.full((drafts.shape[0], 1), context_token, dtype=torch.long)
    q = reported.score(context, drafts)[:, :k]
    p = target.score(context, drafts)
    tokens, w = enumerate_step(drafts, q, p, prob, rule)
    return merge(tokens, w)


def generation_distribution(
    target: MarkovChain,
    draft: MarkovChain | MisreportedDraft,
    start_token: int,
    k: int,
    n: int,
    rule: ChainRule = verify_chain,
) -> torch.Tensor:  # [V] * n
    """Exact joint distribution of the first n tokens speculative generation emits after start_token.

    Steps repeat until n tokens are out; a step's output past n is cut off. Because the
    chains are first order, what follows a step depends only on its last token, so
    the distribution is built from one enumerated step per context token.
    """
    check_int("n", n, 0, "tokens to generate", wrong_type=ValueError)
    if not isinstance(target, MarkovChain):
        raise TypeError(f"target must be a MarkovChain, got {type(target).__name__}")
    V = target.vocab_size
    check_cells(V**n, f"the joint of n={n} tokens over V={V}")
    check_int("start_token", start_token, 0, "a token id", wrong_type=ValueError)
    if start_token >= V:
        raise ValueError(f"start_token must be an int in [0, {V}), got {start_token!r}")
    steps: dict[int, dict[tuple[int, ...], float]] = {}
    memo: dict[tuple[int, int], torch.Tensor] = {}

    def following(c: int, r: int) -> torch.Tensor:  # [V] * r: the next r tokens after context token c
        if (c, r) in memo:
            return memo[(c, r)]
        out = torch.zeros((V,) * r, dtype=torch.float64)
        if r == 0:
            out = torch.ones((), dtype=torch.float64)
        else:
            if c not in steps:
                steps[c] = chain_step_distribution(target, draft, c, k, rule)
            for seq, w in steps[c].items():
                if len(seq) >= r:
                    out[seq[:r]] += w
                else:
                    out[seq] += w * following(seq[-1], r - len(seq))
        memo[(c, r)] = out
        return out

    return following(start_token, n)
