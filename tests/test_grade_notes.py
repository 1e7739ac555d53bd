"""Honest answers keep their points: what the scanner notices in an answer is a note, never a withheld point.

The answers run in a jailed kernel apart from the tests (the wall), so a read-only ``.data``, a ``global``
counter, a ``typing.NamedTuple``, a class that derives from ``object`` or the word "specref" in a docstring
changes nothing but the learner's own kernel. Before specref_grading/scan.py became a note-writer, each of the
five answers below lost points (ex06 0/7, ex01 0/6, ex07 0/9, ex05 4/12, ex03 6/12) and the grading said
"needs review"; now each gets full marks on the tasks it answers, and the report's notes name what was seen.

Three layers, from fast to whole:
- the plan (`build_plan`): the findings are notes, no test is charged with them;
- the grading with the kernels' outcomes stubbed as "passed" (`grade_plan` over a fake `run_cells`): the score
  is full and the exit status 0, so the scanner alone can withhold nothing;
- the real grading (`specref_grading.grade.grade(path, solution=..., seed=1)`), across the wall, and
  the answers run in-process against the exercise's own test cells (they are right, not just unflagged).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specref_grading import grade as G
from specref_grading.plan import build_plan
from specref_grading.report import EXIT_FULL, Report
from specref_grading.scan import scan
from specref_grading.trust.wall import KernelRun, RunOutcome

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"

# (exercise, answer grade_id, honest source (None: see honest_submission), the test cells its answer feeds)
HONEST = {
    "data-attribute": ("ex06_trees", "ex06_mask_answer", '''\
def tree_from_mask(mask: torch.Tensor) -> list[int]:
    """The parents of the breadth-first tree whose attention mask is `mask`; ValueError if no tree has it."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"mask must be [N, N], got {tuple(mask.shape)}")
    parents = []
    for i in range(mask.shape[0]):
        row = mask.data[i]  # read-only: the node's row, through .data
        if not row[i] or row[i + 1:].any():
            raise ValueError(f"node {i} must see itself and no later node")
        seen = row[:i].nonzero().flatten().tolist()
        parent = seen[-1] if seen else -1
        if parent >= 0 and not torch.equal(row[:parent], mask[parent, :parent]):
            raise ValueError(f"node {i} sees nodes off its branch")
        if parents and parent < parents[-1]:
            raise ValueError(f"node {i}: not breadth-first")
        parents.append(parent)
    return parents
''', ["ex06_mask_check", "ex06_multi_check"]),
    "global-counter": ("ex01_roofline", "ex01_counts_answer", '''\
CALLS = 0


def pass_bytes(model, B: int, T: int, S: int) -> int:
    """Bytes one pass reads: every parameter once, and the KV cache of B rows of S cached tokens."""
    global CALLS
    CALLS += 1  # how often the checks called me
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(2 * model.config.n_embd * block.attn.c_attn.weight.element_size() for block in model.transformer.h)
    return weights + kv * B * S


def pass_flops(model, B: int, T: int, S: int) -> int:
    """FLOPs of one pass over B x T new tokens after S cached ones: matrix products and attention."""
    matrices = [model.lm_head.weight]
    for block in model.transformer.h:
        matrices += [block.attn.c_attn.weight, block.attn.c_proj.weight, block.mlp.c_fc.weight,
                     block.mlp.c_proj.weight]
    attended = T * S + T * (T + 1) // 2
    return B * (2 * sum(w.numel() for w in matrices) * T + 4 * model.config.n_embd * model.config.n_layer * attended)
''', ["ex01_counts_check", "ex01_ridge_check"]),
    "named-tuple": ("ex07_load_aware_k", "ex07_fit_answer", '''\
import typing


class Fit(typing.NamedTuple):
    overhead: float
    per_token: float
    kv: float


def fit_pass_time(rows) -> np.ndarray:
    """[overhead, per_token, kv] in seconds from rows of (batch_size, n_tokens, context, seconds)."""
    a = np.asarray(rows, dtype=np.float64)
    B, T, S, t = a.T
    X = np.stack([np.ones_like(t), B * T, B * S], axis=1)
    coef, *_ = np.linalg.lstsq(X / t[:, None], np.ones_like(t), rcond=None)
    return np.asarray(Fit(*coef))
