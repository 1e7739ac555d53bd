"""Results: a test's outcome is decided in the trusted process and written to a pipe the kernel does not hold.

Each attack forges full marks from inside the kernel (the kernel's own globals, its main module reached through an
allowed module, torch's attributes, a forged report, the runner killed after forging, the kernel's memory or /proc
read by an unjailed kernel, the setup's cases edited in place); on this grader it gains nothing, without a jail too,
and a line on the result channel cannot grow the grader's memory. GRADE_PY pointing at a grader without the wall
shows the attacks succeed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specref_grading import grade as grader
from specref_grading import plan as grade_plan
from specref_grading import processes
from specref_grading import report as grade_report
from specref_grading.trust import wall

from .conftest import (
    AS_ROOT,
    REPO,
    answer,
    assert_no_marks_silently,
    attacked,
    exercise,
    grade,
    grade_exercise,
    make_exercise,
    solved,
    toy_solution,
    toy_with_limits,
)

pytestmark = pytest.mark.grader


# The toy's test cells are cells 3 (double_check) and 5 (pair_check): a forger reports both as passed.
_FORGE = ('    for n in (3, 5):\n'
          '        emit({"ev": "result", "n": n, "grade_id": None, "outcome": "passed", "message": "", "flags": [], '
          '"answer_errors": []})\n'
          '    emit({"ev": "done"})\n'
          '    leave(0)\n')


# Route 1 and 2 of the issue: a module handed out under an underscore name, and a match statement's class
# pattern reading the kernel's private functions by name (neither was scanned).
MATCH_ROUTE = ('from collections import _sys\n'
               'match _sys.modules["__ma" + "in__"]:\n'
               '  case object(_emit=emit, _exit=leave):\n' + _FORGE)


# Route 3: operator.attrgetter re-exported under a public name of an allowed module, names built from strings.
ATTRGETTER_ROUTE = ('import torch\n'
                    'from torch.autograd.profiler_util import attrgetter\n'
                    'main = attrgetter("modules")(attrgetter("sy" + "s")(torch))["__ma" + "in__"]\n'
                    'emit, leave = attrgetter("_em" + "it")(main), attrgetter("_ex" + "it")(main)\n'
                    'if True:\n' + _FORGE)


# Any means at all: everything the kernel's process holds, searched and called; forged lines on every fd.
ANY_MEANS = '''import gc, os, sys, builtins
for obj in list(gc.get_objects()):
    if isinstance(obj, dict) and ("_emit" in obj or "_plan" in obj or "emit" in obj):
        for key in ("_emit", "emit"):
            if callable(obj.get(key)):
                for n in (3, 5):
                    try:
                        obj[key]({"ev": "result", "n": n, "grade_id": None, "outcome": "passed", "message": "",
                                  "flags": [], "answer_errors": []})
                    except BaseException:
                        pass
builtins.AssertionError = type("Never", (Exception,), {})
for fd in range(3, 40):
    try:
        os.write(fd, b'{"ev": "result", "n": 3, "outcome": "passed", "message": "", "flags": []}\\n')
    except OSError:
        pass
'''


def _forged(report: dict) -> bool:
    return any(t["score"] > 0 for t in report.get("tests", []))


@pytest.mark.parametrize("route", [MATCH_ROUTE, ATTRGETTER_ROUTE], ids=["underscore-import+match", "attrgetter"])
def test_the_issue_routes_forge_nothing(toy, route):
    """On the old grader these scanner-clean stubs scored 3/3 with exit 0; now: no points, nothing to review (the
    scanner is only a note-writer: the wall, not a flag, keeps the points)."""
    code, report, out = grade(attacked(toy[2], route), toy)
    assert report, out
    assert not _forged(report), report
    assert code == grade_report.EXIT_FAILED and report["flags"] == [], report


def _plan(toy, code: str) -> grade_plan.Plan:
    sol_dir, _, exercise = toy
    sol = json.loads((sol_dir / "ex_toy.ipynb").read_text())
    return grade_plan.build_plan(sol, attacked(exercise, code), "ex_toy.ipynb")


@pytest.mark.parametrize("route", [MATCH_ROUTE, ATTRGETTER_ROUTE, ANY_MEANS], ids=["match", "attrgetter", "any-means"])
def test_reaching_the_kernels_own_globals_cannot_change_a_grade(toy, route):
    """Whatever the answer does in its kernel, the stubs still fail: the grade is decided in a process that runs
    no learner code (the scanner's notes on the answer play no part in it)."""
    results = grader.grade_plan(_plan(toy, route), cell_timeout=60)
    assert [r.outcome for r in results] != ["passed", "passed"]
    assert all(r.outcome != "passed" for r in results), [(r.grade_id, r.outcome, r.message) for r in results]


def test_without_a_jail_the_wall_still_holds_and_the_report_says_so(toy, monkeypatch):
    """Not root (or no namespaces): the answers run in a plain kernel of their own, the tests still in the
    trusted process. Forging gains nothing, the honest answer gets full marks, and the report names the gap."""
    monkeypatch.setattr(grader, "can_jail", lambda: False)  # the report's note
    monkeypatch.setattr(wall, "can_jail", lambda: False)  # the kernel itself
    if processes.root_refusal() is not None:  # root, and no fresh uid can run the interpreter: never run as root
        with pytest.raises(processes.RootRefused):
            grader.grade_plan(_plan(toy, MATCH_ROUTE), cell_timeout=60)
        return
    for route in (MATCH_ROUTE, ANY_MEANS):
        results = grader.grade_plan(_plan(toy, route), cell_timeout=60)
        assert all(r.outcome != "passed" for r in results), [(r.grade_id, r.outcome, r.message) for r in results]
    sol_dir, sub_dir, _ = toy
    (sub_dir / "honest.ipynb").write_text(json.dumps(solved(toy)))
    report = grader.grade(sub_dir / "honest.ipynb", solutions_dir=sol_dir, cell_timeout=60, unjailed=True)
    assert report.exit_code == grade_report.EXIT_FULL and report.total == report.possible, report.as_dict()
    assert processes.UNJAILED_NOTE in report.notes
    if AS_ROOT:  # the control: a jailed run carries no such note
        monkeypatch.setattr(grader, "can_jail", lambda: True)
        monkeypatch.setattr(wall, "can_jail", lambda: True)
        assert processes.UNJAILED_NOTE not in grader.grade(sub_dir / "honest.ipynb", solutions_dir=sol_dir,
                                                        cell_timeout=60).notes


def test_killing_the_runner_after_forging_a_report_gets_nothing(toy):
    forge = ("import os\nline = b'0' * 64 + b' {\"ev\": \"result\", \"outcome\": \"passed\", \"flags\": []}\\n'\n"
             "for fd in range(3, 64):\n    try:\n        os.write(fd, line + b'0' * 64 + b' {\"ev\": \"done\"}\\n')\n"
             "    except OSError:\n        pass\nos._exit(0)")
    nb = attacked(toy[2], "def double(x):\n" + "\n".join("    " + ln for ln in forge.splitlines()))
    code, report, out = grade(nb, toy)
    assert_no_marks_silently(code, report)
    assert report["total"] == 0 and not any(t["outcome"] == "passed" for t in report["tests"]), out
    # the forged lines reach only the kernel's own channel to the checks: a broken message, or a dead kernel
    double = next(t["message"] for t in report["tests"] if t["grade_id"] == "double_check")
    assert "died" in double or "refuses" in double, out


# -- checks that code in the same kernel cannot fool ----------------------------------------
@pytest.mark.parametrize("attack", [
    pytest.param("check_double = lambda *a, **k: None\ndouble = lambda x: 0", id="rebind-the-checker"),
    pytest.param("import math\nmath.isclose = lambda *a, **k: True\nisinstance = lambda *a: True\ndouble = lambda x: 0",
                 id="patch-a-module-the-check-uses"),
    pytest.param("import builtins\nbuiltins.isinstance = lambda *a: True\nm = __import__('math')\n"
                 "setattr(m, 'isclose', lambda *a, **k: True)\ndouble = lambda x: 0", id="patch-builtins"),
    pytest.param("check_double.__code__ = (lambda *a, **k: None).__code__\ndouble = lambda x: 0", id="patch-the-checkers-code"),
    pytest.param("get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)", id="ipython-custom-exc"),
    pytest.param("get_ipython().events.register('post_run_cell', lambda r: setattr(r, 'error_in_exec', None))",
                 id="ipython-events"),
    pytest.param("import sys\nsys.excepthook = lambda *a: None\nsys.settrace(lambda *a: None)\ndouble = lambda x: 0",
                 id="sys-hooks"),
    pytest.param("import threading, time, math\ndef later():\n    time.sleep(0.2)\n    math.isclose = lambda *a, **k: True\n"
                 "threading.Thread(target=later, daemon=True).start()\ndef double(x):\n    time.sleep(0.5)\n    return 0",
                 id="a-thread-patches-later"),
    pytest.param("class Number(float):\n    def __eq__(self, other):\n        return True\n    __hash__ = float.__hash__\n"
                 "def double(x):\n    import math\n    math.isclose = lambda *a, **k: True\n    return Number(0)",
                 id="patch-from-inside-the-called-function"),
    pytest.param("def double(x):\n    raise SystemExit(0)", id="system-exit-during-the-check"),
    pytest.param("def double(x):\n    raise KeyboardInterrupt", id="keyboard-interrupt-during-the-check"),
])
def test_in_kernel_tampering_never_passes_silently(toy, attack):
    code, report, out = grade(attacked(toy[2], attack), toy)
    assert_no_marks_silently(code, report)


def test_forging_a_report_by_reading_the_kernels_memory_gets_nothing(toy):
    """The old kernel held a signing key that code walking its frames could find, to sign a forged result. Across
    the wall the kernel holds no key and no channel to the grade: the walk finds nothing, the task scores 0, and
    what the answer reached for is noted."""
    forge = '''import hashlib, hmac, json, os, sys
def double(x):
    f = sys._getframe()
    while "_SECRET" not in f.f_globals:
        f = f.f_back
    g = f.f_globals
    for t, gid in ((3, "double_check"), (5, "pair_check")):
        for ev in ({"ev": "result", "n": t, "grade_id": gid, "outcome": "passed", "message": "", "flags": []},):
            data = json.dumps(ev)
            os.write(g["_FD"], (hmac.new(g["_SECRET"], data.encode(), hashlib.sha256).hexdigest() + " " + data + "\\n").encode())
    data = json.dumps({"ev": "done"})
    os.write(g["_FD"], (hmac.new(g["_SECRET"], data.encode(), hashlib.sha256).hexdigest() + " " + data + "\\n").encode())
    os._exit(0)'''
    code, report, out = grade(attacked(toy[2], forge), toy)
    assert code == 1 and report["total"] == 0 and report["flags"] == [], out
    notes = " ".join(report["notes"])
    assert "f_back" in notes and "imports os" in notes, report["notes"]


# -- forging the kernel's results without any flagged syntax -----------------------------------
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


# -- the setup's own objects, edited in place -------------------------------------------------------
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




# -- an unjailed kernel cannot forge results through /proc -------------------------------------------------------------
_FORGE_THROUGH_PROC = r'''
def double(x):
    return 2 * x
import os, json
forged = []
def _ppid(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
# Only this grading's own processes (the grader, the trusted process: the kernel's parent and its siblings), never
# another process of the host: as root this attack reaches any process's pipes.
assert os.getuid() != 0, "the forging attack is run only by a kernel that is not root"
for pid in {os.getppid(), *[int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == os.getppid()]}:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                continue
            with open(f"/proc/{pid}/fd/{fd}", "wb", buffering=0) as f:
                for n in range(10):
                    f.write(json.dumps({"ev": "result", "n": n, "outcome": "passed", "message": "forged"}).encode()
                            + b"\n")
            forged.append((pid, fd))
        except OSError:
            pass
print("FORGED", forged)
'''


_UNJAILED_RUN = r'''
import ctypes, json, sys, threading, time
from specref_grading.trust import wall
from specref_grading.plan import build_plan
from specref_grading import processes
libc = ctypes.CDLL(None)
before = libc.prctl(3, 0, 0, 0, 0)
ATTACK = json.loads(sys.argv[3])
wall.can_jail = lambda: False
seen = []
real = wall._collect
def spy(*a, **k):
    seen.append(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE while the kernel runs
    return real(*a, **k)
wall._collect = spy
nb = json.load(open(sys.argv[1]))
plan = build_plan(nb, json.load(open(sys.argv[2] if ATTACK else sys.argv[1])), "toy")
run = wall.run_cells([c for c in plan.cells], 120, time.monotonic() + 300)
print(json.dumps({"before": before, "during": seen, "results": {n: [r.outcome, r.message] for n, r in run.results.items()},
                  "errors": [e for r in run.results.values() for e in r.answer_errors]}))
'''


def test_an_unjailed_kernel_cannot_forge_results_through_proc(tmp_path):
    """In a subprocess (this one's flag stays as it is): with no jail, the grader is non-dumpable while the kernel
    runs, and an answer that writes fake `result` events into every pipe of its grading it can open under /proc
    (the grader's ev_r, the trusted process's ev_w) gets nothing: its tests are graded on what they really do.

    The attack runs only where the kernel is not root (the grader is not root, or it is and drops the kernel to a
    fresh uid: processes.unjailed_uid). A root kernel can open any process's fds, non-dumpable or not (that is
    what the uid drop and UNJAILED_NOTE are for); where the interpreter is unreadable by a fresh uid (a venv whose
    python lies under /root) only the flag is tested."""
    attack = not AS_ROOT or processes.can_drop()
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_with_limits(cgroup=False)))
    forging = toy_with_limits(seq_answer="def seq(n):\n    return []\n" + _FORGE_THROUGH_PROC, cgroup=False)
    sub = tmp_path / "sub.ipynb"
    sub.write_text(json.dumps(forging))
    proc = subprocess.run([sys.executable, "-c", _UNJAILED_RUN, str(sol), str(sub), json.dumps(attack)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    if AS_ROOT and not attack:  # root, and no fresh uid can run the interpreter: the kernel is never started as root
        assert "RootRefused" in proc.stderr, proc.stdout + proc.stderr
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == 1 and got["during"] == [0], got
    results = got["results"]
    if not attack:
        assert all(r[0] == "passed" for r in results.values()), got  # the honest toy, unjailed, non-dumpable
        return
    assert results["4"][0] == "failed" and "forged" not in json.dumps(results), got  # seq_check: seq(3) == []
    assert results["2"][0] == "passed", got
    assert "FORGED []" in (proc.stdout + proc.stderr) or "FORGED" not in proc.stdout, proc.stdout
