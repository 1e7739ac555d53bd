"""Honest answers keep their points: checks judge values, not containers; hints invite only what the wall carries;
what the scanner notices is a note, never a withheld point.

An honest answer may return 12.0 where a count is meant, a list where the task says "a pair", a one-element tensor
or numpy integer where it says "an int" (one set of conversions, specref_grading/checks/report.py, reads every
answer); NaN is no measurement. ex08 Task 1's hint invites exact enumeration, which fits the wall's CPU cap; Task 2's
points are the hand-graded derivation's, its check a gate whose failures name neither the union bound nor its
formula. Each honest answer the scanner has something to say about gets full marks on the tasks it answers, in the
plan, with the kernels stubbed, across the wall and in-process; so do the honest answers that call the setup's own
helpers or search exhaustively. (The false-fail rates of the random checks: test_false_fail.py.)
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import json
import math
import re
import time
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch
from model_factory import best_k

from specref_grading import grade as G
from specref_grading import grade as grader
from specref_grading import plan as grade_plan
from specref_grading import report as grade_report
from specref_grading.checks import pitfalls as L
from specref_grading.checks import prompt_lookup as P
from specref_grading.checks import report
from specref_grading.checks import roofline as R
from specref_grading.checks import speedup as S
from specref_grading.plan import build_plan
from specref_grading.report import EXIT_FULL, Report
from specref_grading.scan import scan
from specref_grading.trust import wall
from specref_grading.trust.wall import KernelRun, RunOutcome

from .conftest import REPO, answer, as_root, grade, solution_notebook


def quiet(check, *args, **kwargs) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        check(*args, **kwargs)


@pytest.mark.parametrize("value, want", [
    (12, 12), (12.0, 12), (np.int64(12), 12), (np.float32(12.0), 12), (torch.tensor(12), 12),
    (torch.tensor([12.0]), 12), (np.array([[12]]), 12), (-3.0, -3), (0.0, 0),
])
def test_a_whole_number_is_an_int_whatever_holds_it(value, want):
    assert report.as_int(value) == want and type(report.as_int(value)) is int


@pytest.mark.parametrize("value", [12.5, True, np.bool_(False), math.inf, math.nan, "12", None, [12],
                                   torch.tensor([1, 2]), torch.tensor(True), np.array([1.5])])
def test_what_is_not_one_whole_number_is_none(value):
    assert report.as_int(value) is None


def test_a_sequence_is_a_list_a_tuple_or_an_array_and_never_a_string():
    assert report.as_items((1, 2)) == report.as_items([1, 2]) == [1, 2]
    assert [int(x) for x in report.as_items(torch.tensor([1, 2]))] == [1, 2]
    assert report.as_items(np.array([1, 2]), 2) is not None and report.as_items([1, 2], 3) is None
    for bad in ("ab", b"ab", 3, None, torch.tensor(3), {1: 2}):
        assert report.as_items(bad) is None, bad
    assert report.as_ints((1.0, np.int32(2), torch.tensor(3))) == [1, 2, 3]
    assert report.as_ints([1, 2.5]) is None and report.as_ints([1, True]) is None


def test_a_verdict_is_a_bool_whatever_holds_it():
    for value, want in ((True, True), (np.bool_(False), False), (torch.tensor(True), True), (np.array([True]), True)):
        assert report.as_bool(value) is want
    for bad in (1, 0.0, "True", None, torch.tensor([True, False]), torch.tensor(1)):
        assert report.as_bool(bad) is None, bad


def test_ex08_a_verdict_returned_as_numpys_bool_passes():
    from .test_ex08 import make_check

    check = make_check()
    quiet(L.check_lossless_check, lambda sampler: np.bool_(check(sampler)))
    quiet(L.check_lossless_check, lambda sampler: torch.tensor(check(sampler)), hidden=True, seed=2)
    with pytest.raises(AssertionError, match="return True"):
        quiet(L.check_lossless_check, lambda sampler: int(check(sampler)))


def test_ex01_counts_and_batch_sizes_returned_as_whole_floats_pass():
    from .test_ex01 import memory_bound_batch, pass_bytes, pass_flops

    def as_float(fn):
        return lambda *a: None if fn(*a) is None else float(fn(*a))

    quiet(R.check_bytes_and_flops, as_float(pass_bytes), as_float(pass_flops))
    quiet(R.check_memory_bound_batch, as_float(memory_bound_batch))
    quiet(R.check_memory_bound_batch_unseen, as_float(memory_bound_batch), seed=3)
    quiet(R.check_memory_bound_batch, lambda *a: None if memory_bound_batch(*a) is None else
          torch.tensor(memory_bound_batch(*a)))
    with pytest.raises(AssertionError, match="memory_bound_batch"):
        quiet(R.check_memory_bound_batch, lambda *a: None if memory_bound_batch(*a) is None else
              memory_bound_batch(*a) + 0.5)


def test_ex03_best_k_as_a_whole_float_or_a_tensor_passes():
    quiet(S.check_best_k, lambda a, c, v: float(best_k(a, c, v)))
    quiet(S.check_best_k, lambda a, c, v: torch.tensor(best_k(a, c, v)), n_cases=30, seed=2)
    with pytest.raises(AssertionError, match="whole number"):
        quiet(S.check_best_k, lambda a, c, v: best_k(a, c, v) + 0.5)


def test_ex05_propose_returning_a_list_passes():
    from .test_ex05 import CachingDraft, LookupDraft

    class ListPair(LookupDraft):
        def propose(self, tokens, lengths, k):
            return list(super().propose(tokens, lengths, k))

    class ListIds(CachingDraft):
        def propose(self, tokens, lengths, k):
            drafts, q = super().propose(tokens, lengths, k)
            return [drafts.tolist(), q]

    quiet(P.check_draft, ListPair)
    quiet(P.check_draft, ListIds, seed=7)


def test_ex05_compare_tau_returning_lists_passes():
    from .test_ex05 import compare_tau

    quiet(P.check_tau_interval, lambda a, b, level=0.95: [list(x) if isinstance(x, tuple) else x
                                                          for x in compare_tau(a, b, level)])
    quiet(P.check_tau_interval, lambda a, b, level=0.95: [*compare_tau(a, b, level)[:2],
                                                          float(compare_tau(a, b, level)[2])], seed=1)
    with pytest.raises(AssertionError, match="return \\(\\(tau"):
        quiet(P.check_tau_interval, lambda a, b, level=0.95: list(compare_tau(a, b, level))[:2])


EX08 = REPO / "solutions" / "ex08_lossless_or_not.ipynb"


def _cells() -> list[dict]:
    return json.loads(EX08.read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _ex08_namespace() -> dict:
    """The solution's setup and answer cells, run in one namespace (test cells left out)."""
    ns: dict = {"__name__": "__main__"}
    with redirect_stdout(io.StringIO()):
        for c in _cells():
            meta = c["metadata"].get("nbgrader", {})
            if c["cell_type"] == "code" and not (meta.get("grade") and not meta.get("solution")) and \
                    c["metadata"].get("specref", {}).get("side") != "checks":
                exec(compile(_text(c), "ex08 cell", "exec"), ns)  # noqa: S102 - the course's own solution
    return ns


