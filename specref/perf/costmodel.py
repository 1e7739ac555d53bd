"""When speculation stops paying: a cost model of one pass, and the k it implies at each batch size (chapter 7).

One target pass over a batch of B rows, each scoring T new tokens after S cached
tokens, costs (all times in seconds)

    t(B, T, S) = overhead + combine(memory, compute)
    memory     = weights + kv * B * S                 reading the weights, then every row's KV cache
    compute    = per_token * B * T + attention * B * T * S      the matmuls, then attention's dot products

`combine` is `max` (the roofline: memory traffic and arithmetic overlap, the slower
one sets the time) or `+` (they do not overlap). A speculative step at batch B is
one target pass over B x (k + 1) tokens, k draft steps over B x 1, and the loop's own
work (the acceptance rule over B x (k + 1) distributions, bookkeeping), so

    speedup(alpha, k, B) = E(alpha, k) * t(B, 1, S) / (t(B, k + 1, S) + loop(B, k + 1) + k * t_draft(B))

which is the chapter's E / (v + c k), and its E / (1 + c k) once v is 1. While the
pass is memory-bound v stays near 1; past the ridge (B x (k + 1) tokens of compute
costing more than the memory traffic) v grows like k + 1 and speculation loses.

Which form: `PassModel.fit(rows, form="auto")` fits both and keeps the one with the
smaller RMS relative error, recording the other's. The roofline is the shape of a pass
whose weights stream from memory (a flat memory floor, then a compute line, as on a
GPU); the sum is the shape of a pass whose weights sit in cache, where the matmuls and
the cache reads take turns on one core and time grows from the first token (as on a
small CPU). A B x S term (KV reads) and a B x T term (matmuls) are both kept because
either can dominate.

A grid of passes timed apart from decoding leaves out what a speculative step adds: a
per-step draft cost (`draft_fixed`), the acceptance rule and bookkeeping (`loop`), and
a batch that waits for its slowest, lowest-alpha row (`alpha_sd`). `CostModel` holds
those terms too; benchmarks/bench_batch.py fits them to measured speculative runs at
half the batch sizes and reports the error on the other half; the fits it measured are
in benchmarks/.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares, nnls
from scipy.stats import beta as scipy_beta

from .._validate import as_int_tuple, check_int
from ..models.kvcache import attended_slots
from ..theory import expected_tokens_per_step

FORMS = ("sum", "roofline")
# least_squares stops once a step changes the cost by less than FTOL (relative). Near the minimum the
# cost is quadratic in the coefficients, so a fit is pinned down to about sqrt(FTOL) of its values: two
# CPUs whose BLAS round differently may return fits that differ that much, and no less is promised.
LEAST_SQUARES_FTOL = 1e-8
FIT_RTOL = math.sqrt(LEAST_SQUARES_FTOL)
_TERMS = ("overhead", "weights", "kv", "per_token", "attention")


def _count(name: str, x: object, minimum: int) -> int:
    """`check_int`, numpy integers accepted (batch sizes often come from arrays)."""
    return check_int(name, int(x) if isinstance(x, np.integer) else x, minimum, "a count")


def _nonneg(name: str, x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {x!r}")
    if not (math.isfinite(float(x)) and float(x) >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")
    return float(x)


def _alpha(alpha: object) -> float:
    """One acceptance rate as a float in [0, 1]; a TypeError naming alpha for an array, a str or a bool."""
    a = np.asarray(alpha)
    if a.ndim != 0 or a.dtype.kind not in "iuf":
        raise TypeError(f"alpha must be one number in [0, 1], got {alpha!r}")
    expected_tokens_per_step(float(a), 0)  # raises on a value outside [0, 1]
    return float(a)


def _positive(name: str, x: object) -> float:
    v = _nonneg(name, x)
    if v == 0:
        raise ValueError(f"{name} must be > 0, got {x!r}")
    return v


@dataclass(frozen=True)
class FitError:
    """Relative error of a fit on the rows it was fitted to: predicted / measured - 1."""

    median: float  # median |relative error|
    max: float  # largest |relative error|
    rms: float  # root mean square relative error (what the fit minimises)
    n: int  # rows

    @classmethod
    def of(cls, rel: np.ndarray) -> FitError:
        """From the rows' relative errors, predicted / measured - 1 (a 1-d array)."""
        r = np.abs(np.asarray(rel, dtype=np.float64))
        return cls(median=float(np.median(r)), max=float(r.max()), rms=float(np.sqrt(np.mean(r**2))), n=len(r))