''', ["ex07_fit_check", "ex07_verify_check", "ex07_crossover_check", "ex07_policy_check"]),
    "object-base": ("ex05_prompt_lookup", "ex05_draft_answer", None,  # the solution's class, as LookupDraft(object)
                    ["ex05_lookup_check", "ex05_draft_check", "ex05_interval_check", "ex05_positions_check"]),
    "specref-docstring": ("ex03_speedup", "ex03_bestk_answer", '''\
def best_k(alpha: float, c: float, v) -> int:
    """The best k; I checked it against specref.theory.optimal_k in the notebook (same values for a flat v)."""
    k, tokens, cost = 0, 1.0, v(0)
    while alpha ** (k + 1) * cost > (c + v(k + 1) - v(k)) * tokens:
        tokens += alpha ** (k + 1)
        cost += c + v(k + 1) - v(k)
        k += 1
    return k
''', ["ex03_counts_check", "ex03_pmf_check", "ex03_bestk_check", "ex03_measure_check"]),
}


def _solution(exercise: str) -> dict:
    nb = json.loads((SOLUTIONS / f"{exercise}.ipynb").read_text(encoding="utf-8"))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    return nb


def _answer_cell(nb: dict, grade_id: str) -> dict:
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def _strip_solution_markers(source: str) -> str:
    return "\n".join(ln for ln in source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)


def honest_submission(case: str) -> tuple[dict, dict, list[str]]:
    """(the solution, a copy of it with the honest answer in place, the tasks that answer feeds)."""
    exercise, gid, source, tasks = HONEST[case]
    sol = _solution(exercise)
    sub = copy.deepcopy(sol)
    sub["metadata"]["specref"] = {"exercise": exercise}
    cell = _answer_cell(sub, gid)
    if source is None:  # ex05: the solution's own class, declared as deriving from object
        source = _strip_solution_markers(cell["source"]).replace("class LookupDraft:", "class LookupDraft(object):")
        assert "class LookupDraft(object):" in source
    cell["source"] = source
    return sol, sub, tasks


@pytest.mark.parametrize("case", list(HONEST))
def test_the_scanner_has_something_to_say_about_each_honest_answer(case):
    """The answers are chosen to meet what the old scanner withheld points for; some of it is still noted."""
    exercise, gid, _, _ = HONEST[case]
    _, sub, _ = honest_submission(case)
    source = _answer_cell(sub, gid)["source"]
    scan(source)  # parses, raises nothing
    assert {"data-attribute": ".data", "global-counter": "global CALLS", "named-tuple": "typing.NamedTuple",
            "object-base": "(object)", "specref-docstring": "specref"}[case] in source


@pytest.mark.parametrize("case", list(HONEST))
def test_the_plan_charges_no_test_with_what_the_scanner_found(case):
    sol, sub, _ = honest_submission(case)
    plan = build_plan(sol, sub, f"{HONEST[case][0]}.ipynb", seed=1)
    assert not getattr(plan, "flags", None) and not getattr(plan, "reference", None), plan
    assert all(n.startswith(("answer cell", "the outputs saved")) or "code outside" in n for n in plan.notes), plan.notes


def test_a_scanner_finding_is_a_note_with_cell_and_line():
    sol, sub, _ = honest_submission("global-counter")
    _answer_cell(sub, "ex01_counts_answer")["source"] += "\n\nprobe = getattr(math, 'pi')\n"
    plan = build_plan(sol, sub, "ex01_roofline.ipynb", seed=1)
    assert any(n.startswith("answer cell 'ex01_counts_answer', line ") and n.endswith(": uses getattr")
               for n in plan.notes), plan.notes


def _all_passed(monkeypatch) -> None:
    """The kernels' side stubbed out: every test cell reports "passed", with no flag of the trusted side."""
    def fake_run_cells(cells, *args, **kwargs):
        return KernelRun(results={c["n"]: RunOutcome("passed") for c in cells if c["role"] == "test"},
                         stop=RunOutcome("passed"))
    monkeypatch.setattr(G, "run_cells", fake_run_cells)


@pytest.mark.parametrize("case", list(HONEST))
def test_what_the_scanner_sees_withholds_no_point(case, monkeypatch):
    """With every test passing across the wall, the honest answer's grade is full: nothing else takes points."""
    _all_passed(monkeypatch)
    sol, sub, tasks = honest_submission(case)
    plan = build_plan(sol, sub, f"{HONEST[case][0]}.ipynb", seed=1)
    results = G.grade_plan(plan)
    report = Report("x.ipynb", tests=results, notes=plan.notes)
    got = {t.grade_id: (t.score, t.points, t.flags) for t in results}
    assert all(got[t][0] == got[t][1] > 0 and not got[t][2] for t in tasks), got
    assert report.exit_code == EXIT_FULL and not report.flags, report.text()
    assert "NEEDS REVIEW" not in report.text() and "withheld" not in report.text()


def test_a_flag_of_the_trusted_side_still_withholds_and_asks_for_review(monkeypatch):
    """What the scanner lost, the trusted side keeps: a function that modified its inputs is flagged (exit 3)."""
    flag = "ex06_mask_check: tree_from_mask changed an object that the check passed in"

    def fake_run_cells(cells, *args, **kwargs):
        return KernelRun(results={c["n"]: RunOutcome("passed", flags=[flag] if c["grade_id"] == "ex06_mask_check"
                                                     else []) for c in cells if c["role"] == "test"},
                         stop=RunOutcome("passed"))
    monkeypatch.setattr(G, "run_cells", fake_run_cells)
    sol, sub, _ = honest_submission("data-attribute")
    results = G.grade_plan(build_plan(sol, sub, "ex06_trees.ipynb", seed=1))
    report = Report("x.ipynb", tests=results)
    assert report.exit_code == 3 and report.flags == [flag]
    assert {t.grade_id: t.score for t in results} == {"ex06_mask_check": 0.0, "ex06_multi_check": 4.0,
                                                      "ex06_acceptance_check": 3.0}


# -- the answers are right, not only unflagged: the exercise's own test cells, in-process -----------------------
def _run_in_process(sol: dict, sub: dict, tasks: list[str]) -> dict[str, str]:
    """Run the solution's setup and given cells, the submission's answers and the exercise's test cells (hidden
    ones with HIDDEN_SEED = 1) in one namespace: {task: "passed" or the error}."""
    from specref_grading.plan import with_seed

    ns: dict = {"__name__": "__main__"}
    plan = build_plan(sol, sub, "x.ipynb", seed=1)
    out: dict[str, str] = {}
    last = max(c["n"] for c in plan.cells if c["role"] == "test" and c["grade_id"] in tasks)
    for c in plan.cells:
        if c["n"] > last:
            break
        src = c["source"]
        if "NBVAL_IGNORE_OUTPUT" in src and c["role"] != "test":
            continue  # measurements and printouts: no task depends on them
        try:
            exec(compile(with_seed(src, 1) if c["role"] == "test" else src, f"cell {c['n']}", "exec"), ns)
            if c["role"] == "test":
                out[c["grade_id"]] = "passed"
        except Exception as e:  # noqa: BLE001 - the message is the result
            if c["role"] != "test":
                raise
            out[c["grade_id"]] = f"{type(e).__name__}: {e}"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(HONEST))
def test_each_honest_answer_passes_the_exercises_tests_in_process(case):
    sol, sub, tasks = honest_submission(case)
    got = _run_in_process(sol, sub, tasks)
    assert all(got.get(t) == "passed" for t in tasks), got


# -- the whole grading, across the wall -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.grader
@pytest.mark.parametrize("case", list(HONEST))
def test_each_honest_answer_gets_full_marks_on_the_tasks_it_answers(case, tmp_path):
    sol, sub, tasks = honest_submission(case)
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(sub), encoding="utf-8")
    report = G.grade(path, solution=SOLUTIONS / f"{HONEST[case][0]}.ipynb", seed=1)
    got = {t.grade_id: (t.score, t.points) for t in report.tests}
    assert all(t in got and got[t][0] == got[t][1] > 0 for t in tasks), report.text()
    assert report.exit_code == EXIT_FULL and not report.flags, report.text()


# About the grader, not numerics of ours: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
