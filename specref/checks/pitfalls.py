"""The checks that catch the bugs real implementations shipped (the broken variants are in `checks.broken`).

    bug (negative control)                          check named for it
    argmax draft scored with a softmax q            `chain_tv` (exact), `deterministic_first_token` (real pair)
    q not processed like p                          `chain_tv` (exact), `distribution_test` on `simulate`
    target cache not rolled back                    `greedy_mismatch`: greedy output must be the target's
    in-place edits of p                             `changed_inputs`; `step_test(..., reuse=True)`
    accept count that is not the accepted prefix    `step_test`: one step against its closed form
    a lossy rule (typical acceptance)               `chain_tv`, `step_test`, via `acceptance_rule`

Every exact figure is float64. A step's outcomes (1 to k + 1 tokens) are cells of one table:
sequences of length L start at offset V + V^2 + ... + V^(L-1), in lexicographic order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .._validate import check_int
from ..chain_verify import verify_chain
from ..decoding.chain import generate, speculative_generate
from ..rejection import ChainRule, residual
from ..sampling import SamplingParams, sample
from .exact import enumerate_step, generation_distribution, merge, step_distribution_formula
from .montecarlo import ALPHA, DistributionTest, distribution_test
from .toy import MarkovChain, MisreportedDraft


def tv_distance(a: torch.Tensor | Mapping, b: torch.Tensor | Mapping) -> float:
    """Total variation 0.5 * sum |a - b| between two distributions: tensors of one shape, or {outcome: prob} dicts."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return 0.5 * sum(abs(float(a.get(x, 0.0)) - float(b.get(x, 0.0))) for x in set(a) | set(b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            raise ValueError("a and b must hold finite probabilities (no NaN or inf)")
        return 0.5 * float((a.double() - b.double()).abs().sum())
    raise TypeError(f"a and b must both be tensors or both dicts, got {type(a).__name__} and {type(b).__name__}")


def chain_tv(
    target: MarkovChain,
    draft: MarkovChain | MisreportedDraft,
    start_token: int,
    k: int,
    n: int,
    rule: ChainRule = verify_chain,
) -> float:
    """Exact TV between the first n tokens speculative generation emits and the target's own (toy chains)."""
    return tv_distance(generation_distribution(target, draft, start_token, k, n, rule), target.joint(start_token, n))


def argmax_chain(chain: MarkovChain) -> MarkovChain:
    """The chain that always moves to the argmax of `chain`'s row: what a greedy draft samples from."""
    t = chain.transition
    return MarkovChain(torch.nn.functional.one_hot(t.argmax(-1), t.shape[-1]).to(t.dtype))


def acceptance_rule(acceptance: object) -> ChainRule:
    """A verifier with `verify(draft_tokens, p, generator)` (e.g. `specref.typical.TypicalAcceptance`) as a ChainRule.

    q is ignored, as such rules ignore it. Given explicit uniforms `u` (exact enumeration),
    the rule must not draw randomness of its own: only a deterministic next token is allowed.
    """
    if not callable(getattr(acceptance, "verify", None)):
        raise TypeError(f"acceptance must have verify(draft_tokens, p, generator), got {type(acceptance).__name__}")

    def rule(draft_tokens, q, p, generator=None, u=None):
        if u is not None and getattr(acceptance, "next_token", "argmax") != "argmax":
            raise ValueError("exact enumeration needs a deterministic next token (next_token='argmax')")
        return acceptance.verify(draft_tokens, p, generator)

    return rule


# -- one step with fixed p_i and q_i, sampled in a batch ------------------------------------------------