class _Counting:
    """Counts the calls that would cross the wall: each run of a sampler and each draw it asks of the rng."""

    def __init__(self) -> None:
        self.calls = 0

    def sampler(self, sampler):
        def run(target, draft, start, n, rng):
            self.calls += 1
            return sampler(target, draft, start, n, self.rng(rng))
        return run

    def rng(self, rng):
        counter = self

        class Rng:
            def uniform(self, *a, **k):
                counter.calls += 1
                return rng.uniform(*a, **k)

            def categorical(self, *a, **k):
                counter.calls += 1
                return rng.categorical(*a, **k)
        return Rng()


def test_ex08_task1_invites_exact_enumeration_only_and_it_fits_the_wall():
    task1 = next(_text(c) for c in _cells() if _text(c).startswith("## Task 1"))
    assert "or a sampled test" not in task1 and "a sampled check must resolve" not in task1
    assert "exact_distribution" in task1 and "not the tool here" in task1
    assert "distribution test" not in L._CHECK_HINT and "exact_distribution" in L._CHECK_HINT

    ns = _ex08_namespace()
    exact = _Counting()
    for sampler in L.SAMPLERS.values():
        ns["is_lossless"](exact.sampler(sampler))
    # A sampled test at Task 2's size: per case, samples_needed(0.08, 9 cells) generations at a level that leaves
    # the 18 verdicts (6 samplers x 3 cases) a 1e-3 error between them, each a run and its draws (at least one).
    n = ns["samples_needed"](0.08, 9, 1e-3 / 18)
    sampled = len(L.SAMPLERS) * len(L.reference_cases()) * n * 2
    print(f"ex08 Task 1 across the wall: exact enumeration {exact.calls} calls for the six; a sampled test at "
          f"n = {n} per case at least {sampled}")
    assert exact.calls < 50_000 and 10 * exact.calls < sampled


