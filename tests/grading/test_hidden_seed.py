"""The hidden seed: the hidden tests' cases follow a seed the grader draws, never one the kernel can read or set.

A learner who has read solutions/ knows HIDDEN_SEED = 1 and could learn the hidden cases by heart: with another seed
those answers fail, while a correct answer still gets full marks, and no answer can rebind the seed, because the
grader binds it inside the test cell itself. A failing hidden case prints its inputs (by design), so a seed used
twice for one learner leaks its cases: one grading (``python -m specref_grading.grade``, ``make grade``) draws a
fresh seed each time unless ``--seed N`` asks for one, and a class run draws one per submission graded
(test_class_run.py). The hidden tests and the seed never reach the kernel.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specref_grading import grade as grader
from specref_grading import plan as grade_plan
from specref_grading.checks import batch as G
from specref_grading.exercises import BEGIN_HIDDEN, END_HIDDEN

from .conftest import REPO, answer, attacked, grade, make_exercise, solved, toy_solution

pytestmark = pytest.mark.grader


SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))


HIDDEN = re.compile(re.escape(BEGIN_HIDDEN) + "(.*?)" + re.escape(END_HIDDEN), re.S)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("value, want", [("7", 7), (7, 7), ("1", 1), (" 12 ", 12), (2**31 - 1, 2**31 - 1),
                                         (2**63 - 1, 2**63 - 1)])
def test_hidden_seed_reads_an_integer_of_at_least_one(value, want):
    assert grade_plan.hidden_seed(value) == want


@pytest.mark.parametrize("value", ["0", 0, "-3", "x", "1.5", 2**63, True, None])
def test_hidden_seed_refuses_anything_else_and_says_what_is_allowed(value):
    with pytest.raises(grade_plan.GradeError, match="--seed must be"):
        grade_plan.hidden_seed(value)


def test_a_random_seed_is_a_valid_seed_and_differs_between_draws():
    seeds = {grade_plan.hidden_seed("random") for _ in range(4)}
    assert all(1 <= s < 2**63 for s in seeds) and len(seeds) > 1


def test_a_random_seed_has_63_bits_too_many_to_try_offline():
    # A seed below 2**32 is brute-forced from what a check shows; 63 bits fall below 2**32 with odds 2**-31 per draw.
    seeds = [grade_plan.hidden_seed("random") for _ in range(64)]
    assert all(2**32 <= s < 2**63 for s in seeds)
    assert max(seeds) >= 2**60  # drawn from the whole range, not a narrower one


def _seeds_main_grades_with(monkeypatch, tmp_path, *args: str, times: int = 3) -> list[int]:
    """The seed `python -m specref_grading.grade NB *args` hands to grade(), `times` runs (grade() stubbed)."""
    path = tmp_path / "learner.ipynb"
    path.write_text("{}")
    seen: list[int] = []

    def fake_grade(notebook, solution, solutions_dir, cell_timeout, run_timeout, seed, memory_mb, unjailed):
        assert unjailed is ("--unjailed" in args)  # an unjailed grading only when asked for
        seen.append(seed)
        return grader.Report(str(notebook), exercise="ex_toy", seed=seed)

    monkeypatch.setattr(grader, "grade", fake_grade)
    for _ in range(times):
        assert grader.main([str(path), *args]) == 0
    return seen


def test_one_grading_draws_a_fresh_seed_each_time_unless_one_is_asked_for(monkeypatch, tmp_path, capsys):
    seeds = _seeds_main_grades_with(monkeypatch, tmp_path)
    assert len(set(seeds)) == 3 and all(2**32 <= s < 2**63 for s in seeds), seeds  # never the solutions' 1
    assert f"hidden seed {seeds[-1]}" in capsys.readouterr().out  # the report names it, so it can be reproduced
    assert _seeds_main_grades_with(monkeypatch, tmp_path, "--seed", "7", times=2) == [7, 7]
    assert _seeds_main_grades_with(monkeypatch, tmp_path, "--seed", "random", times=2)[0] != 1


def test_make_grade_passes_no_seed_unless_asked():
    """make grade used to default to seed 1, the solutions' own: now it leaves the default (random) to the grader."""
    import shutil
    if shutil.which("make") is None:
        pytest.skip("no make")
    dry = lambda *a: subprocess.run(["make", "-n", "-s", "grade", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=REPO, timeout=60).stdout
    line = next(ln for ln in dry("NB=x.ipynb").splitlines() if "specref_grading.grade" in ln)
    assert "--seed" not in line, line
    assert "--seed '5'" in dry("NB=x.ipynb", "SEED=5") or "--seed 5" in dry("NB=x.ipynb", "SEED=5")


def test_with_seed_binds_hidden_seed_only_in_cells_that_read_it():
    cell = "check(f)\n### BEGIN HIDDEN TESTS\ncheck(f, seed=HIDDEN_SEED)\n### END HIDDEN TESTS"
    assert grade_plan.with_seed(cell, 5) == "HIDDEN_SEED = 5\n" + cell
    assert grade_plan.with_seed("check(f)", 5) == "check(f)"
    assert grade_plan.with_seed("# HIDDEN_SEED in a comment only\ncheck(f)", 5).startswith("# HIDDEN_SEED")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_seeded_hidden_test_follows_the_graders_seed(path):
    # No hidden test passes a literal seed (it would ignore --seed), and a solution whose hidden tests read
    # HIDDEN_SEED sets it, before its first answer cell, to the grader's default: so the solution run as a
    # notebook (nbval) checks the very cases the grader draws by default.
    cells = _cells(path)
    hidden = [m for c in cells for m in HIDDEN.findall(_src(c))]
    literal = [h.strip() for h in hidden if re.search(r"\bseed\s*=\s*\d", h)]
    assert not literal, f"hidden tests with a literal seed: {literal}"
    if not any("HIDDEN_SEED" in h for h in hidden):
        return
    first_answer = next(i for i, c in enumerate(cells) if c["metadata"].get("nbgrader", {}).get("solution"))
    bound = [node.value for c in cells[:first_answer] if c["cell_type"] == "code"
             for node in ast.parse(_src(c)).body
             if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["HIDDEN_SEED"]]
    assert [ast.literal_eval(v) for v in bound] == [grade_plan.DEFAULT_HIDDEN_SEED]


def _submission(answer_source: str) -> dict:
    nb = json.loads((REPO / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    nb["metadata"]["specref"] = {"exercise": "ex07_load_aware_k"}
    for c in nb["cells"]:
        if c["metadata"].get("nbgrader", {}).get("grade_id") == "ex07_fit_answer":
            c["source"] = answer_source
    return nb


def test_the_plan_binds_the_seed_inside_each_test_cell_after_every_answer():
    # An answer that rebinds HIDDEN_SEED (to 0: the visible cases) changes nothing: the test cell binds it again.
    nb = _submission("HIDDEN_SEED = 0\n\ndef fit_pass_time(rows):\n    return [0.0, 0.0, 0.0]\n")
    solution = json.loads((REPO / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    plan = grade_plan.build_plan(solution, nb, "ex07_load_aware_k.ipynb", seed=9)
    tests = [c for c in plan.cells if c["role"] == "test"]
    assert plan.seed == 9 and tests
    assert all(c["source"].startswith("HIDDEN_SEED = 9\n") for c in tests if "HIDDEN_SEED" in c["source"])
    assert sum("HIDDEN_SEED" in c["source"] for c in tests) == 4  # the fit, v(k, B), the crossover, the policy
    default = grade_plan.build_plan(solution, nb, "ex07_load_aware_k.ipynb")
    assert default.seed == grade_plan.DEFAULT_HIDDEN_SEED == 1


def _memorising_answer() -> str:
    # Every table the visible fit check (seed 0) and the solutions' hidden one (seed 1) ask about, with its true
    # coefficients, written into the answer as a table: no fit at all, only a lookup by the first row's time.
    memo = {}
    rng = np.random.default_rng(0)
    tables = [G._visible_table(rng) for _ in range(4)]
    rng = np.random.default_rng([1, 71])
    tables += [G._unseen_table(rng) for _ in range(12)]
    for theta, rows, _sigma in tables:
        memo[repr(float(rows[0, 3]))] = [float(x) for x in theta]
    return (f"MEMO = {memo!r}\n\n"
            "def fit_pass_time(rows):\n"
            "    return MEMO.get(repr(float(rows[0][3])), [0.0, 0.0, 0.0])\n")


def _grade(tmp_path: Path, nb: dict, *args: str) -> dict:
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(nb))
    done = subprocess.run([sys.executable, "-I", "-m", "specref_grading.grade", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_answers_learned_by_heart_pass_the_solutions_seed_and_fail_another(tmp_path):
    check = "ex07_fit_check"
    memorised = _submission(_memorising_answer())
    at_default = _grade(tmp_path, memorised, "--seed", "1")  # the solutions' seed, asked for
    assert at_default["seed"] == 1
    assert {t["grade_id"]: t["outcome"] for t in at_default["tests"]}[check] == "passed"  # the leak is real
    at_seven = _grade(tmp_path, memorised, "--seed", "7")
    assert at_seven["seed"] == 7
    assert {t["grade_id"]: t["outcome"] for t in at_seven["tests"]}[check] == "failed"
    solution = json.loads((REPO / "solutions" / "ex07_load_aware_k.ipynb").read_text())
    solution["metadata"]["specref"] = {"exercise": "ex07_load_aware_k"}
    honest = _grade(tmp_path, solution, "--seed", "7")
    assert honest["total"] == honest["possible"] > 0, honest


def test_grade_py_refuses_a_bad_seed_before_grading(tmp_path):
    done = subprocess.run([sys.executable, "-I", "-m", "specref_grading.grade", str(tmp_path / "none.ipynb"),
                           "--seed", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--seed must be in [1, 2**63)" in done.stderr


def test_the_hidden_tests_and_seed_never_reach_the_kernel(toy):
    """The old kernel held the test cells, hidden tests and `HIDDEN_SEED = N` included, in its own memory. The
    checks' cell (the toy's check_double, ``metadata.specref.side == "checks"``) runs in the trusted process only."""
    sol_dir, _, _ = toy
    sol = toy_solution()
    test = answer(sol, "double_check")
    test["source"] = test["source"].replace("xs=(10, -7.5)", "xs=(HIDDEN_SEED % 97, -7.5)")
    (sol_dir / "ex_toy.ipynb").write_text(json.dumps(sol))
    exercise = make_exercise(sol)
    probe = ('import sys\n'
             'seen = []\n'
             'def walk(o, depth=0):\n'
             '    if depth > 8:\n'
             '        return\n'
             '    if isinstance(o, str):\n'
             '        if "HIDDEN" + "_SEED" in o and "check" + "_double" in o:\n'
             '            seen.append(o)\n'
             '    elif isinstance(o, dict):\n'
             '        for v in list(o.values()):\n'
             '            walk(v, depth + 1)\n'
             '    elif isinstance(o, (list, tuple)):\n'
             '        for v in list(o):\n'
             '            walk(v, depth + 1)\n'
             'for m in list(sys.modules.values()):\n'
             '    walk(getattr(m, "__dict__", {}))\n'
             'spaces = [globals()] + [getattr(m, "__dict__", {}) for m in list(sys.modules.values())]\n'
             'checks = [d for d in spaces if "check" + "_double" in d]\n'
             'raise ValueError("found: " + repr(seen)[:3000] + " checks: " + repr(len(checks)))\n')
    code, report, out = grade(attacked(exercise, probe), toy, "alice.ipynb", "--seed", "918273")
    assert report and report["seed"] == 918273, out
    assert "found: [] checks: 0" in json.dumps(report["tests"]), json.dumps(report["tests"])[:3000]
    assert "918273" not in json.dumps(report["tests"]), json.dumps(report["tests"])[:3000]


def test_a_fresh_seed_is_drawn_and_reported(toy):
    sol_dir, sub_dir, _ = toy
    path = sub_dir / "alice.ipynb"
    path.write_text(json.dumps(solved(toy)))
    a = grader.grade(path, sol_dir / "ex_toy.ipynb", seed=None)
    assert a.seed is not None and 1 <= a.seed < 2**63 and a.total == a.possible, a.text()


def test_make_grade_passes_the_seed_to_no_shell_and_the_report_names_it(toy, tmp_path):
    nb_path = tmp_path / "learner.ipynb"
    nb_path.write_text(json.dumps(toy_solution()))
    make = ["make", "-s", "--no-print-directory", "-C", str(REPO), "grade", f"NB={nb_path}",
            f"SOLUTION={toy[0] / 'ex_toy.ipynb'}"]
    bad = subprocess.run([*make, "SEED=7; touch pwned4 $(touch pwned5)"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert bad.returncode != 0 and "--seed must be" in bad.stderr, bad.stdout + bad.stderr
    assert not any((d / f"pwned{i}").exists() for d in (tmp_path, REPO) for i in (4, 5))
    good = subprocess.run([*make, "SEED=3"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert good.returncode == 0 and "hidden seed 3)" in good.stdout, good.stdout + good.stderr
