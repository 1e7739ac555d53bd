"""What exercise 4's sampling check can see at its sample size, computed exactly (float64) on the bundled pair.

Rule: the check compares N samples of a decoder's first two tokens with their exact distribution
(`exact_first_two`: p1(y1) p2(y2 | y1), the processed target's, in float64). `sampling_power` enumerates
every draw of one speculative step with `specref.checks.exact.enumerate_step` for the correct rule and two
broken ones, and gives each one's total-variation distance from p1 and chi-square non-centrality per sample,
beside the distribution test's TV bound at N over the two tokens' cells (and over the full vocabulary).
"""

from __future__ import annotations

import copy
import functools
import math

import torch

from ..chain_verify import verify_chain
from ..models import heldout_prompts, load_pair
from ..sampling import process_logits
from .exact import enumerate_step
from .montecarlo import ALPHA, tv_bound, verify_skip_residual

# The setting of exercise 4's visible sampling check: a prompt where draft and target disagree, a small top-k.
SAMPLING = {"prompt": 15, "n_tokens": 30, "k": 2, "temperature": 0.7, "top_k": 3, "n": 2000}


@functools.lru_cache(maxsize=1)
def _pair64() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The bundled pair converted to float64, for exact figures."""
    target, draft, _ = load_pair()
    return copy.deepcopy(target).double().eval(), copy.deepcopy(draft).double().eval()


def exact_first_two(target: torch.nn.Module, prompt: list[int], temperature: float, top_k: int | None
                    ) -> dict[tuple[int, int], float]:
    """P(first two generated tokens = (y1, y2)) = p1(y1) p2(y2 | y1), processed target distributions, float64."""
    with torch.no_grad():
        p1 = process_logits(target(torch.tensor([prompt]))[0, -1].double(), temperature, top_k)
        first = torch.nonzero(p1 > 0).flatten().tolist()
        rows = torch.tensor([prompt + [y] for y in first])
        p2 = process_logits(target(rows)[:, -1].double(), temperature, top_k)  # [len(first), V]
    return {(y1, y2): float(p1[y1] * p2[i, y2]) for i, y1 in enumerate(first) for y2 in torch.nonzero(p2[i] > 0).flatten().tolist()}



def sampling_power(sampling: dict | None = None) -> dict[str, float]:
    """What the sampling check can see, exactly (float64): the first token's distribution under the rule and
    under two broken decoders, each enumerated by `specref.checks.exact.enumerate_step`, their TV from p_1 and
    chi-square non-centrality per sample, next to the test's TV bound at N over the two tokens' cells.

    `skip_residual` runs `verify_skip_residual`; `q_unprocessed` runs `verify_chain` on drafts sampled from the
    processed q but handed softmax(draft logits) (temperature 1, no top-k).
    """
    s = dict(SAMPLING if sampling is None else sampling)
    target, draft = _pair64()
    prompt = heldout_prompts(n=s["prompt"] + 1, n_tokens=s["n_tokens"])[s["prompt"]]
    with torch.no_grad():
        lt, ld = target(torch.tensor([prompt]))[0, -1], draft(torch.tensor([prompt]))[0, -1]
    p, q = process_logits(lt, s["temperature"], s["top_k"]), process_logits(ld, s["temperature"], s["top_k"])
    q_raw = torch.softmax(ld, -1)
    # Enumerate on the tokens p or q can give, plus one cell holding the rest of q_raw's mass: no draft and
    # no output lands there, so the rules behave exactly as on the full vocabulary, and the enumeration stays small.
    keep = (p > 0) | (q > 0)
    p, q = torch.cat([p[keep], p.new_zeros(1)]), torch.cat([q[keep], q.new_zeros(1)])
    q_raw = torch.cat([q_raw[keep], q_raw[~keep].sum(0, keepdim=True)])
    xs = torch.nonzero(q > 0)  # [R, 1]: every draft with its probability q(x)
    R = xs.shape[0]
    rows_p = p.expand(R, 2, -1)

    def first_token(q_rule: torch.Tensor, rule) -> torch.Tensor:  # [V']
        tokens, prob = enumerate_step(xs, q_rule.expand(R, 1, -1), rows_p, q[xs[:, 0]], rule)
        return torch.zeros_like(p).index_add_(0, tokens[:, 0], prob)

    out = {"beta": float(torch.minimum(p, q).sum()), "n": s["n"]}
    support = p > 0
    for name, dist in (("correct", first_token(q, verify_chain)), ("skip_residual", first_token(q, verify_skip_residual)),
                       ("q_unprocessed", first_token(q_raw, verify_chain))):
        out[f"tv_{name}"] = 0.5 * float((dist - p).abs().sum())
        out[f"ncp_{name}"] = float(((dist - p)[support] ** 2 / p[support]).sum()) + (math.inf if float(dist[~support].sum()) > 0 else 0.0)
    m = len(exact_first_two(target, prompt, s["temperature"], s["top_k"]))
    out["cells"] = m
    out["tv_bound"] = tv_bound(m, s["n"], ALPHA)
    out["tv_bound_full_vocabulary"] = tv_bound(target.config.vocab_size, s["n"], ALPHA)
    return out


# --------------------------------------------------------------------------------------
# Exercise 4.3: the decoder
# --------------------------------------------------------------------------------------