def test_ex08_task2_points_are_the_derivations_and_the_check_is_a_gate():
    graded = {c["metadata"]["nbgrader"]["grade_id"]: c for c in _cells() if c["metadata"].get("nbgrader", {}).get("grade")}
    assert graded["ex08_resolution_check"]["metadata"]["nbgrader"]["points"] == 0
    assert graded["ex08_resolution_derivation"]["metadata"]["nbgrader"]["points"] == 3
    rubric = next(_text(c) for c in _cells() if c["metadata"].get("specref", {}).get("rubric") == "ex08_resolution_derivation")
    assert "3 points" in rubric and "gate" in rubric


def _union(n_cells: int, n: int, level: float) -> float:
    return math.sqrt((n_cells * math.log(2) + math.log(1 / level)) / (2 * n))


def test_ex08_task2_failures_name_neither_the_union_bound_nor_its_formula():
    ns = _ex08_namespace()
    with pytest.raises(AssertionError) as e:  # 1.1 x the union bound: valid everywhere, not below it at 1000 cells
        L.check_resolution(lambda m, n, lv: 1.1 * _union(m, n, lv), ns["samples_needed"], seed=5)
    message = str(e.value)
    assert "not below the union bound" in message
    assert "sqrt" not in message and "ln 2" not in message and "ln(1" not in message
    assert not any(f"{_union(1000, 20000, lv):.4f}" in message for lv in (0.05, 0.01)), message
    with pytest.raises(AssertionError) as e:
        L.check_resolution(ns["tv_threshold"], lambda tv, m, lv: 50 * ns["samples_needed"](tv, m, lv), seed=5)
    assert "too many samples" in str(e.value) and not re.search(r"at most \d", str(e.value))


SOLUTIONS = REPO / "solutions"


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


def _strip_solution_markers(source: str) -> str:
    return "\n".join(ln for ln in source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)


def honest_submission(case: str) -> tuple[dict, dict, list[str]]:
    """(the solution, a copy of it with the honest answer in place, the tasks that answer feeds)."""
    exercise, gid, source, tasks = HONEST[case]
    sol = solution_notebook(exercise)
    sub = copy.deepcopy(sol)
    sub["metadata"]["specref"] = {"exercise": exercise}
    cell = answer(sub, gid)
    if source is None:  # ex05: the solution's own class, declared as deriving from object
        source = _strip_solution_markers(cell["source"]).replace("class LookupDraft:", "class LookupDraft(object):")
        assert "class LookupDraft(object):" in source
    cell["source"] = source
    return sol, sub, tasks


@pytest.mark.grader
@pytest.mark.parametrize("case", list(HONEST))
def test_the_scanner_has_something_to_say_about_each_honest_answer(case):
    """The answers are chosen to meet what the old scanner withheld points for; some of it is still noted."""
    exercise, gid, _, _ = HONEST[case]
    _, sub, _ = honest_submission(case)
    source = answer(sub, gid)["source"]
    scan(source)  # parses, raises nothing
    assert {"data-attribute": ".data", "global-counter": "global CALLS", "named-tuple": "typing.NamedTuple",
            "object-base": "(object)", "specref-docstring": "specref"}[case] in source


@pytest.mark.grader
@pytest.mark.parametrize("case", list(HONEST))
def test_the_plan_charges_no_test_with_what_the_scanner_found(case):
    sol, sub, _ = honest_submission(case)
    plan = build_plan(sol, sub, f"{HONEST[case][0]}.ipynb", seed=1)
    assert not getattr(plan, "flags", None) and not getattr(plan, "reference", None), plan
    assert all(n.startswith(("answer cell", "the outputs saved")) or "code outside" in n for n in plan.notes), plan.notes


