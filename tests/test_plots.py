"""specref.course.plots: the numbers behind the pictures, and that the pictures draw those numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from specref.course.plots import (
    accept_reject_view,
    crossover_view,
    jensen_view,
    normalize_weights,
    plot_accept_reject,
    plot_acceptance_spread,
    plot_crossover,
    plot_jensen,
    plot_speedup_curves,
    speedup_curves,
)
from specref.theory import expected_tokens_per_step, speedup

P = (0.6, 0.3, 0.1)
Q = (0.3, 0.6, 0.1)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _random_pairs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        V = int(torch.randint(2, 7, (1,), generator=g))
        # Cubing makes some tokens nearly 0 and zeroing makes some exactly 0: the sparse cases.
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        q[torch.rand(V, generator=g) < 0.2] = 0
        q[0] += 1e-3
        yield p / p.sum(), q / q.sum()


def test_worked_case_gives_beta_07_and_residual_on_the_first_token():
    view = accept_reject_view(P, Q)
    assert view["beta"] == pytest.approx(0.7, abs=1e-12)
    np.testing.assert_allclose(view["residual"], [1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(view["accepted"], [0.3, 0.3, 0.1], atol=1e-12)
    np.testing.assert_allclose(view["residual_mass"], [0.3, 0, 0], atol=1e-12)


def test_accepted_plus_residual_mass_equals_p_for_random_pairs():
    for p, q in _random_pairs(200):
        view = accept_reject_view(p, q)
        np.testing.assert_allclose(view["output"], p.numpy(), atol=1e-12)
        np.testing.assert_allclose(view["accepted"] + view["residual_mass"], view["output"], atol=0)


def test_verify_chain_emits_p_exactly_for_random_pairs():
    for p, q in _random_pairs(40, seed=2):
        view = accept_reject_view(p, q)
        np.testing.assert_allclose(view["rule_output"], p.numpy(), atol=1e-12)


def test_beta_is_the_total_accepted_mass():
    for p, q in _random_pairs(50, seed=1):
        view = accept_reject_view(p, q)
        assert view["accepted"].sum() == pytest.approx(view["beta"], abs=1e-12)


def test_equal_p_and_q_accept_everything_without_nan():
    view = accept_reject_view(P, P)
    assert view["beta"] == pytest.approx(1.0, abs=1e-12)
    assert np.isfinite(view["residual"]).all()
    np.testing.assert_allclose(view["residual_mass"], np.zeros(3), atol=1e-15)
    np.testing.assert_allclose(view["output"], P, atol=1e-12)


def test_one_hot_p_and_q_reduce_to_the_greedy_rule():
    argmax, other = torch.eye(3, dtype=torch.float64)[0], torch.eye(3, dtype=torch.float64)[2]
    match = accept_reject_view(argmax, argmax)
    assert match["beta"] == 1.0
    mismatch = accept_reject_view(argmax, other)
    assert mismatch["beta"] == 0.0
    np.testing.assert_array_equal(mismatch["residual"], argmax.numpy())  # the correction is the target's argmax


def test_view_does_not_modify_its_inputs():
    p = torch.tensor(P, dtype=torch.float64)
    q = torch.tensor(Q, dtype=torch.float64)
    view = accept_reject_view(p, q)
    view["p"][0] = 123.0
    assert p.tolist() == list(P) and q.tolist() == list(Q)


@pytest.mark.parametrize(
    "p, q, match",
    [
        ((0.6, 0.3, 0.1), (0.5, 0.5), "same shape"),
        ((0.6, 0.3, 0.2), Q, "p rows must sum to 1"),
        (P, (0.5, 0.6, -0.1), "q has negative"),
        (((0.5, 0.5), (0.5, 0.5)), ((0.5, 0.5), (0.5, 0.5)), "p must be one distribution"),
    ],
)
def test_view_rejects_bad_distributions_naming_the_argument(p, q, match):
    with pytest.raises(ValueError, match=match):
        accept_reject_view(p, q)


def test_view_rejects_non_numbers_with_type_error():
    with pytest.raises(TypeError, match="p must be"):
        accept_reject_view(["x", "y"], Q[:2])


def test_normalize_weights_scales_to_a_distribution_keeping_ratios():
    w = normalize_weights([2.0, 1.0, 1.0])
    np.testing.assert_allclose(w, [0.5, 0.25, 0.25])


@pytest.mark.parametrize("weights, match", [([0, 0, 0], "at least one"), ([1, -1], ">= 0"), ([], "non-empty")])
def test_normalize_weights_rejects_unusable_weights(weights, match):
    with pytest.raises(ValueError, match=match):
        normalize_weights(weights, "q")


def test_speedup_curves_reproduce_the_chapter_table():
    curves = speedup_curves(0.8, 0.05, k_max=10)
    assert round(float(curves["tokens_per_step"][4]), 2) == 3.36
    assert round(float(curves["speedup"][4]), 1) == 2.8
    assert curves["optimal_k"] == 8
    assert curves["best_speedup"] == pytest.approx(float(curves["speedup"].max()))


def test_speedup_curves_agree_with_theory_at_every_k():
    curves = speedup_curves(0.6, 0.1, k_max=12)
    ks = np.arange(13)
    np.testing.assert_array_equal(curves["k"], ks)
    np.testing.assert_allclose(curves["tokens_per_step"], expected_tokens_per_step(0.6, ks))
    np.testing.assert_allclose(curves["speedup"], speedup(0.6, ks, 0.1))
    assert round(float(curves["tokens_per_step"][3]), 2) == 2.18


def test_costlier_drafts_never_move_the_best_k_up():
    best = [speedup_curves(0.8, c, k_max=16)["optimal_k"] for c in np.linspace(0.0, 0.5, 26)]
    assert all(a >= b for a, b in zip(best, best[1:]))
    assert best[0] > best[-1]


def test_no_acceptance_means_no_speculation_pays():
    curves = speedup_curves(0.0, 0.05, k_max=8)
    assert curves["optimal_k"] == 0
    np.testing.assert_allclose(curves["tokens_per_step"], np.ones(9))


@pytest.mark.parametrize("k_max", [0, -1, 2.5, True])
def test_speedup_curves_reject_bad_k_max(k_max):
    with pytest.raises(ValueError, match="k_max"):
        speedup_curves(0.8, 0.05, k_max=k_max)


def test_speedup_curves_reject_alpha_outside_zero_one():
    with pytest.raises(ValueError, match="alpha"):
        speedup_curves(1.2, 0.05)


def test_accept_reject_bars_stack_to_p():
    view = accept_reject_view(P, Q)
    ax = plot_accept_reject(view)
    # Bars are drawn in order: q, accepted, residual mass (3 each).
    heights = np.array([patch.get_height() for patch in ax.patches]).reshape(3, 3)
    bottoms = np.array([patch.get_y() for patch in ax.patches]).reshape(3, 3)
    np.testing.assert_allclose(heights[0], Q)
    np.testing.assert_allclose(bottoms[2], heights[1])
    np.testing.assert_allclose(heights[1] + heights[2], P, atol=1e-12)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]


def test_accept_reject_plot_rejects_wrong_number_of_labels():
    with pytest.raises(ValueError, match="labels"):
        plot_accept_reject(accept_reject_view(P, Q), labels=["a", "b"])


def test_speedup_plot_marks_the_best_and_the_chosen_k():
    curves = speedup_curves(0.8, 0.15, k_max=12)
    ax_e, ax_s = plot_speedup_curves(curves, k=2)
    labels = [line.get_label() for line in ax_s.get_lines()]
    assert f"best k = {curves['optimal_k']}" in labels and "chosen k = 2" in labels
    star = ax_s.get_lines()[labels.index(f"best k = {curves['optimal_k']}")]
    assert list(star.get_xdata()) == [curves["optimal_k"]]
    assert list(star.get_ydata()) == pytest.approx([curves["best_speedup"]])


def test_acceptance_spread_marks_the_weighted_mean():
    ax = plot_acceptance_spread([0.2, 0.9], weights=[3, 1])
    mean_line = ax.get_lines()[0]
    assert mean_line.get_xdata()[0] == pytest.approx(0.375)


def test_acceptance_spread_needs_one_weight_per_context():
    with pytest.raises(ValueError, match="one entry per context"):
        plot_acceptance_spread([0.2, 0.9], weights=[1, 1, 1])


def test_jensen_view_averages_alpha_and_tokens_with_the_same_weights():
    view = jensen_view([0.95, 0.45], [1, 1], k=4)
    assert view["mean_alpha"] == pytest.approx(0.7)
    assert view["f_of_mean"] == pytest.approx(float(expected_tokens_per_step(0.7, 4)))
    mean_of_f = (expected_tokens_per_step(0.95, 4) + expected_tokens_per_step(0.45, 4)) / 2
    assert view["mean_of_f"] == pytest.approx(mean_of_f)


def test_varying_alpha_yields_more_tokens_than_its_average_jensen():
    g = np.random.default_rng(0)
    for _ in range(100):
        alphas, weights = g.uniform(0, 1, 5), g.uniform(0.1, 1, 5)
        view = jensen_view(alphas, weights, k=int(g.integers(1, 9)))
        assert view["mean_of_f"] >= view["f_of_mean"] - 1e-12


def test_constant_alpha_has_no_jensen_gap():
    view = jensen_view([0.6, 0.6, 0.6], None, k=3)
    assert view["mean_of_f"] == pytest.approx(view["f_of_mean"])
    assert round(view["f_of_mean"], 2) == 2.18


def test_jensen_plot_puts_the_mean_of_f_above_the_curve():
    ax = plot_jensen([0.95, 0.45], None, k=4)
    points = {line.get_label().split(" =")[0]: line.get_ydata()[0] for line in ax.get_lines()[1:]}
    assert points["mean of E(alpha_c)"] > points["E(mean alpha)"]


def test_roofline_is_the_larger_of_memory_and_compute_time():
    from specref.course.plots import roofline_view

    # 1 GB of weights at 1 GB/s is 1 s; 1 GFLOP per token at 4 GFLOP/s is 0.25 s per token.
    view = roofline_view(1e9, 1e9, 1e9, 4e9, [1, 2, 4, 8, 16])
    assert view["memory_time"] == pytest.approx(1.0)
    np.testing.assert_allclose(view["compute_time"], [0.25, 0.5, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(view["roofline"], [1.0, 1.0, 1.0, 2.0, 4.0])


def test_roofline_overhead_is_what_the_measurement_adds_beyond_it():
    from specref.course.plots import roofline_view

    view = roofline_view(1e9, 1e9, 1e9, 4e9, [1, 8], measured=[3.0, 4.0])
    np.testing.assert_allclose(view["overhead"], [2.0, 2.0])
    np.testing.assert_allclose(view["explained"], [1 / 3, 0.5])


@pytest.mark.parametrize("kw, match", [
    ({"bandwidth": 0.0}, "bandwidth"),
    ({"peak_flops": -1.0}, "peak_flops"),
    ({"token_counts": [0, 1]}, "token_counts"),
    ({"measured": [1.0]}, "measured"),
])
def test_roofline_view_rejects_unusable_inputs(kw, match):
    from specref.course.plots import roofline_view

    args = {"weight_bytes": 1e6, "flops_per_token": 2e6, "bandwidth": 1e9, "peak_flops": 1e10,
            "token_counts": [1, 2]} | kw
    with pytest.raises(ValueError, match=match):
        roofline_view(**args)


def test_roofline_plot_draws_the_measured_curve_over_the_prediction():
    from specref.course.plots import plot_roofline, roofline_view

    view = roofline_view(1e6, 2e6, 1e9, 1e10, [1, 2, 4], measured=[0.003, 0.0031, 0.0033])
    ax = plot_roofline(view)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "measured" in labels and "roofline: max(memory, compute)" in labels
    measured = ax.get_lines()[labels.index("measured")]
    np.testing.assert_allclose(measured.get_ydata(), [3.0, 3.1, 3.3])


def test_pass_curves_draw_each_measured_curve_over_one_roofline():
    from specref.course.plots import plot_pass_curves, roofline_view

    views = {kernel: roofline_view(1e6, 2e6, 1e9, 1e10, [1, 2, 4], measured=m)
             for kernel, m in [("fast", [0.003, 0.0031, 0.0033]), ("slow", [0.003, 0.005, 0.008])]}
    ax = plot_pass_curves(views)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels.count("roofline: max(memory, compute)") == 1
    slow = ax.get_lines()[labels.index("measured: slow")]
    np.testing.assert_allclose(slow.get_ydata(), [3.0, 5.0, 8.0])


def test_pass_curves_refuse_views_of_different_rooflines():
    from specref.course.plots import plot_pass_curves, roofline_view

    with pytest.raises(ValueError, match="roofline"):
        plot_pass_curves({"a": roofline_view(1e6, 2e6, 1e9, 1e10, [1, 2], measured=[1.0, 1.0]),
                          "b": roofline_view(2e6, 2e6, 1e9, 1e10, [1, 2], measured=[1.0, 1.0])})
    with pytest.raises(ValueError, match="measured"):
        plot_pass_curves({"a": roofline_view(1e6, 2e6, 1e9, 1e10, [1, 2])})


# -- notebook 07 --------------------------------------------------------------------------------------------

def _batch_results() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "batch_cpu.json").read_text())


def test_batch_view_reads_the_speedups_and_the_held_out_batch_sizes_from_the_results():
    from specref.course.plots import batch_view

    results = _batch_results()
    view = batch_view(results, "greedy")
    runs = {(r["batch_size"], r["k"]): r for r in results["runs"] if r["temperature"] == 0}
    i, j = list(view["batch_sizes"]).index(128), list(view["ks"]).index(4)
    assert view["measured"][i, j] == pytest.approx(runs[(128, 0)]["seconds"] / runs[(128, 4)]["seconds"])
    assert view["predicted"][i, j] == runs[(128, 4)]["predicted"]
    assert view["held_out"].tolist() == [bool(x % 2) for x in range(len(view["batch_sizes"]))]  # every other one
    assert len(view["policy_k"]) == len(view["batch_sizes"])
    with pytest.raises(ValueError, match="name must be one of"):
        batch_view(results, "temperature 0.5")


def test_load_view_is_the_models_run_speedup_and_k_zero_is_plain():
    from specref.course.plots import batch_view, load_view

    view = batch_view(_batch_results(), "greedy")
    model, Bs = view["model"], [1, 8, 256]
    lv = load_view(model, 0.8, 4, Bs, 64)
    assert lv["speedup"].tolist() == [model.run_speedup(0.8, 4, B, 64) for B in Bs]
    np.testing.assert_allclose(lv["speculative"], lv["plain"] * lv["speedup"])
    np.testing.assert_allclose(load_view(model, 0.8, 0, Bs, 64)["speculative"], lv["plain"])
    with pytest.raises(ValueError, match="at least one"):
        load_view(model, 0.8, 4, [], 64)


def test_batch_plots_draw_the_measured_points_and_the_model():
    from specref.course.plots import batch_view, load_view, plot_batch_speedup, plot_load_view, plot_pass_times

    results = _batch_results()
    view = batch_view(results, "greedy")
    ax = plot_batch_speedup(view)
    dots = [line for line in ax.get_lines() if line.get_label() == "k = 4"][0]
    np.testing.assert_allclose(dots.get_ydata(), view["measured"][~view["held_out"], list(view["ks"]).index(4)])
    plt.close(ax.figure)
    from specref import CostModel

    grid = CostModel.from_dict(results["grid_model"]).target
    ax = plot_pass_times(results["passes"], grid, 64)
    assert len(ax.get_lines()) == 2 * len(results["meta"]["batch_sizes"])  # dots and a fitted line per B
    plt.close(ax.figure)
    lv = load_view(view["model"], 0.8, 4, [1, 2], 64)
    ax = plot_load_view(lv, {"plain": {1: 100.0, 2: 180.0}})
    measured = [line for line in ax.get_lines() if line.get_label() == "plain, measured"][0]
    assert measured.get_ydata().tolist() == [100.0, 180.0]
    plt.close(ax.figure)


def test_crossover_view_is_the_cost_models_speedup_and_its_first_loss():
    from specref.perf.costmodel import crossover_batch, h100_cost_model

    h100 = h100_cost_model()
    view = crossover_view({"H100": h100}, [0.8], [1, 4, 8], [1, 8, 64, 128, 256])
    assert [c["k"] for c in view["curves"]] == [1, 4, 8]
    for c in view["curves"]:
        assert np.allclose(c["speedup"], [h100.predict_speedup(0.8, c["k"], B) for B in view["batch_sizes"]],
                           rtol=1e-12)
        assert c["crossover"] == crossover_batch(0.8, c["k"], h100)
    # The chapter's claim the plot shows: a longer draft stops paying at a smaller batch (75 for k = 4 at 40 %).
    cross = [c["crossover"] for c in view["curves"]]
    assert cross == sorted(cross, reverse=True) and cross[1] == 75


def test_crossover_view_moves_the_crossover_down_as_alpha_falls():
    from specref.perf.costmodel import h100_cost_model

    view = crossover_view({"H100": h100_cost_model()}, [0.6, 0.8, 0.9], [4], [1, 16, 256])
    cross = [c["crossover"] for c in view["curves"]]
    assert cross[0] < cross[1] < cross[2]


@pytest.mark.parametrize("kw, match", [({"batch_sizes": []}, "batch_sizes"), ({"batch_sizes": [0, 4]}, "batch_sizes"),
                                       ({"alphas": []}, "alphas")])
def test_crossover_view_rejects_empty_or_bad_inputs(kw, match):
    from specref.perf.costmodel import h100_cost_model

    args = {"models": {"H100": h100_cost_model()}, "alphas": [0.8], "ks": [4], "batch_sizes": [1, 2]} | kw
    with pytest.raises(ValueError, match=match):
        crossover_view(**args)


def test_crossover_plot_draws_one_line_per_curve_and_marks_each_crossover():
    from specref.perf.costmodel import h100_cost_model

    view = crossover_view({"H100": h100_cost_model(), "H100 at peak": h100_cost_model(efficiency=1.0)}, [0.8], [2, 4],
                          [1, 2, 4, 8, 16, 32, 64, 128, 256])
    fig, ax = plt.subplots()
    plot_crossover(view, ax)
    markers = [ln for ln in ax.get_lines() if ln.get_marker() == "v"]
    assert len([ln for ln in ax.get_lines() if len(ln.get_xdata()) == 9]) == 4
    assert len(markers) == sum(c["crossover"] is not None and c["crossover"] <= 256 for c in view["curves"])
    plt.close(fig)
