"""Exercise 7's graders (specref_grading.checks.batch): a fitted pass-time model, its speedup and crossover, and a
load-aware k judged on the true costs.

The reference answers below are the solution's; every wrong answer is one a learner could write (an unweighted
fit, a design without the KV term, the chapter's v = 1 formula, the first losing batch size, no margin, a
constant), and each must fail, on the visible checks and on hidden ones at other seeds. One-line cheats (a
constant, a call of specref.perf, a formula from the task's text) fail too, and so does an untouched stub, with
a message that names its task.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from specref_grading.checks import batch as G

ROOT = Path(__file__).resolve().parents[1]


# -- the solution's answers ---------------------------------------------------------------------


def fit_pass_time(rows):
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    X = np.stack([np.ones_like(t), B * T, B * S], axis=1)
    return np.linalg.lstsq(X / t[:, None], np.ones_like(t), rcond=None)[0]


def speedup(params, alpha, c, context, k, batch_size):
    def pass_time(B, T):
        return params[0] + params[1] * B * T + params[2] * B * context

    tokens = k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    plain = pass_time(batch_size, 1)
    return tokens * plain / (pass_time(batch_size, k + 1) + k * c * plain)


def crossover(params, alpha, c, context, k, b_max):
    return max((B for B in range(1, b_max + 1) if speedup(params, alpha, c, context, k, B) > 1), default=0)


def load_aware_k(rows, alpha, c, context, batch_sizes, k_max):
    """The solution's policy (bootstrap refits, 10th percentile of each k's speedup), vectorised for speed."""
    a = np.asarray(rows, dtype=np.float64)
    rng = np.random.default_rng(0)
    fits = np.array([fit_pass_time(a)] + [fit_pass_time(a[rng.integers(0, len(a), len(a))]) for _ in range(100)])
    o, per_token, kv = fits.T  # [F] each
    B = np.asarray(batch_sizes, dtype=np.float64)[:, None, None]  # [nB, 1, 1]
    k = np.arange(k_max + 1)[None, :, None]  # [1, K, 1]
    tokens = k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    plain = o + per_token * B + kv * B * context  # [nB, 1, F]
    spd = tokens * plain / (o + per_token * B * (k + 1) + kv * B * context + k * c * plain)  # [nB, K, F]
    low = np.quantile(spd, 0.1, axis=2)  # [nB, K]
    best = low.argmax(axis=1)
    return [int(b) if low[i, b] > 1 else 0 for i, b in enumerate(best)]


def solution_policy(rows, alpha, c, context, batch_sizes, k_max):
    """The notebook's loop form of the same policy."""
    a = np.asarray(rows, dtype=np.float64)
    rng = np.random.default_rng(0)
    fits = [fit_pass_time(a)] + [fit_pass_time(a[rng.integers(0, len(a), len(a))]) for _ in range(100)]
    ks = []
    for B in batch_sizes:
        low = [np.quantile([speedup(f, alpha, c, context, k, B) for f in fits], 0.1) for k in range(k_max + 1)]
        best = int(np.argmax(low))
        ks.append(best if low[best] > 1 else 0)
    return ks


