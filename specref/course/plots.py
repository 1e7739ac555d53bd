"""The numbers behind the course's pictures, and the pictures.

Each picture is drawn from a pure function that returns plain arrays (tests call
those directly): `accept_reject_view` splits the emitted distribution of one
accept/reject position into its accepted and residual parts, `speedup_curves`
tabulates tokens per step and speedup over k. The plot functions only draw what
those return, onto a matplotlib Axes they are given (or a new one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..checks.exact import one_step_distribution
from ..rejection import acceptance_probability, residual
from ..theory import expected_tokens_per_step, optimal_k, speedup

ArrayLike = Sequence[float] | np.ndarray | torch.Tensor


def normalize_weights(weights: ArrayLike, name: str = "weights") -> np.ndarray:  # [V] -> [V]
    """Scale non-negative weights (e.g. slider positions) to a distribution that sums to 1."""
    w = np.array(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D list of numbers, got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {w.tolist()}")
    total = w.sum()
    if total <= 0:
        raise ValueError(f"{name} must put weight on at least one token (all are 0)")
    return w / total


def _as_dist(name: str, x: ArrayLike) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64)
    try:
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a sequence of probabilities or a tensor, got {x!r}") from e


def accept_reject_view(p: ArrayLike, q: ArrayLike) -> dict[str, np.ndarray | float]:  # p, q: [V]
    """Split P(emit x) for one position into min(q(x), p(x)) + (1 - beta) * residual(x).

    Returns float64 numpy arrays keyed `p`, `q`, `accepted` (= min(p, q): x drafted
    and accepted), `residual` (specref.residual), `residual_mass` (= (1 - beta) *
    residual: x emitted after a rejection), `output` (their sum, which equals p),
    `rule_output` (what specref.verify_chain emits, by exact enumeration: the code,
    not the algebra), and the float `beta` (specref.acceptance_probability).
    """
    pt, qt = _as_dist("p", p), _as_dist("q", q)
    if pt.dim() != 1:
        raise ValueError(f"p must be one distribution of shape [V], got shape {tuple(pt.shape)}")
    beta = acceptance_probability(pt, qt)  # also checks that p and q are distributions of one shape
    res = residual(pt, qt)
    # Drafted (prob. q) then accepted (prob. min(1, p/q)): q * min(1, p/q) = min(p, q).
    accepted = torch.minimum(pt, qt)
    # Rounding can push the float sum beta an ulp above 1; a probability cannot go below 0.
    residual_mass = (1 - beta).clamp(min=0) * res
    return {
        "p": pt.numpy().copy(),
        "q": qt.numpy().copy(),
        "accepted": accepted.numpy(),
        "residual": res.numpy(),
        "residual_mass": residual_mass.numpy(),
        "output": (accepted + residual_mass).numpy(),
        "rule_output": one_step_distribution(pt, qt).numpy(),
        "beta": float(beta),
    }


def speedup_curves(alpha: float, c: float, k_max: int = 16) -> dict[str, np.ndarray | int | float]:
    """Tokens per step E(alpha, k) and speedup S(alpha, k, c) for k = 0..k_max, and the best k.

    Keys: `alpha`, `c`, `k` [k_max+1], `tokens_per_step` [k_max+1], `speedup` [k_max+1],
    `optimal_k` (specref.optimal_k; 0 means drafting does not pay), `best_speedup`.
    """
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < 1:
        raise ValueError(f"k_max must be an int >= 1, got {k_max!r}")
    ks = np.arange(k_max + 1)
    s = np.asarray(speedup(alpha, ks, c), dtype=np.float64)
    best = int(optimal_k(alpha, c, k_max=int(k_max)))
    return {
        "alpha": float(alpha),
        "c": float(c),
        "k": ks,
        "tokens_per_step": np.asarray(expected_tokens_per_step(alpha, ks), dtype=np.float64),
        "speedup": s,
        "optimal_k": best,
        "best_speedup": float(s[best]),
    }


def _axes(ax):  # -> matplotlib Axes
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6.5, 3.2))
    return ax


def plot_accept_reject(view: dict, labels: Sequence[str] | None = None, ax=None):
    """Bars per token: the draft q, then accepted + residual mass stacked, with p and the rule's output marked.

    `view` is what `accept_reject_view` returns. Returns the Axes.
    """
    ax = _axes(ax)
    V = len(view["p"])
    labels = list(labels) if labels is not None else [chr(ord("a") + i) for i in range(V)]
    if len(labels) != V:
        raise ValueError(f"labels must name the {V} tokens, got {len(labels)} labels")
    x = np.arange(V)
    w = 0.36
    ax.bar(x - w / 2, view["q"], w, color="#bbbbbb", label="draft q")
    ax.bar(x + w / 2, view["accepted"], w, color="#3b75af", label="accepted: min(p, q)")
    ax.bar(
        x + w / 2, view["residual_mass"], w, bottom=view["accepted"], color="#ef8636",
        label="after a rejection: (1 - beta) residual",
    )
    # The target drawn as a line over the stacked bar: the stack always reaches it.
    ax.hlines(view["p"], x, x + w, colors="black", linewidth=2.5, label="target p")
    if "rule_output" in view:
        ax.plot(x + w / 2, view["rule_output"], "D", color="white", markeredgecolor="black", markersize=6,
                linestyle="none", label="verify_chain emits (exact)")
    ax.set_xticks(x, labels)
    # Headroom above 1 keeps the legend clear of the bars, whatever the sliders say.
    ax.set_ylim(0, 1.32)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("probability")
    ax.set_title(f"beta = {view['beta']:.3f}: accepted mass; 1 - beta = {1 - view['beta']:.3f}: residual mass")
    ax.legend(fontsize=7, loc="upper center", ncol=3, framealpha=0.9)
    return ax


def plot_speedup_curves(curves: dict, k: int | None = None, axes=None):
    """Tokens per step and speedup against k, with the best k (and optionally the chosen k) marked.

    `curves` is what `speedup_curves` returns; `axes` a pair of Axes (new ones if None).
    Returns the pair.
    """
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    ax_e, ax_s = axes
    ks, best = curves["k"], curves["optimal_k"]
    ax_e.plot(ks, curves["tokens_per_step"], "o-", color="#3b75af", markersize=4)
    ax_e.plot(ks, ks + 1, ":", color="grey", label="k + 1 (every draft accepted)")
    alpha = curves.get("alpha")
    if alpha is not None and alpha < 1 and 1 / (1 - alpha) <= ks[-1] + 1:
        # sum_i alpha^i never exceeds the infinite geometric series.
        ax_e.axhline(1 / (1 - alpha), color="#3b75af", linestyle="--", linewidth=1, label="limit 1 / (1 - alpha)")
    ax_e.set_xlabel("k (drafts per step)")
    ax_e.set_ylabel("E[tokens per step]")
    ax_e.legend(fontsize=8, loc="upper left")
    c_label = f"c = {curves['c']:.2f}" if "c" in curves else None
    ax_s.plot(ks, curves["speedup"], "o-", color="#3b75af", markersize=4, label=c_label)
    ax_s.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax_s.axvline(best, color="#2a9d3f", linestyle="--", linewidth=1.2)
    ax_s.plot([best], [curves["best_speedup"]], "*", color="#2a9d3f", markersize=14, label=f"best k = {best}")
    if k is not None:
        for ax, key in ((ax_e, "tokens_per_step"), (ax_s, "speedup")):
            ax.plot([k], [curves[key][k]], "o", color="#ef8636", markersize=9, label=f"chosen k = {k}")
    ax_s.set_xlabel("k (drafts per step)")
    ax_s.set_ylabel("speedup S(alpha, k, c)")
    ax_s.legend(fontsize=8, loc="lower right")
    if alpha is not None:
        ax_s.set_title(f"alpha = {alpha:.2f}, c = {curves['c']:.2f}", fontsize=10)
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return axes


def plot_acceptance_spread(
    alphas: ArrayLike,  # [S] acceptance probability in each context
    weights: ArrayLike | None = None,  # [S] how often each context occurs
    ax=None,
):
    """Histogram of per-context acceptance probabilities, weighted by how often each context occurs."""
    ax = _axes(ax)
    a = np.asarray(alphas.detach().cpu() if isinstance(alphas, torch.Tensor) else alphas, dtype=np.float64)
    w = None if weights is None else normalize_weights(weights, "weights")
    if w is not None and w.shape != a.shape:
        raise ValueError(f"weights must have one entry per context, shape {a.shape}, got {w.shape}")
    mean = float(np.average(a, weights=w))
    ax.hist(a, bins=np.linspace(0, 1, 21), weights=w, color="#3b75af", edgecolor="white")
    ax.axvline(mean, color="black", linestyle="--", label=f"mean = {mean:.2f}")
    ax.set_xlabel("acceptance probability beta(context)")
    ax.set_ylabel("share of contexts" if w is not None else "number of contexts")
    ax.legend(fontsize=8)
    return ax


def jensen_view(
    alphas: ArrayLike,  # [S] acceptance probability in each context
    weights: ArrayLike | None,  # [S] how often each context occurs (None: equally often)
    k: int,
) -> dict[str, float]:
    """Tokens per step from the average alpha vs the average of each context's tokens per step.

    E(alpha, k) is convex in alpha (a sum of powers), so by Jensen's inequality
    `mean_of_f` = sum_s w_s E(alpha_s, k) >= `f_of_mean` = E(sum_s w_s alpha_s, k).
    Keys: `mean_alpha`, `f_of_mean`, `mean_of_f`.
    """
    a = np.asarray(alphas.detach().cpu() if isinstance(alphas, torch.Tensor) else alphas, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"alphas must be a non-empty 1-D list, got shape {a.shape}")
    w = np.full(a.shape, 1 / a.size) if weights is None else normalize_weights(weights, "weights")
    if w.shape != a.shape:
        raise ValueError(f"weights must have one entry per context, shape {a.shape}, got {w.shape}")
    mean_alpha = float(w @ a)
    return {
        "mean_alpha": mean_alpha,
        "f_of_mean": float(expected_tokens_per_step(mean_alpha, k)),
        "mean_of_f": float(w @ np.asarray(expected_tokens_per_step(a, k))),
    }


def plot_jensen(alphas: ArrayLike, weights: ArrayLike | None, k: int, ax=None):
    """E[tokens per step] against alpha, each context on the curve, and the two ways of averaging.

    The average of the contexts' points lies above the curve (it is a chord of a convex
    function); the formula applied to the average alpha lies on it. Returns the Axes.
    """
    ax = _axes(ax)
    view = jensen_view(alphas, weights, k)
    a = np.asarray(alphas.detach().cpu() if isinstance(alphas, torch.Tensor) else alphas, dtype=np.float64)
    w = np.full(a.shape, 1 / a.size) if weights is None else normalize_weights(weights, "weights")
    grid = np.linspace(0, 1, 201)
    ax.plot(grid, expected_tokens_per_step(grid, k), color="#3b75af", label=f"E(alpha, k={k})")
    ax.scatter(a, expected_tokens_per_step(a, k), s=30 + 400 * w, color="#bbbbbb", edgecolor="black",
               zorder=3, label="contexts (size: share of steps)")
    m = view["mean_alpha"]
    ax.plot([m], [view["mean_of_f"]], "o", color="#2a9d3f", markersize=10, zorder=4,
            label=f"mean of E(alpha_c) = {view['mean_of_f']:.2f}")
    ax.plot([m], [view["f_of_mean"]], "s", color="#ef8636", markersize=9, zorder=4,
            label=f"E(mean alpha) = {view['f_of_mean']:.2f}")
    ax.set_xlabel("alpha")
    ax.set_ylabel("E[tokens per step]")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return ax


def roofline_view(
    weight_bytes: float,  # bytes of weights one pass reads (specref.perf.roofline.weight_bytes)
    flops_per_token: float,  # FLOPs one pass spends per token scored (specref.perf.roofline.forward_flops(model, 1))
    bandwidth: float,  # bytes/s (specref.perf.costs.memory_bandwidth)
    peak_flops: float,  # FLOP/s (specref.perf.costs.peak_matmul_flops)
    token_counts: ArrayLike,  # [n] tokens scored per pass
    measured: ArrayLike | None = None,  # [n] measured seconds per pass
) -> dict[str, np.ndarray | float]:
    """What the roofline model predicts for one pass over T tokens, next to what was measured.

    memory time = weight_bytes / bandwidth (the same for every T: the weights are read
    once per pass), compute time = T * flops_per_token / peak_flops, and the roofline
    time is the larger of the two: a pass can go no faster than its memory traffic or
    its arithmetic allows. Whatever a measured pass takes beyond that is the roofline's
    remainder: per-pass work (dispatch, small kernels, bookkeeping) and kernels that run
    below the bandwidth or the peak (a CPU's matrix product over a few rows, say).
    Keys: `tokens`, `memory_time` (float), `compute_time`, `roofline`, and with
    `measured`: `measured`, `overhead` (measured - roofline) and `explained`
    (roofline / measured, the share of the measured time the roofline accounts for).
    """
    for name, v in (("weight_bytes", weight_bytes), ("flops_per_token", flops_per_token),
                    ("bandwidth", bandwidth), ("peak_flops", peak_flops)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v > 0:
            raise ValueError(f"{name} must be a number > 0, got {v!r}")
    tokens = np.asarray(token_counts, dtype=np.float64)
    if tokens.ndim != 1 or tokens.size == 0 or not (tokens >= 1).all():
        raise ValueError(f"token_counts must be a non-empty 1-D list of counts >= 1, got {token_counts!r}")
    memory_time = float(weight_bytes) / float(bandwidth)
    compute_time = tokens * float(flops_per_token) / float(peak_flops)
    view: dict[str, np.ndarray | float] = {
        "tokens": tokens,
        "memory_time": memory_time,
        "compute_time": compute_time,
        "roofline": np.maximum(memory_time, compute_time),
    }
    if measured is not None:
        m = np.asarray(measured.detach().cpu() if isinstance(measured, torch.Tensor) else measured, dtype=np.float64)
        if m.shape != tokens.shape or not (m > 0).all():
            raise ValueError(f"measured must hold one time > 0 per token count, shape {tokens.shape}, got {m.tolist()}")
        view.update(measured=m, overhead=m - view["roofline"], explained=view["roofline"] / m)
    return view


def plot_roofline(view: dict, ax=None, unit: float = 1e-3):
    """Measured time per pass against tokens, over the roofline prediction (memory floor, compute line).

    `view` is what `roofline_view` returns; times are drawn in units of `unit` seconds
    (milliseconds by default). The dashed grey line is what the cost would be if every
    token cost as much as a one-token pass. Returns the Axes.
    """
    ax = _axes(ax)
    T = view["tokens"]
    _draw_roofline(ax, view, unit)
    if "measured" in view:
        m = view["measured"]
        ax.plot(T, m / unit, "o-", color="#3b75af", label="measured")
        ax.plot(T, m[0] * T / T[0] / unit, "--", color="grey", linewidth=1, label="if every token cost a full pass")
        top = float(m.max())
    else:
        top = float(view["roofline"].max())
    _finish_pass_axes(ax, T, 1.5 * max(top, float(view["roofline"].max())), unit, "upper right")
    return ax


def _draw_roofline(ax, view: dict, unit: float) -> None:
    """The roofline of a `roofline_view`, with its memory and compute terms, in green."""
    T = view["tokens"]
    ax.plot(T, view["roofline"] / unit, "s-", color="#2a9d3f", label="roofline: max(memory, compute)")
    ax.plot(T, np.full(T.shape, view["memory_time"]) / unit, ":", color="#2a9d3f", linewidth=1,
            label="memory: weight bytes / bandwidth")
    ax.plot(T, view["compute_time"] / unit, "--", color="#2a9d3f", linewidth=1, label="compute: FLOPs / peak")


def _finish_pass_axes(ax, T: np.ndarray, top: float, unit: float, legend: str) -> None:
    """Log-2 token axis, time axis from 0 to `top` seconds, labels, legend and grid."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(T, [str(int(t)) for t in T])
    ax.set_ylim(0, top / unit)
    ax.set_xlabel("new tokens scored in one pass")
    ax.set_ylabel("time per pass (ms)" if unit == 1e-3 else f"time per pass ({unit:g} s)")
    ax.legend(fontsize=7, loc=legend)
    ax.grid(alpha=0.3)


def plot_pass_curves(views: Mapping[str, dict], ax=None, unit: float = 1e-3):
    """Several measured curves of one model on one machine (e.g. two kernels), over the model's roofline.

    `views` maps a label to what `roofline_view` returns with `measured`; they must share the
    token counts and the roofline (the same weights, FLOPs, bandwidth and peak), which is drawn
    once. Each measured curve is labelled ``"measured: <label>"``. Returns the Axes.
    """
    if not views:
        raise ValueError("views must hold at least one measured curve")
    first = next(iter(views.values()))
    for label, view in views.items():
        if "measured" not in view:
            raise ValueError(f"view {label!r} has no measured times: pass measured= to roofline_view")
        if not (np.array_equal(view["tokens"], first["tokens"]) and np.allclose(view["roofline"], first["roofline"])):
            raise ValueError(f"view {label!r} has another roofline or other token counts than the first view")
    ax = _axes(ax)
    T = first["tokens"]
    _draw_roofline(ax, first, unit)
    styles = [("o-", "#3b75af"), ("^-", "#e07b39"), ("v-", "#8e44ad"), ("D-", "#555555")]
    for i, (label, view) in enumerate(views.items()):
        marker, color = styles[i % len(styles)]
        ax.plot(T, view["measured"] / unit, marker, color=color, label=f"measured: {label}")
    top = max(float(v["measured"].max()) for v in views.values())
    _finish_pass_axes(ax, T, 1.15 * max(top, float(first["roofline"].max())), unit, "upper left")
    return ax


def domain_view(values: dict[str, Sequence[float]], agree: dict[str, Sequence[bool]]) -> dict[str, np.ndarray | list]:
    """Per kind of text: its name, how many positions, mean beta and greedy agreement (nb 08's bars)."""
    names = [n for n in values if len(values[n])]
    if set(names) - set(agree) or any(len(values[n]) != len(agree[n]) for n in names):
        raise ValueError("values and agree must hold the same kinds, with one entry per position each")
    return {
        "names": names,
        "n": np.array([len(values[n]) for n in names]),
        "beta": np.array([float(np.mean(values[n])) for n in names]),
        "agree": np.array([float(np.mean(agree[n])) for n in names]),
    }


def plot_acceptance_by_domain(view: dict, ax=None):
    """Bars per kind of text: mean beta (sampling) and greedy agreement, with the positions counted. Returns the Axes."""
    ax = _axes(ax)
    x = np.arange(len(view["names"]))
    w = 0.38
    ax.bar(x - w / 2, view["beta"], w, color="#3b75af", label="sampling: mean beta = sum min(p, q)")
    ax.bar(x + w / 2, view["agree"], w, color="#ef8636", label="greedy: argmax p = argmax q")
    ax.set_xticks(x, [f"{name}\n({n} positions)" for name, n in zip(view["names"], view["n"])])
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("acceptance")
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    ax.grid(alpha=0.3, axis="y")
    return ax


# -- notebook 07: speculation under load ------------------------------------------------------------

def batch_view(results: dict, name: str = "greedy") -> dict:
    """A batch benchmark's results (benchmarks/results/batch_cpu.json) for one temperature, as arrays.

    batch_sizes [nB], ks [nk] (k > 0), measured and predicted speedup [nB, nk], held_out [nB]
    (the batch sizes the model was not fitted to), the measured and modelled crossovers,
    and the policy's k and its throughput against plain and the best fixed k per B.
    """
    from ..perf.costmodel import CostModel  # perf sits below course: a lazy import keeps plots light

    if name not in results["cost_models"]:
        raise ValueError(f"name must be one of {sorted(results['cost_models'])}, got {name!r}")
    temperature = 0.0 if name == "greedy" else float(name.split()[-1])
    runs = {(r["batch_size"], r["k"]): r for r in results["runs"] if r["temperature"] == temperature}
    Bs = sorted({B for B, _ in runs})
    ks = sorted({k for _, k in runs if k})
    cross = results["crossover"][name]
    policy = [p for p in results["policy"] if p["temperature"] == temperature]
    return {
        "name": name, "batch_sizes": np.array(Bs), "ks": np.array(ks), "alpha": cross["alpha"],
        "model": CostModel.from_dict(results["cost_models"][name]), "new_tokens": results["meta"]["new_tokens"],
        "measured": np.array([[runs[(B, k)]["speedup"] for k in ks] for B in Bs]),
        "predicted": np.array([[runs[(B, k)]["predicted"] for k in ks] for B in Bs]),
        "held_out": np.array([bool(runs[(B, ks[0])].get("held_out", False)) for B in Bs]),
        "plain_tokens_per_s": np.array([runs[(B, 0)]["tokens_per_s"] for B in Bs]),
        "tokens_per_s": np.array([[runs[(B, k)]["tokens_per_s"] for k in ks] for B in Bs]),
        "crossover_measured": {int(k): v for k, v in cross["measured"].items()},
        "crossover_predicted": {int(k): v for k, v in cross["predicted"].items()},
        "policy_k": np.array([p["k"] for p in policy]), "policy_vs_plain": np.array([p["vs_plain"] for p in policy]),
        "policy_vs_best": np.array([p["vs_best"] for p in policy]), "margin": cross.get("margin", 0.0),
    }


def load_view(model, alpha: float, k: int, batch_sizes: Sequence[int], new_tokens: int) -> dict:
    """Predicted tokens per second over the batch, plain and at this k, and the speedup, at each batch size."""
    Bs = np.array([int(B) for B in batch_sizes])
    if len(Bs) == 0:
        raise ValueError("batch_sizes must hold at least one batch size")
    plain = np.array([B / model.plain_time(int(B)) for B in Bs])
    speed = np.array([model.run_speedup(alpha, k, int(B), new_tokens) for B in Bs])
    return {"batch_sizes": Bs, "k": int(k), "alpha": float(alpha), "plain": plain, "speculative": plain * speed,
            "speedup": speed}


def plot_pass_times(passes: Sequence[dict], model, context: int, ax=None, unit: float = 1e-3):
    """Measured pass times at one context against tokens per pass B x T, one colour per B, and the model's lines."""
    ax = _axes(ax)
    rows = [r for r in passes if r["context"] == context]
    Bs = sorted({r["batch_size"] for r in rows})
    colours = [f"C{i % 10}" for i in range(len(Bs))]
    for B, col in zip(Bs, colours):
        sel = sorted((r for r in rows if r["batch_size"] == B), key=lambda r: r["n_tokens"])
        T = np.array([r["n_tokens"] for r in sel])
        ax.plot(B * T, [r["median_s"] / unit for r in sel], "o", ms=3, color=col, label=f"B = {B}")
        ax.plot(B * T, np.asarray(model(B, T, context)) / unit, "-", lw=1, color=col)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per pass, B x T (T = k + 1 when verifying)")
    ax.set_ylabel("ms per pass")
    ax.set_title(f"one target pass after {context} cached tokens: measured (dots), fit (lines)", fontsize=9)
    ax.legend(fontsize=6, ncol=3)
    ax.grid(alpha=0.3)
    return ax


def plot_batch_speedup(view: dict, ax=None):
    """Speedup against B per k: measured (dots; held-out B hollow), modelled (lines), measured crossover marked."""
    ax = _axes(ax)
    Bs = view["batch_sizes"]
    for j, k in enumerate(view["ks"]):
        col = f"C{j}"
        ax.plot(Bs, view["predicted"][:, j], "-", color=col, lw=1)
        ax.plot(Bs[~view["held_out"]], view["measured"][~view["held_out"], j], "o", color=col, label=f"k = {k}")
        ax.plot(Bs[view["held_out"]], view["measured"][view["held_out"], j], "o", mfc="none", color=col)
        B_star = view["crossover_measured"].get(int(k))
        if B_star is not None:
            ax.axvline(B_star, color=col, ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    return _batch_axes(ax, "speedup over plain decoding",
                       f"{view['name']}: measured (dots, hollow = held out), model (lines), crossover (dotted)")


def _batch_axes(ax, ylabel: str, title: str):
    """Notebook 07's axes: batch size on a log2 x axis, a small title and legend, a light grid."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax


def plot_load_view(view: dict, measured: dict | None = None, ax=None):
    """Predicted throughput against B, plain and at the view's k; measured points (B -> tokens/s) drawn on it."""
    ax = _axes(ax)
    ax.plot(view["batch_sizes"], view["plain"], "-", color="0.4", label="plain, model")
    ax.plot(view["batch_sizes"], view["speculative"], "-", color="C0", label=f"k = {view['k']}, model")
    if measured:
        for key, (style, lab) in {"plain": ("s", "plain, measured"), "speculative": ("o", "k, measured")}.items():
            pts = measured.get(key, {})
            ax.plot(list(pts), list(pts.values()), style, color="0.4" if key == "plain" else "C0", mfc="none",
                    label=lab)
    ax.set_yscale("log")
    return _batch_axes(ax, "tokens per second over the batch", f"alpha = {view['alpha']:.2f}, k = {view['k']}")


def crossover_view(models: dict, alphas: Sequence[float], ks: Sequence[int], batch_sizes: Sequence[int]) -> dict:
    """Notebook 03's E / (v + c k) against the batch size, for each cost model, alpha and k, and where it drops below 1.

    `models` maps a name to a `specref.perf.CostModel`. Returns `batch_sizes` [nB] and `curves`: one dict per
    (model name, alpha, k) with `name`, `alpha`, `k`, `speedup` [nB] (`CostModel.predict_speedup`) and `crossover`
    (`specref.perf.costmodel.crossover_batch`: the first batch size that loses, None up to its search limit).
    """
    from ..perf.costmodel import crossover_batch  # perf sits below course: a lazy import keeps plots light

    Bs = np.array([int(B) for B in batch_sizes])
    if Bs.ndim != 1 or len(Bs) == 0 or (Bs < 1).any():
        raise ValueError(f"batch_sizes must hold at least one batch size >= 1, got {list(batch_sizes)!r}")
    if not models or not alphas or not ks:
        raise ValueError("models, alphas and ks must each hold at least one entry")
    curves = [{"name": name, "alpha": float(a), "k": int(k),
               "speedup": np.array([m.predict_speedup(float(a), int(k), int(B)) for B in Bs]),
               "crossover": crossover_batch(float(a), int(k), m)}
              for name, m in models.items() for a in alphas for k in ks]
    return {"batch_sizes": Bs, "curves": curves}


def plot_crossover(view: dict, ax=None):
    """Speedup against the batch size, one line per curve of `crossover_view`, each crossover marked on the 1x line.

    Lines of one model share a line style; colours follow alpha or k, whichever varies. Returns the Axes.
    """
    ax = _axes(ax)
    Bs, curves = view["batch_sizes"], view["curves"]
    names = list(dict.fromkeys(c["name"] for c in curves))
    vary_alpha = len({c["alpha"] for c in curves}) > 1
    keys = sorted({c["alpha"] if vary_alpha else c["k"] for c in curves})
    styles = ["-", "--", ":", "-."]
    for c in curves:
        key = c["alpha"] if vary_alpha else c["k"]
        colour = f"C{keys.index(key) % 10}"
        label = f"{c['name']}, " + (f"alpha {c['alpha']:.2f}, k = {c['k']}" if vary_alpha else f"k = {c['k']}")
        ax.plot(Bs, c["speedup"], styles[names.index(c["name"]) % len(styles)], color=colour, label=label)
        if c["crossover"] is not None and Bs[0] <= c["crossover"] <= Bs[-1]:
            ax.plot([c["crossover"]], [1.0], "v", color=colour, ms=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Bs, [str(int(B)) for B in Bs])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("predicted speedup E / (v + c k)")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    return ax


def plot_pass_grid(grid: Sequence[dict], fit, context: int, ax=None, unit: float = 1e-3):
    """Measured target passes against rows per pass B x T (median, range of the repeats), one colour per T, with the
    fitted model's line for each T.

    `grid` holds `specref.perf.live.pass_rows`' rows (`batch_size`, `n_tokens`, `seconds`, `low`, `high`); `fit` is
    the `specref.perf.PassModel` fitted to them, evaluated at `context` cached tokens. Returns the Axes.
    """
    if not grid:
        raise ValueError("grid must hold at least one measured pass")
    ax = _axes(ax)
    Bs = np.arange(1, max(r["batch_size"] for r in grid) + 1)
    for i, T in enumerate(sorted({r["n_tokens"] for r in grid})):
        rows = [r for r in grid if r["n_tokens"] == T]
        bars = np.array([[r["seconds"] - r["low"], r["high"] - r["seconds"]] for r in rows]).T / unit  # [2, n]
        ax.errorbar([r["batch_size"] * T for r in rows], [r["seconds"] / unit for r in rows], yerr=bars, fmt="o",
                    ms=4, color=f"C{i}", label=f"T = {T} new token(s) per row")
        ax.plot(Bs * T, np.asarray(fit(Bs, T, context)) / unit, "-", lw=1, color=f"C{i}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rows per pass, B x T")
    ax.set_ylabel("ms per target pass")
    ax.set_title(f"one target pass: median, range of the repeats; lines: the {fit.form} fit", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax


def plot_runs_against_model(model, alpha: float, ks: Sequence[int], batch_sizes: Sequence[int],
                            measured: Mapping[int, Sequence[float]], predicted: Mapping[int, float], k_measured: int,
                            ax=None):
    """The model's predicted speedup E / (v + c k) against the batch size for each k (lines), with decoding runs
    timed at `k_measured`: each batch size's repeats (`measured`: B -> the repeats' speedups; median and range drawn)
    and the model's prediction for that run as counted (`predicted`: B -> speedup, a cross). Returns the Axes.
    """
    Bs = [int(B) for B in batch_sizes]
    if not Bs or not ks:
        raise ValueError("batch_sizes and ks must each hold at least one entry")
    if set(predicted) != set(measured):
        raise ValueError(f"measured and predicted must cover the same batch sizes, got {sorted(measured)} and "
                         f"{sorted(predicted)}")
    ax = _axes(ax)
    for i, k in enumerate(ks):
        ax.plot(Bs, [model.predict_speedup(alpha, int(k), B) for B in Bs], "-", color=f"C{i}",
                label=f"model, k = {k}")
    colour = f"C{list(ks).index(k_measured)}" if k_measured in ks else "k"
    for n, (B, repeats) in enumerate(sorted(measured.items())):
        mid = float(np.median(repeats))
        ax.errorbar([B], [mid], yerr=[[mid - min(repeats)], [max(repeats) - mid]], fmt="o", color=colour,
                    label=f"measured, k = {k_measured}" if n == 0 else None)
        ax.plot([B], [predicted[B]], "x", color=colour, ms=8, label="model, for the run as counted" if n == 0 else None)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(Bs, [str(B) for B in Bs])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax
