"""specref.course.widgets, driven without a browser: move a slider, read the numbers and the picture."""

import numpy as np
import pytest
import torch

from specref.checks.exact import one_step_distribution
from specref.checks.montecarlo import verify_skip_residual
from specref.course.plots import accept_reject_view, speedup_curves
from specref.course.widgets import accept_reject_widget, format_accept_reject, format_speedup, speedup_widget


def test_accept_reject_widget_starts_on_the_worked_case():
    w = accept_reject_widget()
    assert w.view["beta"] == pytest.approx(0.7)
    np.testing.assert_allclose(w.view["residual"], [1, 0, 0], atol=1e-12)
    assert "beta = 0.700" in w.summary.value
    assert w.figure.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_moving_a_p_slider_redraws_and_the_output_follows_p():
    w = accept_reject_widget()
    before_text, before_png = w.summary.value, w.figure.value
    w.p_sliders[2].value = 0.7
    np.testing.assert_allclose(w.view["p"], [0.6 / 1.6, 0.3 / 1.6, 0.7 / 1.6])
    np.testing.assert_allclose(w.view["output"], w.view["p"], atol=1e-12)
    np.testing.assert_allclose(w.view["rule_output"], w.view["p"], atol=1e-12)
    assert w.summary.value != before_text
    assert w.figure.value != before_png


def test_moving_a_q_slider_changes_beta_but_not_the_output():
    w = accept_reject_widget()
    p_before = w.view["p"].copy()
    w.q_sliders[0].value = 0.0
    # q = (0, 0.6, 0.1) / 0.7, so beta = min(0.6, 0) + min(0.3, 0.857) + min(0.1, 0.143) = 0.4.
    assert w.view["beta"] == pytest.approx(0.4)
    np.testing.assert_allclose(w.view["rule_output"], p_before, atol=1e-12)
    assert "verify_chain emits p: <b>yes</b>" in w.summary.value


def test_summary_says_no_when_the_rule_does_not_emit_p():
    view = accept_reject_view((0.6, 0.3, 0.1), (0.3, 0.6, 0.1))
    # What a rule that skips the residual would emit: p itself after a rejection.
    broken = one_step_distribution(torch.tensor(view["p"]), torch.tensor(view["q"]), rule=verify_skip_residual)
    view["rule_output"] = broken.numpy()
    assert "verify_chain emits p: <b>NO</b>" in format_accept_reject(view, ["a", "b", "c"])


def test_equal_sliders_accept_every_draft():
    w = accept_reject_widget(p=(0.5, 0.2, 0.2, 0.1), q=(0.1, 0.1, 0.4, 0.4))
    with w.held():
        for ps, qs in zip(w.p_sliders, w.q_sliders):
            qs.value = ps.value
    assert "beta = 1.000" in w.summary.value
    np.testing.assert_allclose(w.view["residual_mass"], np.zeros(4), atol=1e-15)
    assert (w.view["residual_mass"] >= 0).all()
    assert np.isfinite(w.view["residual"]).all()


def test_any_slider_setting_keeps_the_rule_output_equal_to_p():
    w = accept_reject_widget()
    g = np.random.default_rng(0)
    for _ in range(12):
        with w.held():
            # Zeros are common slider positions (a token the target or the draft rules out).
            for s in w.p_sliders + w.q_sliders:
                s.value = float(g.choice([0.0, 0.01, round(float(g.uniform()), 2), 1.0]))
            w.p_sliders[0].value = max(w.p_sliders[0].value, 0.01)
            w.q_sliders[0].value = max(w.q_sliders[0].value, 0.01)
        np.testing.assert_allclose(w.view["rule_output"], w.p, atol=1e-12)
        assert "verify_chain emits p: <b>yes</b>" in w.summary.value


def test_a_side_with_no_weight_shows_a_message_until_it_gets_weight():
    w = accept_reject_widget()
    with w.held():
        for s in w.q_sliders:
            s.value = 0.0
    assert w.view is None
    assert "at least one token" in w.summary.value
    w.q_sliders[1].value = 0.5
    assert w.view["beta"] == pytest.approx(0.3)  # q is one-hot on b: accept w.p. p(b)


def test_sliders_say_which_distribution_and_token_they_set():
    w = accept_reject_widget(labels=["the", "a", "an"])
    assert [s.description for s in w.p_sliders] == ["p(the)", "p(a)", "p(an)"]
    assert [s.description for s in w.q_sliders] == ["q(the)", "q(a)", "q(an)"]
    assert "<td>the</td>" in w.summary.value


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p": (0.5, 0.5), "q": (0.2, 0.3, 0.5)}, "same tokens"),
        ({"p": (1.0,), "q": (1.0,)}, "2 to 6 tokens"),
        ({"labels": ["a", "b"]}, "labels"),
        ({"q": (0.0, 0.0, 0.0)}, "q must put weight"),
    ],
)
def test_accept_reject_widget_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        accept_reject_widget(**kwargs)


