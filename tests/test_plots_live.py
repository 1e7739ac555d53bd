"""Notebook 07's live plots (specref.course.plots): measured passes against a fit, runs against the model."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specref.course.plots import plot_pass_grid, plot_runs_against_model  # noqa: E402
from specref.perf.costmodel import CostModel, PassModel  # noqa: E402


def _grid() -> list[dict]:
    model = PassModel.roofline(1e6, 1e9, 1e12, 2, efficiency=1.0, overhead=1e-3)
    rows = []
    for B in (1, 2, 4):
        for T in (1, 5):
            t = float(model(B, T, 8))
            rows.append({"batch_size": B, "n_tokens": T, "context": 8, "seconds": t, "low": 0.9 * t, "high": 1.2 * t})
    return rows


def test_pass_grid_draws_each_measured_pass_with_its_range_and_a_fit_line_per_t() -> None:
    grid = _grid()
    fit = PassModel.fit(grid)
    fig, ax = plt.subplots()
    plot_pass_grid(grid, fit, 8, ax)
    bars = [c for c in ax.containers]  # one errorbar container per T
    assert len(bars) == 2
    xs = sorted(x for c in bars for x in c.lines[0].get_xdata())
    assert xs == sorted(r["batch_size"] * r["n_tokens"] for r in grid)
    ys = sorted(y for c in bars for y in c.lines[0].get_ydata())
    assert ys == pytest.approx(sorted(r["seconds"] * 1e3 for r in grid))
    assert fit.form in ax.get_title()
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one"):
        plot_pass_grid([], fit, 8)


def test_runs_against_model_draws_the_model_per_k_and_each_run_at_its_median() -> None:
    target = PassModel.roofline(1e6, 1e9, 1e12, 2, efficiency=1.0, overhead=1e-3)
    model = CostModel(target, PassModel.roofline(1e5, 1e9, 1e12, 2, overhead=1e-4), context=8)
    Bs = [1, 2, 4, 8]
    measured = {1: [1.2, 1.5, 1.4], 4: [0.8, 0.9, 1.1]}
    fig, ax = plt.subplots()
    plot_runs_against_model(model, 0.7, (1, 4), Bs, measured, {1: 1.3, 4: 0.95}, 4, ax)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["model, k = 4"].get_ydata()) == [model.predict_speedup(0.7, 4, B) for B in Bs]
    medians = sorted(y for c in ax.containers for y in c.lines[0].get_ydata())
    assert medians == [float(np.median(measured[4])), float(np.median(measured[1]))]
    plt.close(fig)
    with pytest.raises(ValueError, match="the same batch sizes"):
        plot_runs_against_model(model, 0.7, (4,), Bs, measured, {1: 1.3}, 4)