@pytest.mark.grader
def test_a_scanner_finding_is_a_note_with_cell_and_line():
    sol, sub, _ = honest_submission("global-counter")
    answer(sub, "ex01_counts_answer")["source"] += "\n\nprobe = getattr(math, 'pi')\n"
    plan = build_plan(sol, sub, "ex01_roofline.ipynb", seed=1)
    assert any(n.startswith("answer cell 'ex01_counts_answer', line ") and n.endswith(": uses getattr")
               for n in plan.notes), plan.notes


def _all_passed(monkeypatch) -> None:
    """The kernels' side stubbed out: every test cell reports "passed", with no flag of the trusted side."""
    def fake_run_cells(cells, *args, **kwargs):
        return KernelRun(results={c["n"]: RunOutcome("passed") for c in cells if c["role"] == "test"},
                         stop=RunOutcome("passed"))
    monkeypatch.setattr(G, "run_cells", fake_run_cells)


@pytest.mark.grader
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


@pytest.mark.grader
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


@pytest.mark.grader
@pytest.mark.slow
@pytest.mark.parametrize("case", list(HONEST))
def test_each_honest_answer_passes_the_exercises_tests_in_process(case):
    sol, sub, tasks = honest_submission(case)
    got = _run_in_process(sol, sub, tasks)
    assert all(got.get(t) == "passed" for t in tasks), got


# -- the whole grading, across the wall -------------------------------------------------------------------------
@pytest.mark.grader
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


@pytest.mark.grader
@as_root
def test_the_honest_ex02_answer_with_a_smoke_run_gets_full_marks(tmp_path):
    """The exercise's own smoke run (TorchRNG over a seeded private generator) copied into an answer: the old
    scanner flagged it (manual_seed, TorchRNG as 'the reference'), scoring the task 0 with 'needs review'."""
    sol = REPO / "solutions" / "ex02_accept_reject.ipynb"
    nb = json.loads(sol.read_text())
    cell = answer(nb, "ex02_step_answer")
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = src + (
        "\n\nsmoke_rng = TorchRNG(torch.Generator().manual_seed(0))\n"
        "print(speculative_step(torch.tensor([1]), torch.tensor([[0.3, 0.6, 0.1]], dtype=torch.float64),\n"
        "                       torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]], dtype=torch.float64), smoke_rng))\n")
    path = tmp_path / "honest.ipynb"
    path.write_text(json.dumps(nb))
    report = grader.grade(path, sol)
    assert report.exit_code == grade_report.EXIT_FULL and report.total == report.possible, report.text()


# -- the scanner's notes: the issue's routes and file readers, and the exercises' own helpers --------------
@pytest.mark.grader
@pytest.mark.parametrize("source, word", [
    ("import operator\nf = operator.attrgetter('a' + 'b')", "operator"),
    ("import numpy as np\nnp.genfromtxt('/etc/passwd')", "genfromtxt"),
    ("import numpy as np\nnp.fromregex('/f', 'x', str)", "fromregex"),
    ("import torch\ntorch.from_file('/f')", "from_file"),
    ("import numpy as np\nnp.fromfile('/f')", "fromfile"),
    ("import numpy as np\nnp.load('/f')", "load"),
])
def test_the_scanner_notes_the_routes_and_file_reads(source, word):
    found = scan(source)
    assert any(word in f.text for f in found), found


@pytest.mark.grader
def test_the_exercises_own_helpers_are_allowed_in_answers():
    """ex08: TorchRNG over a seeded generator, and exact_distribution (which the task suggests): no note."""
    sol = json.loads((REPO / "solutions" / "ex08_lossless_or_not.ipynb").read_text())
    sub = copy.deepcopy(sol)
    cell = answer(sub, "ex08_check_answer")
    cell["source"] = ("def is_lossless(sampler) -> bool:\n"
                      "    rng = TorchRNG(torch.Generator().manual_seed(0))\n"
                      "    result = exact_distribution\n"
                      "    return bool(result) and rng is not None\n")
    plan = grade_plan.build_plan(sol, sub, "ex08_lossless_or_not.ipynb")
    assert not [n for n in plan.notes if "ex08_check_answer" in n], plan.notes