def test_speedup_widget_starts_on_the_chapter_example():
    w = speedup_widget()
    text = w.summary.value
    assert "k = 4</b>: E[tokens per step] = 3.36, speedup = 2.80x" in text
    assert "best k = 8" in text
    assert w.figure.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_costlier_draft_moves_the_best_k_down_in_the_widget():
    w = speedup_widget()
    before_png = w.figure.value
    w.c_slider.value = 0.15
    assert w.curves["optimal_k"] == 5
    assert "best k = 5" in w.summary.value
    assert w.figure.value != before_png


def test_k_slider_picks_the_row_that_is_reported():
    w = speedup_widget()
    with w.held():
        w.alpha_slider.value = 0.6
        w.k_slider.value = 3
    assert "k = 3</b>: E[tokens per step] = 2.18" in w.summary.value


def test_zero_acceptance_says_drafting_does_not_pay():
    w = speedup_widget()
    w.alpha_slider.value = 0.0
    assert w.curves["optimal_k"] == 0
    assert "does not pay" in w.summary.value


def test_held_redraws_once_after_several_slider_moves():
    w = accept_reject_widget()
    before = w.summary.value
    with w.held():
        w.p_sliders[0].value = 0.1
        w.q_sliders[0].value = 0.1
        assert w.summary.value == before  # nothing redrawn yet
    assert w.view["p"][0] == pytest.approx(0.1 / 0.5)
    assert w.summary.value != before


def test_speedup_sliders_name_their_quantity():
    w = speedup_widget()
    assert w.alpha_slider.description.startswith("alpha")
    assert w.k_slider.description.startswith("k ")
    assert w.c_slider.description.startswith("c ")
    assert w.k_slider.max == w.k_max


def test_format_speedup_reports_the_requested_k():
    curves = speedup_curves(0.8, 0.05, k_max=10)
    assert "k = 2</b>: E[tokens per step] = 2.44, speedup = 2.22x" in format_speedup(curves, 2)


@pytest.mark.parametrize("kwargs, match", [({"k": 20}, "k must be in"), ({"alpha": 1.5}, "alpha"), ({"c": -0.1}, "c must")])
def test_speedup_widget_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        speedup_widget(**kwargs)


def _batch_view():
    import json
    from pathlib import Path

    from specref.course.plots import batch_view

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "batch_cpu.json"
    return batch_view(json.loads(path.read_text()), "greedy")


def test_load_widget_reports_the_models_speedup_and_the_policys_k():
    from specref.course.widgets import load_widget
    from specref.perf.costmodel import choose_k

    view = _batch_view()
    w = load_widget(view, B=1, k=4)
    s = view["model"].run_speedup(view["alpha"], 4, 1, view["new_tokens"])
    assert f"predicted speedup <b>{s:.2f}x</b>" in w.summary.value
    assert w.policy_k == choose_k(view["alpha"], 1, view["model"], margin=view["margin"], new_tokens=view["new_tokens"])
    png = w.figure.value
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w.batch_slider.value = 256
    assert "B = 256" in w.summary.value and "speculation loses" in w.summary.value and w.policy_k == 0
    assert w.figure.value != png
    with pytest.raises(ValueError, match="measured batch sizes"):
        load_widget(view, B=3)


def test_load_widget_k_and_alpha_sliders_move_the_prediction():
    from specref.course.widgets import load_widget

    view = _batch_view()
    w = load_widget(view, B=1, k=4, alpha=0.8)
    before = w.view["speedup"].copy()
    w.alpha_slider.value = 0.4
    assert w.view["alpha"] == pytest.approx(0.4) and (w.view["speedup"] < before).all()  # fewer accepted drafts
    w.k_slider.value = 2
    assert w.view["k"] == 2 and "k = 2" in w.summary.value
    assert w.view["speedup"].tolist() == [view["model"].run_speedup(0.4, 2, int(B), view["new_tokens"])
                                          for B in view["batch_sizes"]]


@pytest.mark.parametrize("kwargs, match", [({"k": 0}, "k must be"), ({"k": 9}, "k must be"), ({"k": 2.0}, "k must be"),
                                           ({"alpha": 0.99}, "alpha must be"), ({"alpha": "0.8"}, "alpha must be")])
def test_load_widget_rejects_values_its_sliders_cannot_show(kwargs, match):
    from specref.course.widgets import load_widget

    with pytest.raises(ValueError, match=match):
        load_widget(_batch_view(), B=8, **kwargs)
