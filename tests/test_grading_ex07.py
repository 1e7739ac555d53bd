"""Exercise 7's graders (specref.course.grading.batch): choose_k from a cost table, and batch 256 by day, 8 at night.

The reference is an exhaustive search; every broken policy below is one a learner could
write, and each must fail with its own hint, on the visible seed and on the hidden one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specref.course.grading import batch as G
from specref.perf.costmodel import choose_k as specref_choose_k
from specref.perf.costmodel import h100_cost_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from grade_scan import scan  # noqa: E402


def E(alpha: float, k: int) -> float:
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def reference(alpha, B, table, k_max=8):
    return max(range(k_max + 1), key=lambda k: B * E(alpha, k) / (table["pass_s"][B][k] + k * table["draft_s"][B]))


def largest_on_ties(alpha, B, table, k_max=8):
    tp = [B * E(alpha, k) / (table["pass_s"][B][k] + k * table["draft_s"][B]) for k in range(k_max + 1)]
    top = max(tp)
    return max(k for k, x in enumerate(tp) if x >= top * (1 - 1e-12))


def never_off(alpha, B, table, k_max=8):
    return max(range(1, k_max + 1), key=lambda k: E(alpha, k) / (table["pass_s"][B][k] + k * table["draft_s"][B]))


def no_draft_cost(alpha, B, table, k_max=8):
    return max(range(k_max + 1), key=lambda k: E(alpha, k) / table["pass_s"][B][k])


def verify_costs_one_step(alpha, B, table, k_max=8):
    return max(range(k_max + 1), key=lambda k: E(alpha, k) / (table["pass_s"][B][0] + k * table["draft_s"][B]))


def edits_the_table(alpha, B, table, k_max=8):
    table["pass_s"][B][0] *= 1.0000001
    return reference(alpha, B, table, k_max)


@pytest.mark.parametrize("seed, n", [(0, 40), (1, 200)])  # the exercise's visible and hidden tests
def test_the_reference_and_a_largest_k_tie_break_pass(seed, n):
    G.check_choose_k(reference, n_cases=n, seed=seed)
    G.check_choose_k(largest_on_ties, n_cases=n, seed=seed)  # ties are fair: any best k counts


def test_the_cases_hold_real_ties_and_the_hidden_tables_are_not_the_visible_ones():
    cases = G._cases(200, 1)
    assert sum(len(G.best_ks(t, a, B, km)) > 1 for _, t, a, B, km in cases) >= 2
    assert len(G.best_ks(*cases[3][1:4], 8)) == 9  # alpha = 0, nothing costs: every k is best
    visible = [c[1] for c in G._cases(40, 0)[6:]]
    assert all(c[1] not in visible for c in cases[6:])
    assert {reference(a, B, t, km) for _, t, a, B, km in cases} >= {0, 1, 8}  # answers span off, short and long


@pytest.mark.parametrize("fn, hint", [
    (never_off, "compare every k > 0 with k = 0"),
    (no_draft_cost, "k draft steps"),
    (verify_costs_one_step, "use pass_s[B][k], not pass_s[B][0]"),
    (lambda a, B, t, km=8: float(reference(a, B, t, km)) + 0.5, "return one integer k"),
    (lambda a, B, t, km=8: reference(a, B, t, km) + 1, "k must be in 0..k_max"),
    (edits_the_table, "changed the table in place"),
])
@pytest.mark.parametrize("seed, n", [(0, 40), (1, 200)])
def test_broken_policies_fail_with_their_hint(fn, hint, seed, n):
    with pytest.raises(AssertionError, match="check_choose_k: wrong answer") as e:
        G.check_choose_k(fn, n_cases=n, seed=seed)
    assert hint in str(e.value)


def test_exhaustive_search_on_the_h100_table_agrees_with_specrefs_choose_k():
    table, model = G.h100_table(), h100_cost_model()
    for alpha in (0.0, 0.6, 0.8, 0.95):
        for B in G.BATCH_SIZES:
            assert specref_choose_k(alpha, B, model) in G.best_ks(table, alpha, B, 8)
    assert reference(0.8, 256, table) == 0 and reference(0.8, 8, table) == 8


def test_day_and_night_grader_passes_the_answer_and_flags_the_swapped_pair():
    def answer(table, alpha):
        return tuple(reference(alpha, B, table, len(table["pass_s"][B]) - 1) for B in (256, 8))

    G.check_day_and_night(answer, n_cases=40, seed=1)
    with pytest.raises(AssertionError, match="day \\(batch 256\\): expected k in \\[0\\], got 8"):
        G.check_day_and_night(lambda t, a: answer(t, a)[::-1])
    with pytest.raises(AssertionError, match="pair of integers"):
        G.check_day_and_night(lambda t, a: answer(t, a)[0])


def test_an_answer_that_calls_specrefs_choose_k_is_flagged():
    source = ("def choose_k(alpha, batch_size, table, k_max=8):\n"
              "    from specref import choose_k as ref\n    return ref(alpha, batch_size, None, k_max)\n")
    assert [f.kind for f in scan(source)] == ["reference"]
    solution = json.loads((ROOT / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    answers = [c for c in solution["cells"] if c["metadata"].get("nbgrader", {}).get("solution")
               and c["cell_type"] == "code"]
    assert answers and all(scan("".join(c["source"])) == [] for c in answers)  # the solution itself is clean


@pytest.mark.slow
def test_grade_py_withholds_the_points_of_an_answer_that_uses_specref(tmp_path):
    nb = json.loads((ROOT / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    nb["metadata"]["specref"] = {"exercise": "ex07_load_aware_k"}
    for c in nb["cells"]:
        if c["metadata"].get("nbgrader", {}).get("grade_id") == "ex07_choose_k_answer":
            c["source"] = ("from specref import choose_k as _ref\n"
                           "from specref.perf.costmodel import CostModel\n\n"
                           "def choose_k(alpha, batch_size, table, k_max=8):\n"
                           "    return max(range(k_max + 1), key=lambda k: batch_size * ((1 - alpha ** (k + 1)) "
                           "/ (1 - alpha) if alpha < 1 else k + 1) / (table['pass_s'][batch_size][k] + k * "
                           "table['draft_s'][batch_size]))\n")
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(nb))
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "grade.py"), str(path), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    report = json.loads(done.stdout)
    tests = {t["grade_id"]: t for t in report["tests"]}
    check = tests["ex07_choose_k_check"]
    assert check["score"] == 0 and any("specref" in f for f in check["flags"])


def test_an_answer_that_hard_codes_the_visible_tables_passes_them_and_fails_the_hidden_ones():
    memo = {(a, B, km, tuple(t["pass_s"][B]), t["draft_s"][B]): reference(a, B, t, km)
            for _, t, a, B, km in G._cases(40, 0)}  # what a learner could copy from the visible check's output

    def hard_coded(alpha, B, table, k_max=8):
        return memo.get((alpha, B, k_max, tuple(table["pass_s"][B]), table["draft_s"][B]), k_max)

    G.check_choose_k(hard_coded)  # the visible check alone cannot tell
    with pytest.raises(AssertionError, match="check_choose_k: wrong answer"):
        G.check_choose_k(hard_coded, n_cases=200, seed=1)  # the hidden test can


def test_a_hard_coded_day_and_night_pair_fails():
    for pair in ((0, 8), (8, 8), (0, 0), (1, 4)):
        with pytest.raises(AssertionError, match="check_day_and_night: wrong answer"):
            G.check_day_and_night(lambda t, a, pair=pair: pair)