def _check_step_inputs(p: object, q: object) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    if not isinstance(p, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise TypeError("p and q must be tensors, p [k+1, V] and q [k, V]")
    if p.dim() != 2 or q.dim() != 2 or q.shape[0] + 1 != p.shape[0] or q.shape[1] != p.shape[1]:
        raise ValueError(f"p must be [k+1, V] and q [k, V] (same V), got {tuple(p.shape)} and {tuple(q.shape)}")
    return p.double(), q.double(), q.shape[0], p.shape[1]


def step_cells(tokens: torch.Tensor, V: int) -> torch.Tensor:  # [N, k+1] padded -1 -> [N]
    """The table cell of each step outcome (see the module docstring)."""
    length = (tokens >= 0).sum(-1)  # [N]
    code = torch.zeros(tokens.shape[0], dtype=torch.long)
    for i in range(tokens.shape[1]):
        code = torch.where(i < length, code * V + tokens[:, i].clamp(min=0), code)
    offsets = torch.tensor([sum(V**j for j in range(1, L)) for L in range(tokens.shape[1] + 1)])
    return offsets[length] + code


def step_table(dist: Mapping[tuple[int, ...], float], k: int, V: int) -> torch.Tensor:  # [V + ... + V^(k+1)]
    """A step distribution {emitted tokens: probability} as a vector over the cells."""
    size = sum(V**j for j in range(1, k + 2))
    out = torch.zeros(size, dtype=torch.float64)
    for seq, w in dist.items():
        padded = torch.tensor([list(seq) + [-1] * (k + 1 - len(seq))])
        out[step_cells(padded, V)] += w
    return out


def step_test(
    rule: ChainRule,
    p: torch.Tensor,  # [k+1, V]
    q: torch.Tensor,  # [k, V]
    runs: int,
    generator: torch.Generator,
    reuse: bool = False,
    alpha: float = ALPHA,
) -> DistributionTest:
    """`distribution_test` of `runs` steps of `rule` (drafts x_i ~ q_i, one batch) against the exact rule's closed form.

    reuse=True hands the rule the same p and q tensors twice, fresh drafts each time, and
    tests the second call's tokens: what a caller sees who reads p again after the rule
    (a second sample from one target pass, a shared prefix, a tree's siblings).
    """
    p, q, k, V = _check_step_inputs(p, q)
    check_int("runs", runs, 1, "steps sampled")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    expected = step_table(step_distribution_formula(p, q), k, V)
    P = p.expand(runs, k + 1, V).clone()  # [N, k+1, V]
    Q = q.expand(runs, k, V).clone()  # [N, k, V]

    def drafts() -> torch.Tensor:  # [N, k]
        if k == 0:
            return torch.zeros((runs, 0), dtype=torch.long)
        return torch.stack([sample(Q[:, i], generator) for i in range(k)], 1)

    if reuse:
        rule(drafts(), Q, P, generator)
    tokens, _ = rule(drafts(), Q, P, generator)  # [N, k+1] padded with -1
    return distribution_test(expected, samples=step_cells(tokens, V), alpha=alpha)


def changed_inputs(
    rule: ChainRule,
    draft_tokens: torch.Tensor,  # [B, k]
    q: torch.Tensor,  # [B, k, V]
    p: torch.Tensor,  # [B, k+1, V]
    generator: torch.Generator | None = None,
) -> list[str]:
    """The names of the inputs `rule` modified in place (empty: it left them alone). The caller's tensors are not touched."""
    for name, t in (("draft_tokens", draft_tokens), ("q", q), ("p", p)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    given = {"draft_tokens": draft_tokens.clone(), "q": q.clone(), "p": p.clone()}
    rule(given["draft_tokens"], given["q"], given["p"], generator)
    originals = {"draft_tokens": draft_tokens, "q": q, "p": p}
    return [name for name, t in given.items() if not torch.equal(t, originals[name])]


# -- the real pair ------------------------------------------------------------------------------------


def greedy_mismatch(
    reference: torch.nn.Module,
    target: torch.nn.Module,
    draft: object,
    prompts: Sequence[Sequence[int]],
    k: int,
    max_new_tokens: int,
) -> list[int | None]:
    """Per prompt: the first new position where greedy speculative decoding (target, draft) differs
    from `reference`'s own greedy output, or None where they agree token for token.

    `target` is the model the loop runs (possibly a broken wrapper of `reference`).
    """
    out: list[int | None] = []
    for prompt in prompts:
        ids = torch.tensor([list(prompt)])
        want = generate(reference, ids, max_new_tokens, temperature=0)[0, ids.shape[1]:]
        got = speculative_generate(target, draft, ids, k, max_new_tokens, temperature=0)[0][0, ids.shape[1]:]
        diff = torch.nonzero(want != got)
        out.append(int(diff[0]) if diff.numel() else None)
    return out


@torch.no_grad()
def deterministic_first_token(
    target: torch.nn.Module,
    prompt: Sequence[int],
    drafts: torch.Tensor,  # [k] the drafts (a deterministic draft: its proposal is a function of the context)
    q: torch.Tensor,  # [k, V] the q handed to the rule
    params: SamplingParams,
    rule: ChainRule = verify_chain,
) -> tuple[torch.Tensor, torch.Tensor]:  # [V], [V]
    """(the exact distribution of the first token one step emits, the target's p_1 there), float64.

    With drafts fixed by the context, `enumerate_step` covers every uniform; the target scores
    prompt + drafts in one pass without a cache. The rule is exact iff the two agree.
    A small top_k in `params` keeps the enumeration small (its cells follow the supports).
    """
    drafts = drafts.long().reshape(1, -1)
    k = drafts.shape[1]
    logits = target(torch.tensor([list(prompt) + drafts[0].tolist()], device=target.device))  # [1, T + k, V]
    p = params.probs(logits[0, -(k + 1):].double())  # [k+1, V]
    tokens, w = enumerate_step(drafts, q.double().reshape(1, k, -1), p[None], torch.ones(1, dtype=torch.float64), rule)
    first = torch.zeros(p.shape[-1], dtype=torch.float64)
    for seq, prob in merge(tokens, w).items():
        first[seq[0]] += prob
    return first, p[0]


def misreported_first_token(
    p: torch.Tensor,  # [..., V] the target's processed distribution
    q_sampled: torch.Tensor,  # [..., V] what the draft really sampled from
    q_reported: torch.Tensor,  # [..., V] the q the rule was handed
) -> torch.Tensor:  # [..., V]
    """P(the first emitted token = y) when drafts come from q_sampled but the rule uses q_reported (float64).

    Closed form of one position of `verify_chain` (tests check it against `enumerate_step`):
    q_s(y) min(1, p(y)/q_r(y)) + [sum_x q_s(x) (1 - min(1, p(x)/q_r(x)))] residual(p, q_r)(y).
    It is p whenever q_s = q_r. Rows are independent, so a whole text's positions go at once,
    where enumerating a 4096-token vocabulary would not fit.
    """
    p, qs, qr = (t.double() for t in (p, q_sampled, q_reported))
    if not (p.shape == qs.shape == qr.shape):
        raise ValueError(f"p, q_sampled and q_reported must share one shape, got {p.shape}, {qs.shape}, {qr.shape}")
    if ((qs > 0) & (qr <= 0)).any():
        raise ValueError("q_reported is 0 where q_sampled drafts: the rule would refuse that draft")
    ratio = torch.where(qr > 0, p / torch.where(qr > 0, qr, torch.ones_like(qr)), torch.zeros_like(p)).clamp(max=1)
    kept = qs * ratio  # [..., V]
    return kept + (1 - kept.sum(-1, keepdim=True)) * residual(p, qr)


@torch.no_grad()
def first_token_exact(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompt: Sequence[int],
    params: SamplingParams,
    rule: ChainRule = verify_chain,
    max_support: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:  # [V], [V]
    """(the exact distribution of the first token a k = 1 step of `rule` emits after `prompt`, the target's p_1), float64.

    Every draft x ~ q (q: the draft model's processed distribution) is enumerated with the
    target's p_1 and p_2 after prompt + x (one batched pass), and every uniform by
    `enumerate_step`. The support of q must be small: sample with a small top_k.
    """
    if params.greedy:
        raise ValueError("first_token_exact enumerates sampled drafts: use a temperature > 0")
    ctx = torch.tensor([list(prompt)], device=target.device)
    q = params.probs(draft(ctx)[0, -1].double())  # [V]
    support = torch.nonzero(q > 0).squeeze(-1)  # [S]
    if support.numel() > max_support:
        raise ValueError(f"q has {support.numel()} tokens of positive probability (> {max_support}): use a small top_k")
    S, V = support.numel(), q.shape[0]
    ids = torch.cat([ctx.expand(S, -1), support[:, None].to(ctx.device)], 1)  # [S, T+1]
    p = params.probs(target(ids)[:, -2:].double())  # [S, 2, V]
    tokens, w = enumerate_step(support[:, None].cpu(), q.expand(S, 1, V).cpu(), p.cpu(), q[support].cpu(), rule)
    first = torch.zeros(V, dtype=torch.float64)
    for seq, prob in merge(tokens, w).items():
        first[seq[0]] += prob
    return first, p[0, 0].cpu()