@pytest.mark.grader
@pytest.mark.slow
@as_root
def test_the_honest_ex07_answer_with_the_setups_own_call_gets_full_marks(tmp_path):
    """The solution plus print(fit_pass_time(server_rows())), a call ex07's setup makes: once 3/9, needs review."""
    from specref_grading import grade as grader
    from specref_grading import report as grade_report
    sol = REPO / "solutions" / "ex07_load_aware_k.ipynb"
    nb = json.loads(sol.read_text())
    cell = answer(nb, "ex07_fit_answer")
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = src + "\n\nprint(fit_pass_time(server_rows()))\n"
    path = tmp_path / "honest.ipynb"
    path.write_text(json.dumps(nb))
    report = grader.grade(path, sol)
    assert report.exit_code == grade_report.EXIT_FULL and report.total == report.possible, report.text()


# -- honest failures explain themselves --------------------------------------------------------
@pytest.mark.grader
def test_a_failed_check_shows_its_whole_message_with_the_hint(toy):
    nb = copy.deepcopy(toy[2])
    answer(nb, "double_answer")["source"] = "def double(x):\n    return x + 2"
    code, report, out = grade(nb, toy)
    assert code == 1
    msg = next(t["message"] for t in report["tests"] if t["grade_id"] == "double_check")
    assert "double(1) returned 3, expected 2" in msg and "Hint: multiply by two, do not add." in msg


@pytest.mark.grader
@pytest.mark.grader
def test_an_honest_exhaustive_best_k_keeps_its_points_under_the_cpu_cap():
    """ex03's best_k by exhaustive search to a proven bound (tests/model_factory.py) calls v(k) close to a million
    times across the wall, visible and hidden cases: far more than any count of calls a cap could allow a flood. It
    passes under the default cap on the checks' CPU time, which is what the test prints."""
    from model_factory import best_k_exhaustive

    from specref_grading.plan import build_plan
    sol = solution_notebook("ex03_speedup")
    sub = json.loads(json.dumps(sol))
    answer(sub, "ex03_bestk_answer")["source"] = inspect.getsource(best_k_exhaustive).replace(
        "best_k_exhaustive", "best_k")
    plan = build_plan(sol, sub, "ex03_speedup.ipynb", seed=1)
    plan.tests = [t for t in plan.tests if t.grade_id == "ex03_bestk_check"]
    events: list[dict] = []
    real = wall._event

    def spy(line: bytes):
        ev = real(line)
        if ev is not None:
            events.append(ev)
        return ev
    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wall, "_event", spy)
        [result] = grader.grade_plan(plan)
    got = next(e for e in events if e.get("ev") in ("result", "stop") and e.get("n") == plan.tests[0].n)
    print(f"ex03 exhaustive best_k: {got.get('calls')} calls, {got.get('test_cpu_s')} s of the checks' CPU time "
          f"(cap {wall.TEST_CPU_S} s), {time.monotonic() - t0:.0f} s in all")
    assert result.outcome == "passed" and result.score == result.points == 3, result
    assert got["calls"] > 500_000, got  # the count a call cap would have had to allow


# -- answers that a check's own comparison let through ---------------------------------------------
@pytest.mark.grader
@pytest.mark.parametrize("value", [float("nan"), torch.tensor(float("nan"))], ids=["float", "tensor"])
def test_nan_is_no_measurement_nor_law(value):
    """`abs(v - want) > tol` is False for NaN: a NaN measurement or probability must fail ex03's checks, not pass."""
    from specref_grading.checks.speedup import check_accepted_count_pmf, check_best_k, check_toy_measurement

    with pytest.raises(AssertionError, match="return three numbers"):
        check_toy_measurement(lambda *a: (value, 0.5, 0.5), n_cases=1)
    with pytest.raises(AssertionError, match="wrong answer"):
        check_accepted_count_pmf(lambda alphas: [value] * (len(alphas) + 1))
    with pytest.raises(AssertionError, match="as a whole number"):  # a NaN is no whole number (as_int)
        check_best_k(lambda alpha, c, v: value)
