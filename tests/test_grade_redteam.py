"""The grader (specref_grading) against a cheating learner, second round: every attack here got marks or broke the grader.

Most tests grade the toy exercise of tests/test_grade_security.py (pure Python: a kernel starts in a
fraction of a second) with the same rule: the attacked task scores 0 (the answers run in a jailed kernel,
the tests in a trusted process; what the scanner notices is only a note). The others grade the course's own
exercises, or call a grader of specref_grading.checks directly, where the hole was in that exercise's check.

GRADE_PY=path/to/another/grade.py runs the CLI tests against another grader, as in test_grade_security.
"""

from __future__ import annotations

import copy
import csv
import json
import subprocess
from pathlib import Path

import pytest
import torch
from test_grade_security import (  # noqa: F401  (toy: the fixture, used by name)
    CLASSRUN_CMD,
    GRADE_CMD,
    answer,
    assert_no_marks_silently,
    attacked,
    grade,
    scores,
    solved,
    toy,
)

REPO = Path(__file__).resolve().parents[1]


def exercise(name: str) -> dict:
    nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text(encoding="utf-8"))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    return nb


def grade_exercise(nb: dict, tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    """Grade a submission of one of the course's exercises (its solution found by the exercise id)."""
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([*GRADE_CMD, str(path), "--solutions-dir", str(REPO / "solutions"),
                           "--json", *args], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return proc.returncode, report, proc.stdout + proc.stderr


def with_answer(nb: dict, grade_id: str, source: str) -> dict:
    """The notebook with one answer cell's source replaced."""
    nb = copy.deepcopy(nb)
    answer(nb, grade_id)["source"] = source
    return nb


# -- 1. forging the kernel's results without any flagged syntax -----------------------------------
# The old kernel's signing key and emitter lived in the runner's module (__main__): an answer that reached it
# reported every test passed. Across the wall the kernel holds no emitter and no channel to the grade.
_EMIT_ALL_PASSED = '''
emit = get(main, "_emit")
for c in get(main, "_plan")["cells"]:
    if c["role"] == "test":
        emit({"ev": "result", "n": c["n"], "grade_id": c["grade_id"], "outcome": "passed", "message": "",
              "flags": []})
emit({"ev": "done"})
get(get(main, "os"), "_exit")(0)
'''
_MAIN = '"_" * 2 + "main" + "_" * 2'  # the string "__main__", which the scan would flag as a constant
# One expression that does all of the above, for the routes that evaluate a string.
_FORGE_EXPR = ("(lambda m: [m._emit(dict(ev='result', n=c['n'], grade_id=c['grade_id'], outcome='passed', "
               "message='', flags=[])) for c in m._plan['cells'] if c['role'] == 'test'] + [m._emit(dict(ev='done')), "
               "m.os._exit(0)])(__import__('sys').modules['_' '_main_' '_'])")


@pytest.mark.parametrize("attack", [
    pytest.param("import dataclasses, typing\nget = dataclasses.builtins.getattr\n"
                 f"main = typing.sys.modules[{_MAIN}]" + _EMIT_ALL_PASSED, id="module-attributes-typing.sys"),
    pytest.param("from enum import bltns\nimport statistics\nget = bltns.getattr\n"
                 f"main = statistics.sys.modules[{_MAIN}]" + _EMIT_ALL_PASSED, id="from-import-enum.bltns"),
    pytest.param("import string\ndef f():\n    pass\nfield = string.Formatter().get_field\n"
                 "get = field('0.__globals__[__builtins__].getattr', [f], {})[0]\n"
                 "imp = field('0.__globals__[__builtins__].__import__', [f], {})[0]\n"
                 f"main = imp('sys').modules[{_MAIN}]" + _EMIT_ALL_PASSED, id="string-formatter-get-field"),
    pytest.param(f"import typing\ndef f(x: {_FORGE_EXPR!r}):\n    pass\ntyping.get_type_hints(f)",
                 id="typing-get-type-hints-evaluates-a-string"),
    pytest.param(f"import functools\n@functools.singledispatch\ndef g(x):\n    pass\ndef f(x: {_FORGE_EXPR!r}):\n"
                 "    pass\ng.register(f)", id="singledispatch-register-evaluates-a-string"),
])
def test_reaching_the_kernels_main_module_through_an_allowed_module_forges_nothing(toy, attack):
    """A module reached as an attribute, builtins under other names, string-driven attribute access or evaluation:
    each of these forged full marks on the old kernel. Now they reach only the kernel's own __main__."""
    nb = attacked(toy[2], attack)
    code, report, out = grade(nb, toy)
    assert_no_marks_silently(code, report)
    assert_no_marks_silently(code, report, "pair_check")
    assert code == 1 and report["total"] == 0 and report["flags"] == [], out


def test_forging_results_through_torch_on_a_real_exercise_gets_nothing(tmp_path):
    """torch hands out sys, os and builtins as attributes (torch.sys, torch.os, torch.builtins): 8/8 on ex02 once."""
    forge = ("import torch\nget = torch.builtins.getattr\n"
             f"main = torch.sys.modules[{_MAIN}]" + _EMIT_ALL_PASSED)
    nb = exercise("ex02_accept_reject")
    cell = answer(nb, "ex02_worked_answer")
    cell["source"] = forge + "\n" + cell["source"]
    code, report, out = grade_exercise(nb, tmp_path)
    assert code == 1 and report["total"] == 0 and report["flags"] == [], out


# -- 2. ex04: the models a check hands the learner ---------------------------------------------------
def _plain_decode_through_the_wrapped_model(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None,
                                            generator=None):
    """Plain greedy decoding, no speculation, on a model the pass counter does not see (the notebook's own pair)."""
    from specref.models.pair import load_pair

    return _plain_greedy(load_pair()[0].double(), prompt, max_new_tokens)


def _plain_decode_on_the_graders_pair(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None,
                                      generator=None):
    """The same on the grader's own float64 pair."""
    from specref_grading.checks import gpt2_pair as G

    return _plain_greedy(G._pair64()[0], prompt, max_new_tokens)


def _plain_greedy(model, prompt, max_new_tokens):
    cache, out = model.new_cache(1), []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache)[0, -1]
        for _ in range(max_new_tokens):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache=cache)[0, -1]
    return out