@dataclass(frozen=True)
class PassModel:
    """Seconds for one pass of one model: t(B, T, S) = overhead + combine(memory, compute) (see the module doc).

    Every coefficient is >= 0. `weights` is only identifiable in the roofline form
    (in the sum it is one more constant, folded into `overhead`).
    """

    overhead: float = 0.0  # s per pass: dispatch, Python, small kernels
    weights: float = 0.0  # s per pass: reading the weights
    kv: float = 0.0  # s per row and cached token: reading the KV cache
    per_token: float = 0.0  # s per token processed (B x T): the matmuls
    attention: float = 0.0  # s per token processed and cached token: attention's dot products
    form: str = "sum"  # "sum": memory + compute; "roofline": max(memory, compute)
    error: FitError | None = None  # on the rows it was fitted to; None when not fitted
    alternatives: dict[str, FitError] = field(default_factory=dict)  # the other forms' fit errors (form="auto")

    def __post_init__(self) -> None:
        for name in _TERMS:
            _nonneg(name, getattr(self, name))
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")

    def __call__(self, batch_size: object, n_tokens: object, context: object) -> float | np.ndarray:
        """Seconds for a pass over [batch_size, n_tokens] new tokens after `context` cached ones (broadcasts)."""
        B, T, S = _grid(batch_size, n_tokens, context)
        memory = self.weights + self.kv * B * S
        compute = self.per_token * B * T + self.attention * B * T * S
        t = self.overhead + (np.maximum(memory, compute) if self.form == "roofline" else memory + compute)
        return float(t) if t.ndim == 0 else t

    @classmethod
    def fit(cls, rows: Iterable[Sequence[float] | Mapping[str, float]], form: str = "auto") -> PassModel:
        """Least squares on relative error over measured rows (batch_size, n_tokens, context, seconds).

        Rows may be tuples or dicts with those keys (`seconds` or `median_s`). form="auto"
        fits both forms and keeps the one with the smaller RMS relative error; the other's
        error is kept in `alternatives`, so the choice can be read off the data.
        """
        if form != "auto" and form not in FORMS:
            raise ValueError(f"form must be 'auto' or one of {FORMS}, got {form!r}")
        B, T, S, t = _rows(rows)
        if form == "auto":
            fits = [cls._fit(B, T, S, t, f) for f in FORMS]
            best = min(fits, key=lambda m: m.error.rms)
            return replace(best, alternatives={m.form: m.error for m in fits if m is not best})
        return cls._fit(B, T, S, t, form)

    @classmethod
    def _fit(cls, B: np.ndarray, T: np.ndarray, S: np.ndarray, t: np.ndarray, form: str) -> PassModel:
        # Columns: overhead, kv (B S), per_token (B T), attention (B T S); each row divided by its
        # time, so the residual is the relative error and small passes weigh as much as large ones.
        X = np.stack([np.ones_like(t), B * S, B * T, B * T * S], 1) / t[:, None]
        coef, _ = nnls(X, np.ones_like(t))
        model = cls(*(float(x) for x in (coef[0], 0.0, coef[1], coef[2], coef[3])), form="sum")
        if form == "roofline":
            model = _fit_roofline(model, B, T, S, t)
        return replace(model, error=_error(model(B, T, S), t))

    @classmethod
    def roofline(
        cls,
        n_params: float,
        bandwidth: float,  # bytes/s
        peak_flops: float,  # FLOP/s
        bytes_per_param: float = 2.0,
        kv_bytes_per_token: float = 0.0,  # bytes of K and V per row and cached token, all layers
        attention_flops_per_token: float = 0.0,  # FLOPs per new token and cached token, all layers
        efficiency: float = 1.0,  # the fraction of peak_flops the matmuls reach
        overhead: float = 0.0,
    ) -> PassModel:
        """The roofline of a model on a machine: weights / bandwidth, or 2 n_params FLOPs per token / compute.

        The ridge, in tokens per pass, is efficiency * peak_flops / bandwidth * bytes_per_param / 2.
        """
        n_params, bandwidth = _positive("n_params", n_params), _positive("bandwidth", bandwidth)
        peak_flops, bytes_per_param = _positive("peak_flops", peak_flops), _positive("bytes_per_param", bytes_per_param)
        efficiency = _positive("efficiency", efficiency)
        if efficiency > 1:
            raise ValueError(f"efficiency is a fraction of peak, in (0, 1], got {efficiency}")
        flops = efficiency * peak_flops
        return cls(overhead=overhead, weights=n_params * bytes_per_param / bandwidth,
                   kv=_nonneg("kv_bytes_per_token", kv_bytes_per_token) / bandwidth,
                   per_token=2 * n_params / flops,
                   attention=_nonneg("attention_flops_per_token", attention_flops_per_token) / flops, form="roofline")

    def ridge_tokens(self, context: int = 0) -> float:
        """Tokens per pass (B x T, one row per token) where compute catches up with memory; inf if it never does."""
        context = _count("context", context, 0)
        slope = self.per_token + self.attention * context
        return math.inf if slope == 0 else (self.weights + self.kv * context) / slope

    def as_dict(self) -> dict:
        d = asdict(self)
        d["error"] = None if self.error is None else asdict(self.error)
        d["alternatives"] = {k: asdict(v) for k, v in self.alternatives.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> PassModel:
        """Inverse of `as_dict` (e.g. from a benchmark's results file)."""
        err = d.get("error")
        return cls(**{k: float(d[k]) for k in _TERMS}, form=d.get("form", "sum"),
                   error=None if err is None else FitError(**err),
                   alternatives={k: FitError(**v) for k, v in d.get("alternatives", {}).items()})


def _grid(batch_size: object, n_tokens: object, context: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    for name, x in (("batch_size", batch_size), ("n_tokens", n_tokens), ("context", context)):
        if np.asarray(x).dtype.kind not in "iuf":
            raise TypeError(f"{name} must be a number (or an array of numbers), got {x!r}")
    B, T, S = (np.asarray(x, dtype=np.float64) for x in (batch_size, n_tokens, context))
    if not (np.isfinite(B).all() and np.isfinite(T).all()) or (B < 1).any() or (T < 1).any():
        raise ValueError(f"batch_size and n_tokens must be finite and >= 1, got {batch_size!r}, {n_tokens!r}")
    if not np.isfinite(S).all() or (S < 0).any():
        raise ValueError(f"context must be finite and >= 0, got {context!r}")
    return B, T, S


def _rows(rows: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # 4 x [n]
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise TypeError(f"rows must be an iterable of (batch_size, n_tokens, context, seconds), got {rows!r}")
    out = []
    for r in rows:
        if isinstance(r, Mapping):
            missing = [key for key in ("batch_size", "n_tokens", "context") if key not in r]
            if missing or not ("seconds" in r or "median_s" in r):
                raise TypeError(f"each dict row needs batch_size, n_tokens, context and seconds (or median_s); "
                                f"{r!r} lacks {missing or ['seconds']}")
            r = (r["batch_size"], r["n_tokens"], r["context"], r["seconds"] if "seconds" in r else r["median_s"])
        if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 4:
            raise TypeError(f"each row must be (batch_size, n_tokens, context, seconds), got {r!r}")
        out.append([float(v) for v in r])
    a = np.asarray(out, dtype=np.float64).reshape(-1, 4)
    if len(a) < 4:
        raise ValueError(f"need at least 4 rows to fit 4 coefficients, got {len(a)}")
    B, T, S, t = a.T
    _grid(B, T, S)
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError("every row's seconds must be a finite number > 0")
    return B, T, S, t


def _error(pred: np.ndarray, t: np.ndarray) -> FitError:
    return FitError.of(np.asarray(pred) / t - 1)


def _fit_roofline(start: PassModel, B: np.ndarray, T: np.ndarray, S: np.ndarray, t: np.ndarray) -> PassModel:
    """max(memory, compute): nonlinear, so least squares from a few starts; coefficients kept >= 0."""
    scale = np.array([np.median(t), np.median(t), np.median(t / (B * S + 1)), np.median(t / (B * T)),
                      np.median(t / (B * T * S + 1))])  # a natural size for each coefficient
    def resid(x: np.ndarray) -> np.ndarray:
        m = PassModel(*(x * scale), form="roofline")
        return m(B, T, S) / t - 1
    best = None
    s = np.array([start.overhead, 0.0, start.kv, start.per_token, start.attention]) / scale
    for x0 in (s + 0.01, np.array([0.5, 0.5, 0.1, 0.5, 0.1]), np.array([0.1, 1.0, 0.0, 0.2, 0.0]) + 0.01):
        r = least_squares(resid, x0, bounds=(0, np.inf), method="trf", ftol=LEAST_SQUARES_FTOL,
                          xtol=LEAST_SQUARES_FTOL, gtol=LEAST_SQUARES_FTOL)
        if best is None or r.cost < best.cost:
            best = r
    return PassModel(*(float(x) for x in best.x * scale), form="roofline")


@dataclass(frozen=True)
class CostModel:
    """A target's pass time, a draft's step cost and the loop's own cost: what `predict_speedup` and `choose_k` need.

    `draft` is the draft's own `PassModel` (its step at batch B costs draft(B, 1, S)), or a
    number c: a draft step costs c plain target passes at every batch size (the chapter's c).
    `loop`, if given, is what a decoding step costs beyond the passes, as a function of
    the tokens the step scores (B x (k + 1); B x 1 for plain decoding): sampling or the
    acceptance rule over B x (k + 1) distributions, and the loop's bookkeeping.
    `verify_factor` scales the target's pass when it verifies inside speculative decoding
    (on a CPU the draft's passes evict the target's weights from the caches between
    verifications, and a batch's rows attend over its longest row); 1 = as timed alone.
    `context` is the number of cached tokens before a pass (a run's mean). `max_len`, if given, is the
    cache's size in specref's own pass, which attends over `KVCache.capacity` (the slots in use after
    the pass rounded up to a power of two, at most max_len: `attended_slots`), so a pass of T tokens
    reads attended_slots(context + T, max_len) slots of K/V; None: it reads the context. Give it with pass
    models whose S is the slots a pass reads (a roofline from bytes, or a fit to timings recorded with the
    attended slots as S), not with fits whose S is the context, which would count the rounding twice.
    `draft_fixed`, if given, is what the draft spends once per step beyond its k steps, at
    draft_fixed(B, 1, S): the catch-up pass over the tokens the last step accepted, and
    building q. `prompt_target` and `prompt_draft`, if given, time the prompt's pass
    (default: `target`, and `draft` when it is a PassModel), for models fitted to
    one-token steps that cannot extrapolate to a prompt. `alpha_sd` is the spread of
    alpha across a batch's rows (rows' prompts differ; a batch waits for its slowest
    row): see `batch_steps`.
    Plain decoding's step is one target pass (its argmax or sample is left out).
    """

    target: PassModel
    draft: PassModel | float
    context: int = 64
    loop: PassModel | None = None
    verify_factor: float = 1.0
    draft_fixed: PassModel | None = None
    alpha_sd: float = 0.0
    prompt_target: PassModel | None = None
    prompt_draft: PassModel | None = None
    max_len: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.target, PassModel):
            raise TypeError(f"target must be a PassModel, got {type(self.target).__name__}")
        if not isinstance(self.draft, PassModel):
            _nonneg("draft (c)", self.draft)
        for name in ("loop", "draft_fixed", "prompt_target", "prompt_draft"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), PassModel):
                raise TypeError(f"{name} must be a PassModel or None, got {type(getattr(self, name)).__name__}")
        _check_sd(0.5, self.alpha_sd)
        _count("context", self.context, 0)
        if self.max_len is not None and _count("max_len", self.max_len, 1) <= self.context:
            raise ValueError(f"max_len must leave room for a pass after the context ({self.context}), got {self.max_len}")
        _positive("verify_factor", self.verify_factor)
        if not self.target(1, 1, self.read_slots(1)) > 0:  # every speedup divides by the plain step's time
            raise ValueError(f"target predicts 0 seconds for a plain step at context={self.context}: "
                             "give it an overhead, weights or per_token cost > 0")

    def read_slots(self, n_tokens: int) -> int:
        """The K/V slots per row a pass of n_tokens reads: the context, or the capacity it attends over (max_len)."""
        if self.max_len is None:
            return self.context
        # A pass past the cache reads all of it: the loop never runs one (it cuts k to the room left), `choose_k` may ask.
        return attended_slots(min(self.context + n_tokens, self.max_len), self.max_len)

    def pass_time(self, batch_size: int, n_tokens: int) -> float:
        """Seconds for one target pass over batch_size x n_tokens new tokens at this context."""
        return self.target(batch_size, n_tokens, self.read_slots(n_tokens))

    def loop_time(self, batch_size: int, n_tokens: int) -> float:
        """Seconds a speculative step spends outside the passes when it scores batch_size x n_tokens tokens."""
        return 0.0 if self.loop is None else self.loop(batch_size, n_tokens, self.context)

    def verify_time(self, k: int, batch_size: int) -> float:
        """Seconds for one verification: the target's pass over B x (k + 1) tokens in decoding, and the rule."""
        return self.verify_factor * self.pass_time(batch_size, k + 1) + self.loop_time(batch_size, k + 1)

    def plain_time(self, batch_size: int) -> float:
        """Seconds for one plain decoding step: one pass over B x 1 tokens."""
        return self.pass_time(batch_size, 1)

    def draft_time(self, batch_size: int) -> float:
        """Seconds for one draft step (one token per row) at this batch size."""
        if isinstance(self.draft, PassModel):
            return self.draft(batch_size, 1, self.read_slots(1))
        return self.draft * self.pass_time(batch_size, 1)

    def draft_step_time(self, k: int, batch_size: int) -> float:
        """Seconds the draft spends in one speculative step: k draft steps and the per-step fixed part."""
        fixed = 0.0 if self.draft_fixed is None else self.draft_fixed(batch_size, 1, self.read_slots(1))
        return k * self.draft_time(batch_size) + (fixed if k else 0.0)

    def v(self, k: int, batch_size: int) -> float:
        """Verification in plain steps: (t(B, k + 1) + rule) / t(B, 1); about 1 while the pass is memory-bound."""
        return self.verify_time(k, batch_size) / self.plain_time(batch_size)

    def c(self, batch_size: int) -> float:
        """One draft step in plain steps at this batch size."""
        return self.draft_time(batch_size) / self.plain_time(batch_size)

    def step_time(self, k: int, batch_size: int) -> float:
        """Seconds for one speculative step (k drafts, one verification); k = 0 is one plain step."""
        k, B = _count("k", k, 0), _count("batch_size", batch_size, 1)
        if k == 0:
            return self.plain_time(B)
        return self.verify_time(k, B) + self.draft_step_time(k, B)

    def predict_speedup(self, alpha: float, k: int, batch_size: int) -> float:
        """E(alpha, k) x plain step / speculative step = E / (v + c k): steady-state tokens per second vs plain."""
        k, alpha = _count("k", k, 0), _alpha(alpha)
        return float(expected_tokens_per_step(alpha, k)) * self.plain_time(batch_size) / self.step_time(k, batch_size)

    def run_speedup(self, alpha: float, k: int, batch_size: int, new_tokens: int) -> float:
        """Plain / speculative time for new_tokens per row, the prompt's pass left out; the batch waits for its slowest.

        n plain steps against `batch_steps(alpha, k, B, n, alpha_sd)` speculative steps, each
        at this model's context. At B = 1 and large n it approaches `predict_speedup`.
        """
        k, B, n = _count("k", k, 0), _count("batch_size", batch_size, 1), _count("new_tokens", new_tokens, 1)
        alpha = _alpha(alpha)
        if k == 0:
            return 1.0
        return n * self.plain_time(B) / (batch_steps(alpha, k, B, n, self.spread_at(alpha)) * self.step_time(k, B))

    def throughput(self, alpha: float, k: int, batch_size: int) -> float:
        """Predicted tokens per second over the whole batch, steady state."""
        k, batch_size, alpha = _count("k", k, 0), _count("batch_size", batch_size, 1), _alpha(alpha)
        return batch_size * float(expected_tokens_per_step(alpha, k)) / self.step_time(k, batch_size)

    def predict_time(self, alpha: float, k: int, batch_size: int, prompt_len: int, new_tokens: int) -> float:
        """Seconds for a whole run: the prompt's pass (target, and draft when k > 0), then the steps.

        Plain decoding (k = 0) makes new_tokens - 1 passes after the prompt's; speculative
        decoding `batch_steps` steps: new_tokens / E for one row, more for a batch, which
        waits for its slowest row. Context: the run's mean, prompt_len + new_tokens / 2.
        """
        k, B = _count("k", k, 0), _count("batch_size", batch_size, 1)
        P, n = _count("prompt_len", prompt_len, 1), _count("new_tokens", new_tokens, 1)
        alpha = _alpha(alpha)
        # The mean context, and the cache a real run sizes (prompt, tokens, one step's drafts) where slots are counted.
        at = replace(self, context=P + n // 2, max_len=None if self.max_len is None else max(self.max_len, P + n + k + 1))
        prompt = (self.prompt_target or self.target)(B, P, 0)
        if k == 0:
            return prompt + (n - 1) * at.plain_time(B)
        draft_prompt = self.prompt_draft or (self.draft if isinstance(self.draft, PassModel) else None)
        if draft_prompt is not None:
            prompt += draft_prompt(B, P, 0)
        return prompt + batch_steps(alpha, k, B, n, self.spread_at(alpha)) * at.step_time(k, B)

    def spread_at(self, alpha: float) -> float:
        """The rows' alpha spread at mean alpha: alpha_sd, capped below the largest a Beta of that mean can have.

        alpha_sd is fitted at the runs' alphas; at a mean where sd^2 >= alpha (1 - alpha) no Beta
        exists, so the cap (0.99 of the bound) keeps every prediction defined (alpha 0 or 1: 0).
        """
        a = _alpha(alpha)
        return min(self.alpha_sd, 0.99 * math.sqrt(a * (1 - a)))

    def as_dict(self) -> dict:
        draft = self.draft.as_dict() if isinstance(self.draft, PassModel) else float(self.draft)
        return {"target": self.target.as_dict(), "draft": draft, "context": self.context,
                "loop": None if self.loop is None else self.loop.as_dict(), "verify_factor": self.verify_factor,
                **{name: None if getattr(self, name) is None else getattr(self, name).as_dict()
                   for name in ("draft_fixed", "prompt_target", "prompt_draft")}, "alpha_sd": self.alpha_sd,
                **({} if self.max_len is None else {"max_len": self.max_len})}

    @classmethod
    def from_dict(cls, d: Mapping) -> CostModel:
        """Inverse of `as_dict`: `CostModel.from_dict(results["cost_models"]["greedy"])` rebuilds a benchmark's fit."""
        draft = d["draft"]
        opt = {name: None if d.get(name) is None else PassModel.from_dict(d[name])
               for name in ("loop", "draft_fixed", "prompt_target", "prompt_draft")}
        return cls(PassModel.from_dict(d["target"]),
                   PassModel.from_dict(draft) if isinstance(draft, Mapping) else float(draft), int(d["context"]),
                   verify_factor=float(d.get("verify_factor", 1.0)), alpha_sd=float(d.get("alpha_sd", 0.0)),
                   max_len=None if d.get("max_len") is None else int(d["max_len"]), **opt)


def _check_sd(alpha: float, sd: object) -> float:
    sd = _nonneg("alpha_sd", sd)
    if sd > 0 and sd**2 >= alpha * (1 - alpha):
        raise ValueError(f"alpha_sd must satisfy alpha_sd^2 < alpha (1 - alpha) = {alpha * (1 - alpha):.4g}, got {sd}")
    return sd


_SD_POINTS = 40  # quantiles of the rows' Beta distribution of alpha


def batch_steps(alpha: float, k: int, batch_size: int, new_tokens: int, alpha_sd: float = 0.0) -> float:
    """Expected speculative steps until every one of batch_size rows has new_tokens tokens.

    The batch runs until its slowest row is done (finished rows still ride along in every
    pass), so a batch takes more steps than new_tokens / E(alpha, k) whenever B > 1. Each
    row's step emits 1 + A tokens, P(A >= i) = alpha^i (i <= k), independently across rows
    and steps; with F(s) = P(T <= s) the chance that one row is done after s steps,
    E[max over rows] = sum over s of 1 - F(s)^B. Exact, by convolution.

    Rows are not alike: each prompt has its own alpha. With alpha_sd > 0 a row's alpha is
    drawn from the Beta distribution of mean alpha and standard deviation alpha_sd (taken
    at 40 quantiles), so F(s) is the mean of F(s | alpha_row), and the slowest of many rows
    is a low-alpha row: on this course's pair at B = 256, greedy, k = 8, 35 measured steps
    against 25 for alike rows.
    """
    k, B, n = _count("k", k, 0), _count("batch_size", batch_size, 1), _count("new_tokens", new_tokens, 1)
    a = _alpha(alpha)
    sd = _check_sd(a, alpha_sd) if 0 < a < 1 else 0.0 * _nonneg("alpha_sd", alpha_sd)  # alpha 0 or 1: no spread
    if k == 0:
        return float(n)
    if sd == 0:
        rows = np.array([a])
    else:
        c = a * (1 - a) / sd**2 - 1  # Beta(a c, (1 - a) c) has mean a and variance sd^2
        rows = scipy_beta.ppf((np.arange(_SD_POINTS) + 0.5) / _SD_POINTS, a * c, (1 - a) * c)
    done = _done_by_step(rows, k, n).mean(0)  # [n]
    return float(np.sum(1 - done**B))


def _done_by_step(a: np.ndarray, k: int, n: int) -> np.ndarray:  # [m, n] P(row done after s steps), s = 0..n-1
    a = a[:, None]  # [m, 1], one alpha per row kind
    step = [a**i * (1 - a) for i in range(k)] + [a**k]  # k + 1 of [m, 1]: P(a step emits i + 1 tokens)
    dist = np.zeros((len(a), n + 1))  # P(a row holds min(j, n) tokens), j = 0..n
    dist[:, 0] = 1.0
    done = np.zeros((len(a), n))
    for s in range(n):  # every step emits at least one token: n steps always suffice
        done[:, s] = dist[:, n]
        nxt = np.zeros_like(dist)
        nxt[:, n] = dist[:, n]
        for i, p in enumerate(step):  # j tokens + (i + 1), capped at n
            j = max(n - i - 1, 0)
            nxt[:, i + 1:n] += dist[:, :j] * p
            nxt[:, n] += dist[:, j:n].sum(1) * p[:, 0]
        dist = nxt
    return done


def _check_model(cost_model: object) -> None:
    if not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")


def choose_k(
    alpha: float, batch_size: int, cost_model: CostModel, k_max: int = 8, ks: Iterable[int] | None = None,
    margin: float = 0.0, new_tokens: int | None = None,
) -> int:
    """The k (0 = speculation off) with the best predicted throughput at this batch size; the smallest on ties.

    `ks` restricts the choice to the k a deployment supports (default 0..k_max). With
    `margin` > 0 speculation is switched on only where its predicted speedup is at least
    1 + margin: a model that errs by up to that much cannot then lose against plain
    decoding. With `new_tokens` the prediction is a whole batch's (`CostModel.run_speedup`:
    the batch waits for its slowest row); without, the steady state of one row.
    """
    margin = _nonneg("margin", margin)
    if new_tokens is not None:
        _count("new_tokens", new_tokens, 1)
    _check_model(cost_model)
    B = _count("batch_size", batch_size, 1)
    candidates = range(_count("k_max", k_max, 0) + 1) if ks is None else sorted({_count("k", k, 0) for k in ks})
    if not candidates:
        raise ValueError("ks must hold at least one k")
    alpha = _alpha(alpha)  # raises on a bad alpha, even when only k = 0 is allowed

    def gain(k: int) -> float:
        if new_tokens is None:
            return cost_model.predict_speedup(alpha, k, B)
        return cost_model.run_speedup(alpha, k, B, new_tokens)

    best = max(candidates, key=lambda k: (gain(k), -k))
    if best and gain(best) < 1 + margin:
        return 0 if 0 in candidates else best
    return best


def crossover_batch(
    alpha: float, k: int, cost_model: CostModel, b_max: int = 4096, new_tokens: int | None = None
) -> int | None:
    """The smallest batch size at which the predicted speedup of this k drops below 1; None up to b_max.

    With `new_tokens` the speedup is a whole batch's (`CostModel.run_speedup`), else the steady state's.
    """
    k, b_max, alpha = _count("k", k, 1), _count("b_max", b_max, 1), _alpha(alpha)
    _check_model(cost_model)
    if new_tokens is not None:
        _count("new_tokens", new_tokens, 1)
    for B in range(1, b_max + 1):
        s = (cost_model.predict_speedup(alpha, k, B) if new_tokens is None
             else cost_model.run_speedup(alpha, k, B, new_tokens))
        if s < 1:
            return B
    return None


# -- the chapter's worked example -------------------------------------------------------------------

H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM HBM3
H100_BF16_FLOPS = 990e12  # FLOP/s, dense bf16 tensor-core peak


def h100_cost_model(
    n_params: float = 70e9, c: float = 0.05, efficiency: float = 0.4, bytes_per_param: float = 2.0
) -> CostModel:
    """A 70B-parameter bf16 target on one H100, with a draft of c x its parameters (also roofline-bound).

    KV-cache reads and attention are left out, as in the chapter's estimate. `efficiency`
    is the fraction of the bf16 peak the matmuls reach. At 1.0 the ridge is 296 tokens
    per pass, so a plain step at B = 128 is still memory-bound and B = 128, k = 4 gives
    v = 2.2 and about 1.4x. The chapter's "verification ~5x a normal step" (640 / 128
    tokens) assumes the plain step at B = 128 is already compute-bound, i.e. a ridge
    below 128 tokens: efficiency <= 0.43. The default 0.4 (an assumption, not a
    measurement) puts the ridge at 118 tokens and reproduces the chapter's 0.65x.
    """
    target = PassModel.roofline(n_params, H100_BANDWIDTH, H100_BF16_FLOPS, bytes_per_param, efficiency=efficiency)
    draft = PassModel.roofline(_positive("c", c) * n_params, H100_BANDWIDTH, H100_BF16_FLOPS, bytes_per_param,
                               efficiency=efficiency)
    return CostModel(target, draft, context=0)


def h100_worked_example(
    alpha: float = 0.8, k: int = 4, batch_sizes: Sequence[int] = (8, 128), efficiency: float = 0.4
) -> list[dict[str, float]]:
    """The chapter's table: at each batch size, tokens per pass, E, v, c and the predicted speedup E / (v + c k).

    With the defaults: B = 8 -> 40 tokens, v = 1, about 2.8x; B = 128 -> 640 tokens, v = 5, about 0.65x.
    """
    batch_sizes = as_int_tuple("batch_sizes", batch_sizes)
    model = h100_cost_model(efficiency=efficiency)
    E = float(expected_tokens_per_step(_alpha(alpha), k))
    return [{"batch_size": B, "tokens_per_pass": B * (k + 1), "E": E, "v": model.v(k, B), "c": model.c(B),
             "plain_step_s": model.pass_time(B, 1), "verify_s": model.pass_time(B, k + 1),
             "speedup": model.predict_speedup(alpha, k, B)} for B in batch_sizes]