def learner(source: str, name: str):
    """A function as a learner's notebook defines it: the answer cell's code run in a `__main__` namespace."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)  # noqa: S102 - the tests' own cheat submissions
    return namespace[name]


def quiet(check, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        check(*args, **kwargs)


# -- Task 1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_solutions_fit_passes_the_visible_and_hidden_checks(seed):
    quiet(G.check_fit, fit_pass_time)
    quiet(G.check_fit_unseen, fit_pass_time, seed=seed)


def test_the_tolerance_holds_a_correct_fit_at_far_more_than_the_checks_draw():
    # 300 tables of each kind: the worst coefficient of a correct fit stays well inside its tolerance, so a
    # check of 4 or 12 tables does not fail an honest learner by chance.
    rng = np.random.default_rng(12)
    worst = 0.0
    for make in (G._visible_table, G._unseen_table):
        for _ in range(300):
            theta, rows, sigma = make(rng)
            worst = max(worst, float((np.abs(fit_pass_time(rows) - theta) / G.fit_tolerance(theta, rows, sigma)).max()))
    assert worst < 0.8


def unweighted(rows):  # least squares in seconds: the slowest passes decide
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    return np.linalg.lstsq(np.stack([np.ones_like(t), B * T, B * S], 1), t, rcond=None)[0]


def no_kv_term(rows):  # the design without the cache reads
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    c = np.linalg.lstsq(np.stack([np.ones_like(t), B * T], 1) / t[:, None], np.ones_like(t), rcond=None)[0]
    return [c[0], c[1], 0.0]


def per_row_not_per_token(rows):  # per_token multiplying B instead of B * T
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    return np.linalg.lstsq(np.stack([np.ones_like(t), B, B * S], 1) / t[:, None], np.ones_like(t), rcond=None)[0]


@pytest.mark.parametrize("wrong", [unweighted, no_kv_term, per_row_not_per_token, lambda rows: [3e-3, 80e-6, 5e-8]],
                         ids=["unweighted", "no_kv_term", "per_row", "constant"])
def test_a_wrong_weighting_design_or_constant_fails_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_fit: table"):
        quiet(G.check_fit, wrong)
    for seed in (1, 2, 3):
        with pytest.raises(AssertionError, match="check_fit_unseen: table"):
            quiet(G.check_fit_unseen, wrong, seed=seed)


def test_the_unweighted_fit_fails_a_large_share_of_tables_on_its_own():
    # Not one unlucky table: the unweighted fit misses the tolerance on about 4 tables in 10.
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(200):
        theta, rows, sigma = G._unseen_table(rng)
        misses += bool((np.abs(unweighted(rows) - theta) > G.fit_tolerance(theta, rows, sigma)).any())
    assert misses >= 50


def test_a_fit_that_calls_specref_scores_zero_and_says_why():
    cheat = learner("from specref.perf.costmodel import PassModel\n\n"
                    "def cheat(rows):\n"
                    "    m = PassModel.fit(rows, form='sum')\n"
                    "    return [m.overhead, m.per_token, m.kv]\n", "cheat")

    with pytest.raises(AssertionError, match=r"Task 1: your cheat uses specref\.perf\.costmodel\.PassModel"):
        G.check_fit(cheat)


def test_an_untouched_stub_names_its_task():
    def fit_pass_time(rows):
        raise NotImplementedError("Task 1: write fit_pass_time (see the task above)")

    with pytest.raises(NotImplementedError, match="^Task 1 is not done yet: write fit_pass_time"):
        G.check_fit(fit_pass_time)


def test_feedback_shows_the_input_and_output_but_not_the_true_coefficients():
    with pytest.raises(AssertionError) as e:
        quiet(G.check_fit, unweighted)
    text = str(e.value)
    theta = G._visible_table(np.random.default_rng(0))[0]
    assert "rows:" in text and "your fit:" in text and "overhead" in text
    assert all(f"{x:.4g}" not in text for x in theta)


# -- Task 2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_the_solutions_speedup_and_crossover_pass(seed):
    quiet(G.check_speedup, speedup)
    quiet(G.check_speedup_unseen, speedup, seed=seed)
    quiet(G.check_crossover, crossover)
    quiet(G.check_crossover_unseen, crossover, seed=seed)


def chapter_formula(params, alpha, c, context, k, batch_size):  # verification as cheap as a step: E / (1 + c k)
    tokens = k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (1 + c * k)


def draft_cost_left_out(params, alpha, c, context, k, batch_size):
    return speedup(params, alpha, 0.0, context, k, batch_size)


@pytest.mark.parametrize("wrong", [chapter_formula, draft_cost_left_out, lambda *a: 1.0],
                         ids=["chapter_formula", "no_draft_cost", "constant"])
def test_wrong_speedups_fail_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_speedup: case"):
        quiet(G.check_speedup, wrong)
    with pytest.raises(AssertionError, match="check_speedup_unseen: case"):
        quiet(G.check_speedup_unseen, wrong, seed=4)


def first_losing_batch(params, alpha, c, context, k, b_max):  # off by one: where k starts to lose
    return next((B for B in range(1, b_max + 1) if speedup(params, alpha, c, context, k, B) < 1), b_max)


@pytest.mark.parametrize("wrong", [first_losing_batch, lambda *a: 16, lambda p, a, c, S, k, b: float(crossover(p, a, c, S, k, b))],
                         ids=["first_loss", "constant", "float"])
def test_wrong_crossovers_fail_visible_and_hidden(wrong):
    with pytest.raises(AssertionError, match="check_crossover: case"):
        quiet(G.check_crossover, wrong)
    with pytest.raises(AssertionError, match="check_crossover_unseen: case"):
        quiet(G.check_crossover_unseen, wrong, seed=4)


def test_the_crossover_is_fair_at_a_near_tie():
    theta = G.SERVER
    b = crossover(theta, 0.8, 0.05, 256, 4, 4096)
    assert G.crossover_ok(theta, 0.8, 0.05, 256, 4, 4096, b)
    assert not G.crossover_ok(theta, 0.8, 0.05, 256, 4, 4096, b + 1)
    assert not G.crossover_ok(theta, 0.8, 0.05, 256, 4, 4096, b - 1)
    assert G.crossover_ok(theta, 0.0, 0.05, 256, 4, 64, 0)  # alpha = 0: k never pays


def test_speedup_cheats_that_call_specref_score_zero():
    cheat = learner("from specref.perf.costmodel import CostModel, PassModel\n\n"
                    "def cheat(params, alpha, c, context, k, batch_size):\n"
                    "    target = PassModel(overhead=params[0], per_token=params[1], kv=params[2])\n"
                    "    return CostModel(target, c, context).predict_speedup(alpha, k, batch_size)\n", "cheat")

    with pytest.raises(AssertionError, match="Task 2: your cheat uses specref.perf"):
        G.check_speedup(cheat)


# -- Task 3 ---------------------------------------------------------------------------------------


def test_the_solutions_policy_passes_visible_and_hidden():
    quiet(G.check_policy, load_aware_k)
    for seed in (1, 2):
        quiet(G.check_policy_unseen, load_aware_k, seed=seed)


@pytest.mark.parametrize("wrong, why", [
    (lambda rows, a, c, S, Bs, km: [0] * len(Bs), "on average over the batch sizes"),
    (lambda rows, a, c, S, Bs, km: [min(4, km)] * len(Bs), "never fall below 0.9x plain"),
    (lambda rows, a, c, S, Bs, km: [km + 1] * len(Bs), "one integer k in 0..k_max"),
    (lambda rows, a, c, S, Bs, km: [1] * (len(Bs) - 1), "one integer k in 0..k_max"),
], ids=["always_off", "fixed_k4", "out_of_range", "too_short"])
def test_constant_policies_fail_visible_and_hidden(wrong, why):
    with pytest.raises(AssertionError, match="check_policy: table") as e:
        quiet(G.check_policy, wrong)
    assert why in str(e.value)
    with pytest.raises(AssertionError, match="check_policy_unseen: table"):
        quiet(G.check_policy_unseen, wrong, seed=3)


def test_a_margin_that_refuses_every_gain_fails():
    def timid(rows, alpha, c, context, batch_sizes, k_max):  # speculate only on a predicted 3x
        p = fit_pass_time(rows)
        out = []
        for B in batch_sizes:
            k = max(range(k_max + 1), key=lambda k: speedup(p, alpha, c, context, k, B))
            out.append(k if speedup(p, alpha, c, context, k, B) > 3 else 0)
        return out

    with pytest.raises(AssertionError, match="on average over the batch sizes"):
        quiet(G.check_policy, timid)


def test_the_policy_is_judged_on_the_true_costs():
    # The judgement itself: on the true model a fixed k = 8 at batch 512 loses, and the best k everywhere scores 1.
    theta = G.SERVER
    sp, share = G.policy_outcome(theta, 0.8, 0.05, 256, (8, 512), 8, [8, 8])
    assert sp[1] < G.SAFE and share[1] < 1
    best = [max(range(9), key=lambda k: speedup(theta, 0.8, 0.05, 256, k, B)) for B in (8, 512)]
    assert np.allclose(G.policy_outcome(theta, 0.8, 0.05, 256, (8, 512), 8, best)[1], 1.0)


def test_a_policy_that_calls_specrefs_choose_k_scores_zero():
    cheat = learner("import specref.perf.costmodel as cm\n\n"
                    "def cheat(rows, alpha, c, context, batch_sizes, k_max):\n"
                    "    model = cm.CostModel(cm.PassModel.fit(rows, form='sum'), c, context)\n"
                    "    return [cm.choose_k(alpha, B, model, k_max) for B in batch_sizes]\n", "cheat")

    with pytest.raises(AssertionError, match="Task 3: your cheat uses specref.perf"):
        G.check_policy(cheat)


# -- the notebook -----------------------------------------------------------------------------------


def test_the_server_table_asks_a_real_day_and_night_question():
    rows = G.server_rows()
    assert load_aware_k(rows, 0.8, 0.05, 256, G.POLICY_BATCHES, 8) == solution_policy(rows, 0.8, 0.05, 256,
                                                                                       G.POLICY_BATCHES, 8)
    assert load_aware_k(rows, 0.8, 0.05, 256, [256, 8], 8) == [0, 4]  # off by day, drafting at night
    assert len(rows) == 90 and all(isinstance(r[3], float) and r[3] > 0 for r in rows)


def test_the_setup_imports_nothing_that_solves_a_task_and_no_docstring_gives_a_formula():
    nb = json.loads((ROOT / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    setup = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "specref.perf" not in setup and "specref.theory" not in setup
    imported = setup.split("import (")[-1] if "import (" in setup else setup.split("batch import")[1].split("\n")[0]
    assert {n.strip() for n in imported.split(",")} == {"check_crossover", "check_fit", "check_policy",
                                                        "check_speedup"}
    given = "".join([c for c in nb["cells"] if c["cell_type"] == "code"][1]["source"])
    assert "from specref.course.server import server_rows" in given  # the table, in a learner's copy too
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    for formula in ("1 - alpha ** (k + 1)", "(1 - alpha^(k+1))", "E / (v + c k)", "/ t[:, None]"):
        outside = [c for c in nb["cells"] if formula in "".join(c["source"]) and "### BEGIN SOLUTION" not in "".join(c["source"])]
        assert not outside, formula
    first_answer = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    before = "\n".join("".join(c["source"]) for c in nb["cells"][:first_answer] if c["cell_type"] == "code")
    assert "HIDDEN_SEED = 1" in before and text.count("seed=HIDDEN_SEED") == 4  # the setup may span cells


def test_the_graders_speedup_grid_is_specrefs_cost_model():
    from specref.perf.costmodel import CostModel, PassModel

    rng = np.random.default_rng(3)
    for _ in range(20):
        theta = G._unseen_table(rng)[0]
        alpha, c, S = float(rng.uniform(0, 1)), float(rng.uniform(0, 0.5)), int(rng.integers(0, 1000))
        batches = [1, 7, 64, 300]
        grid = G.speedup_grid(theta, alpha, c, S, batches, 9)
        model = CostModel(PassModel(overhead=theta[0], per_token=theta[1], kv=theta[2]), c, S)
        want = [[model.predict_speedup(alpha, k, B) for k in range(10)] for B in batches]
        assert np.allclose(grid, want, rtol=1e-12, atol=0)


def test_crossover_feedback_names_the_property_not_the_answer():
    one_short = lambda p, a, c, S, k, b: max(crossover(p, a, c, S, k, b) - 1, 0)  # noqa: E731
    for wrong, said in ((first_losing_batch, "does not beat plain decoding at batch"),
                        (one_short, "still beats plain decoding at batch")):
        with pytest.raises(AssertionError) as e:
            quiet(G.check_crossover, wrong)
        text = str(e.value)
        assert said in text and "your crossover:" in text and "speedup at" not in text