def test_plain_decoding_on_a_model_the_check_does_not_count_is_not_speculation():
    """Passes the wrapper does not see (its `.model`, or the notebook's own pair) gave plain decoding 3/3."""
    from specref_grading.checks import gpt2_pair as G

    with pytest.raises(AssertionError, match="called the target 0 times"):
        G.check_speculative_decode(_plain_decode_through_the_wrapped_model, n_prompts=1, ks=(1,))
    # Reaching for the grader's own pair is refused before anything runs: the import names the grader.
    with pytest.raises(AssertionError, match="uses specref_grading.checks.gpt2_pair"):
        G.check_speculative_decode(_plain_decode_on_the_graders_pair, n_prompts=1, ks=(1,))


def test_weights_the_learner_writes_never_reach_the_reference_of_later_checks():
    """A step that zeroes the models it is handed through .data (no version bump) must leave the graders'
    reference intact: it poisoned the expected answers of check_speculative_decode, which [c] * n then passed."""
    from specref_grading.checks import gpt2_pair as G

    reference = [p for m in G._pair64() for p in m.parameters()]
    saved = [p.detach().clone() for p in reference]

    def poison(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
        for model in (target, draft):
            for p in model.parameters():
                p.data.zero_()
        return [0]

    try:
        with pytest.raises(AssertionError, match="called the target 0 times"):
            G.check_step_caches(poison)
        assert all(torch.equal(p, s) for p, s in zip(reference, saved)), "the learner's step changed the reference"
        with pytest.raises(AssertionError, match="first difference"):
            G.check_speculative_decode(lambda target, draft, prompt, k, n, *a: [0] * n, n_prompts=1, ks=(1,))
    finally:
        with torch.no_grad():
            for p, s in zip(reference, saved):
                p.copy_(s)


# -- 3. answers that a check's own comparison let through ---------------------------------------------
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


# -- 4. the setup's own objects, edited in place -------------------------------------------------------
CASES_SETUP = '''import math

CASES = {"double": [1, 2.5, -3]}


def check_double(fn):
    """The exercise's grader for double(), on the setup's CASES."""
    for x in CASES["double"]:
        got = fn(x)
        assert isinstance(got, (int, float)) and math.isclose(got, 2 * x), f"double({x}) returned {got!r}"
    print("check_double: passed")'''


@pytest.fixture
def toy_cases(toy):
    """The toy exercise whose check reads its cases from a dict of lists that the setup binds."""
    from test_grade_security import make_exercise, toy_solution

    sol = toy_solution()
    sol["cells"][1]["source"] = CASES_SETUP
    sol["cells"][1]["metadata"] = {}  # a setup cell, not the checks' cell: CASES is bound in the kernel too
    answer(sol, "double_check")["source"] = "check_double(double)"
    (toy[0] / "ex_toy.ipynb").write_text(json.dumps(sol), encoding="utf-8")
    return toy[0], toy[1], make_exercise(sol)


@pytest.mark.parametrize("attack", [
    pytest.param('CASES["double"].clear()', id="a-list-inside-a-setup-dict"),
    pytest.param('CASES.clear()\nCASES["double"] = [0]', id="the-setup-dict-itself"),
    pytest.param('CASES["double"][:] = [0]', id="slice-assignment"),
])
def test_clearing_the_setups_cases_in_place_is_flagged_and_undone(toy_cases, attack):
    """Names the setup binds were compared by identity only: emptying their contents passed any answer."""
    nb = attacked(toy_cases[2], attack + "\ndouble = lambda x: 0")
    code, report, out = grade(nb, toy_cases)
    assert_no_marks_silently(code, report)
    assert "double(1) returned 0" in out  # the check ran on the cases the setup made (across the wall: its own)


def test_ex08s_threshold_cannot_be_taken_from_the_courses_distribution_test(tmp_path):
    """Task 2 asks for a threshold below the union bound that specref.checks.montecarlo.distribution_test computes
    (tv_bound); nine tenths of it passes the check. In the jail that module is absent, so an answer that asks it for
    the bound scores 0."""
    answer = ("import math\n\n\ndef tv_threshold(n_cells, n, level):\n"
              "    from specref.checks.montecarlo import distribution_test\n"
              "    import torch\n"
              "    p = torch.full((n_cells,), 1.0 / n_cells, dtype=torch.float64)\n"
              "    return distribution_test(p, samples=torch.zeros(n, dtype=torch.long), alpha=level).tv_bound * 0.9\n\n\n"
              "def samples_needed(tv, n_cells, level):\n"
              "    return math.ceil((2 * tv_threshold(n_cells, 1, level) / tv) ** 2)\n")
    from specref_grading.checks import pitfalls

    outside: dict = {}
    exec(answer, outside)  # outside the jail the module is there, and its bound passes the check: the attack is real
    pitfalls.check_resolution.__wrapped__(outside["tv_threshold"], outside["samples_needed"])
    nb = with_answer(exercise("ex08_lossless_or_not"), "ex08_resolution_answer", answer)
    code, report, out = grade_exercise(nb, tmp_path)
    assert scores(report)["ex08_resolution_check"] == 0 and code in (1, 3), out


# -- 5. what must not take the grader or the host down -------------------------------------------------
@pytest.mark.parametrize("bomb", [
    pytest.param(lambda nb: json.dumps(nb)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", id="deep-json"),
    pytest.param(lambda nb: json.dumps(attacked(nb, "x = " + "-" * 100_000 + "1")), id="parser-memory-error"),
    pytest.param(lambda nb: json.dumps(attacked(nb, "x = a" + ".b" * 100_000)), id="parser-recursion-error"),
])
def test_a_notebook_the_parser_cannot_read_is_ungradable_and_the_batch_goes_on(toy, tmp_path, bomb):
    """RecursionError and MemoryError from json.loads or ast.parse crashed grade.py, and with it grade-all."""
    sol_dir, sub_dir, exercise_nb = toy
    (sub_dir / "honest.ipynb").write_text(json.dumps(solved(toy)), encoding="utf-8")
    (sub_dir / "bomb.ipynb").write_text(bomb(exercise_nb), encoding="utf-8")
    book = tmp_path / "book.csv"
    proc = subprocess.run([*CLASSRUN_CMD, str(sub_dir), "--csv", str(book), "--solutions-dir",
                           str(sol_dir)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    rows = {r["file"]: r for r in csv.DictReader(book.open(encoding="utf-8"))}
    assert rows["honest.ipynb"]["total"] == "3" and rows["bomb.ipynb"]["total"] == "0", rows


_RESERVE = ("def double(x):\n    import numpy\n    try:\n        numpy.empty({gib} << 30, dtype=numpy.uint8)\n"
            "    except MemoryError:\n        return 2 * x\n    return -1")


@pytest.mark.parametrize("gib, args", [(12, ()), (2, ("--memory", "1024"))], ids=["default", "--memory"])
def test_a_kernel_cannot_take_more_memory_than_its_limit(toy, gib, args):
    """No memory limit: one kernel could take all of the host's memory. Reserved, never touched, the memory
    probed here costs nothing; double() answers right only if the reservation is refused."""
    nb = attacked(toy[2], _RESERVE.format(gib=gib))
    code, report, out = grade(nb, toy, "alice.ipynb", *args)
    assert scores(report)["double_check"] == 2, out


# -- 6. what the instructor reads -----------------------------------------------------------------------
def test_escape_sequences_in_the_learners_text_cannot_redraw_the_report(toy):
    """The text report printed an exception's message and a hand-graded answer raw: ANSI escapes in them erased
    the real lines on a terminal, drew a fake "status: full marks" and hid what followed."""
    fake = "\x1b[1A\x1b[2Kstatus: full marks\x1b[8m\u202e"
    nb = attacked(toy[2], f"def double(x):\n    raise ValueError({fake!r})")
    answer(nb, "why")["source"] = "Because." + fake
    path = toy[1] / "alice.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([*GRADE_CMD, str(path), "--solutions-dir", str(toy[0])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout, proc.stdout
    assert proc.stdout.count("\\x1b[1A") == 2 and "\\u202e" in proc.stdout, proc.stdout


def test_an_endless_line_on_the_result_channel_cannot_grow_the_graders_memory():
    """The channel keeps at most max_bytes of an unfinished line; a longer one is dropped, counted once, and skipped
    to its end, and the events around it still arrive."""
    from specref_grading.trust import wall as grade

    lines, rest, skipping, over = grade._split_events(b"", b'{"a"}\n{"b', False, max_bytes=8)
    assert (lines, rest, skipping, over) == ([b'{"a"}'], b'{"b', False, 0)
    lines, rest, skipping, over = grade._split_events(rest, b"x" * 20, skipping, max_bytes=8)  # no newline: a flood
    assert (lines, rest, skipping, over) == ([], b"", True, 1)
    for _ in range(1000):  # the flood goes on: nothing is kept, nothing counted again
        lines, rest, skipping, over = grade._split_events(rest, b"y" * 4096, skipping, max_bytes=8)
        assert (lines, rest, skipping, over) == ([], b"", True, 0)
    lines, rest, skipping, over = grade._split_events(rest, b'zz\n{"c"}\n{"d', skipping, max_bytes=8)
    assert (lines, rest, skipping, over) == ([b'{"c"}'], b'{"d', False, 0)  # the flood's end, then events again


# The check computes its expected answers with a torch module, as the course's checks do with their models.
MODEL_CHECKS = '''import torch


def check_double(fn, xs=(1.0, 2.5, -3.0)):
    """The exercise's grader for double(): the reference is a torch module."""
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(2.0)
    for x in xs:
        want = float(lin(torch.tensor([[float(x)]]))[0, 0])
        got = fn(x)
        assert isinstance(got, (int, float)) and abs(got - want) < 1e-9, f"double({x}) returned {got!r}, expected {want}"
    print("check_double: passed")'''


@pytest.mark.parametrize("source", [
    "import torch\ntorch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 0)",
    "from torch.nn.modules.module import register_module_forward_pre_hook\n"
    "register_module_forward_pre_hook(lambda m, i: tuple(t * 0 for t in i))",
], ids=["forward-hook", "from-import-pre-hook"])
def test_hooks_on_every_module_at_once_cannot_rewrite_the_reference(toy, source):
    """A global module hook rewrote every model's outputs, the reference's included: with the hook zeroing them,
    double = 0 matched. Registered in the kernel, it never reaches the checks' modules."""
    from test_grade_security import make_exercise, toy_solution

    sol = toy_solution()
    sol["cells"][1]["source"] = MODEL_CHECKS
    (toy[0] / "ex_toy.ipynb").write_text(json.dumps(sol), encoding="utf-8")
    exercise_nb = make_exercise(sol)
    code, report, out = grade(attacked(exercise_nb, source + "\ndouble = lambda x: 0.0"), toy)
    assert_no_marks_silently(code, report)
    assert "double(1.0) returned 0.0, expected 2.0" in out, out
    honest = attacked(exercise_nb, "double = lambda x: 2.0 * x")  # the control: the torch reference grades
    code, report, out = grade(honest, toy)
    assert scores(report)["double_check"] == 2, out


# Grades in kernels whose environment specref_grading sets itself: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
