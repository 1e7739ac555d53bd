"""An audit of a production sampler: transformers' `_speculative_sampling`, run through specref's tests.

transformers verifies sampled drafts in `transformers.generation.utils._speculative_sampling`
(batch 1, logits in, randomness from torch's *global* generator through `rand_like` and
`multinomial`). Its uniforms cannot be handed in, so exact enumeration through it is not
possible; the Monte-Carlo test of `checks.montecarlo` can test it: `hf_rule` wraps the installed
function as a `ChainRule` and `pitfalls.step_test` samples one step many times against the closed
form of the exact rule. The global generator is seeded from the explicit generator inside
`torch.random.fork_rng`, so a run is reproducible and leaves the caller's global stream untouched.

`assistant_ensemble_weight = w` (transformers 5.x) accepts draft y with probability
min(1, 1 - w + w p(y)/q(y)) and keeps the exact rule's residual: the kept mass is
min(q, v) with v = w p + (1 - w) q, more than min(q, p) where q > p, so the output is not p.
`ensemble_step_distribution` is that rule's output in closed form, so its distance from the
exact rule is computed exactly and the function's samples are tested against it too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch

from ..rejection import ChainRule
from .exact import chain_outputs, step_distribution_formula
from .montecarlo import ALPHA, DistributionTest, distribution_test
from .pitfalls import _check_step_inputs, step_cells, step_table, tv_distance

SAMPLER = "transformers.generation.utils._speculative_sampling"


def find_sampler() -> tuple[Callable | None, bool, str]:
    """(the installed sampler or None, whether it takes `assistant_ensemble_weight`, what was found)."""
    try:
        import transformers
        from transformers.generation import utils
    except ImportError:
        return None, False, "transformers is not installed"
    fn = getattr(utils, "_speculative_sampling", None)
    if fn is None:
        return None, False, f"transformers {transformers.__version__} has no {SAMPLER}"
    has_weight = "assistant_ensemble_weight" in inspect.signature(fn).parameters
    found = f"transformers {transformers.__version__}: {SAMPLER}" + (
        ", with assistant_ensemble_weight" if has_weight else ", without assistant_ensemble_weight")
    return fn, has_weight, found


def hf_rule(fn: Callable, ensemble_weight: float | None = None, logits_dtype: torch.dtype = torch.float32) -> ChainRule:
    """`fn` (transformers' sampler) as a specref `ChainRule`, called one row at a time as transformers calls it.

    Row r becomes `fn(candidate_input_ids [1, 1 + k], candidate_logits [1, k, V], k, new_logits [1, k + 1, V])`:
    one context token then the drafts, the logits log q and log p in `logits_dtype` (transformers
    hands it float32 target logits). The global generator is seeded from `generator` inside
    `fork_rng`. Uniforms cannot be passed in: exact enumeration is refused.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (transformers' _speculative_sampling), got {type(fn).__name__}")
    if ensemble_weight is not None and (isinstance(ensemble_weight, bool) or not 0 < float(ensemble_weight) < 1):
        raise ValueError(f"ensemble_weight must be None or in (0, 1), got {ensemble_weight!r}")

    def rule(draft_tokens, q, p, generator=None, u=None):
        if u is not None:
            raise ValueError("transformers' sampler draws its own uniforms: it cannot be enumerated, only sampled")
        if not isinstance(generator, torch.Generator):
            raise TypeError("hf_rule needs an explicit torch.Generator (it seeds torch's global one from it)")
        N, k = draft_tokens.shape
        seed = int(torch.randint(2**62, (1,), generator=generator))
        log_q = q.log().to(logits_dtype)  # [N, k, V]
        log_p = p.log().to(logits_dtype)  # [N, k+1, V]
        extra = {} if ensemble_weight is None else {"assistant_ensemble_weight": float(ensemble_weight)}
        tokens = torch.full((N, k + 1), -1, dtype=torch.long)
        n_acc = torch.zeros(N, dtype=torch.long)
        context = torch.zeros((1, 1), dtype=torch.long)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for r in range(N):
                ids = torch.cat([context, draft_tokens[r : r + 1]], 1)  # [1, 1 + k]
                valid, n = fn(ids, log_q[r : r + 1], k, log_p[r : r + 1], **extra)  # [1, n + 1], n
                n = int(n)
                tokens[r, : n + 1] = valid[0]
                n_acc[r] = n
        return tokens, n_acc

    return rule


def ensemble_step_distribution(
    p: torch.Tensor,  # [k+1, V]
    q: torch.Tensor,  # [k, V]
    weight: float,
) -> dict[tuple[int, ...], float]:
    """Exact output of one step of transformers' ensemble rule (drafts x_i ~ q_i), in closed form.

    Draft y is kept with probability q_i(y) min(1, 1 - w + w p_i(y)/q_i(y)) = min(q_i, v_i)(y),
    v_i = w p_i + (1 - w) q_i; a rejection at a (probability 1 - sum min(q_a, v_a)) draws from the
    exact rule's residual max(0, p_a - q_a) normalized (p_a where that has no mass, as transformers
    does); all k kept: the bonus from p_k. At w = 1 this is `exact.step_distribution_formula`.
    """
    p, q, k, V = _check_step_inputs(p, q)
    if isinstance(weight, bool) or not 0 < float(weight) <= 1:
        raise ValueError(f"weight must be in (0, 1], got {weight!r}")
    v = weight * p[:k] + (1 - weight) * q  # [k, V]
    kept = torch.minimum(q, v)  # [k, V]
    last = []
    for a in range(k):
        diff = (p[a] - q[a]).clamp(min=0)
        res = diff / diff.sum() if float(diff.sum()) > 0 else p[a]
        last.append((1 - kept[a].sum()) * res)
    return chain_outputs(kept, last + [p[k]])


def first_token(dist: dict[tuple[int, ...], float], V: int) -> torch.Tensor:  # [V]
    """The distribution of a step's first emitted token."""
    out = torch.zeros(V, dtype=torch.float64)
    for seq, w in dist.items():
        out[seq[0]] += w
    return out


def first_token_counts(tokens: torch.Tensor, V: int) -> torch.Tensor:  # [N, k+1] -> [V]
    """How often each token came first in the sampled steps."""
    return torch.bincount(tokens[:, 0], minlength=V)


def power(
    expected: torch.Tensor,  # [C] the distribution the test holds samples to
    alternative: torch.Tensor,  # [C] the distribution the samples really come from
    samples: int,
    trials: int = 200,
    seed: int = 0,
    alpha: float = ALPHA,
) -> float:
    """P(`distribution_test` fails) at this sample size when samples come from `alternative`.

    Estimated from `trials` multinomial draws of `samples` outcomes each (numpy, seeded): with
    alternative == expected it is the false-alarm rate, otherwise the test's power against it.
    """
    rng = np.random.default_rng(seed)
    alt = np.asarray(alternative, dtype=np.float64)
    alt = alt / alt.sum()
    fails = sum(not distribution_test(expected, counts=torch.as_tensor(rng.multinomial(samples, alt)),
                                      alpha=alpha).passed for _ in range(trials))
    return fails / trials


def audit_case(seed: int = 0, k: int = 2, V: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A step to audit: p [k+1, V] and q [k, V] as float64 softmaxes of float32 logits (what transformers is handed).

    Logits ~ 1.5 * N(0, 1) per position, from a seeded generator: every token has positive mass, and p and q
    differ enough that a sampler which skips the residual, or mixes q into p, moves the output.
    """
    g = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(2 * k + 1, V, generator=g, dtype=torch.float32)
    probs = torch.softmax(logits.double(), -1)
    return probs[: k + 1], probs[k + 1 :]


def exact_table(p: torch.Tensor, q: torch.Tensor, weight: float | None = None) -> torch.Tensor:  # [cells]
    """A step's outcome table (`pitfalls.step_table`): the exact rule's, or the ensemble rule's at `weight`."""
    k, V = q.shape
    dist = step_distribution_formula(p, q) if weight is None else ensemble_step_distribution(p, q, weight)
    return step_table(dist, k, V)


def tv_from_exact(p: torch.Tensor, q: torch.Tensor, weight: float) -> float:
    """Exact TV between the ensemble rule's step output and the exact rule's (= the target's) at this step."""
    return tv_distance(exact_table(p, q, weight), exact_table(p, q))


def first_departure(a: torch.Tensor, b: torch.Tensor) -> int | None:  # [n], [n]
    """The first position where two token sequences differ, or None when they are equal."""
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    diff = torch.nonzero(a != b)
    return int(diff[0]) if diff.numel() else None


def sample_steps(
    rule: ChainRule,
    p: torch.Tensor,  # [k+1, V]
    q: torch.Tensor,  # [k, V]
    runs: int,
    generator: torch.Generator,
) -> torch.Tensor:  # [runs, k+1] padded with -1
    """`runs` steps of `rule` with drafts x_i ~ q_i drawn from `generator`: what `pitfalls.step_test` tests, kept."""
    p, q, k, V = _check_step_inputs(p, q)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be an int >= 1, got {runs!r}")
    drafts = torch.stack([torch.multinomial(q[i], runs, replacement=True, generator=generator) for i in range(k)], 1)
    tokens, _ = rule(drafts, q.expand(runs, k, V), p.expand(runs, k + 1, V), generator)  # [N, k+1]
    return tokens


def step_test_of(tokens: torch.Tensor, expected: torch.Tensor, V: int, alpha: float = ALPHA) -> DistributionTest:
    """`distribution_test` of sampled steps ([N, k+1], padded with -1) against a step table (`exact_table`)."""
    return distribution_test(expected, samples=step_cells(tokens, V), alpha=alpha)
