"""The grading wall: answers run in a jailed kernel, the tests in a trusted process.

Each attack below is a submission that forges full marks, reads a file it must not read, or learns the
hidden seed on a grader without the wall (run this file with GRADE_PY pointing at such a grader to see
it succeed); on this grader it gains nothing. The toy exercise
(tests/test_grade_security.py) keeps these fast: no torch in its setup.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
from test_grade_security import AS_ROOT, answer, attacked, grade, make_exercise, solved, toy, toy_solution  # noqa: F401

from specref_grading import grade as grader
from specref_grading import jail, processes
from specref_grading import plan as grade_plan
from specref_grading import report as grade_report
from specref_grading.scan import scan
from specref_grading.trust import wall

REPO = Path(__file__).resolve().parents[1]

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


# A submission that tries to take the host from the submissions graded beside it: it reports the cgroups it
# sits in, how many MB it could write to its /tmp (files of 128 MB, under the 256 MB file-size limit) and
# how many processes it could fork.
_GREEDY = """import os, time
joined = sorted(line.split(":")[1] for line in open("/proc/self/cgroup").read().splitlines()
                if "/specref-grade/run-" in line)
written = 0
try:
    for i in range(16):
        with open(f"/tmp/fill{i}", "wb") as f:
            for _ in range(128):
                f.write(bytes(1 << 20))
                f.flush()
                written += 1
except OSError:
    pass
forked = 0
try:
    for _ in range(400):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forked += 1
except OSError:
    pass
raise ValueError(f"joined={joined} written_mb={written} forked={forked}")
"""


@pytest.mark.skipif(not AS_ROOT, reason="the jail needs root")
def test_a_kernel_cannot_fill_the_disk_or_take_the_cpus_of_the_others(toy):
    """The jailed kernel's /tmp is a small tmpfs, not the host's disk; on a cgroup-v1 host its processes share
    one cgroup per controller: one CPU's time, one memory budget, a bounded process count."""
    code, report, out = grade(attacked(toy[2], _GREEDY), toy, timeout=300)
    message = " ".join(t["message"] for t in report.get("tests", []))
    found = re.search(r"joined=\[(.*?)\] written_mb=(\d+) forked=(\d+)", message)
    assert found, out
    joined, written, forked = found.group(1), int(found.group(2)), int(found.group(3))
    assert 0 < written <= jail.TMP_MB, message  # the tmpfs ran out; the host's disk was never written
    assert not _forged(report)
    if not os.access("/sys/fs/cgroup/cpu", os.W_OK):
        pytest.skip("no writable cgroup-v1 controllers here: the per-submission cgroups are not made")
    for controller in ("cpu", "memory", "pids"):  # (cpu may share its line with cpuacct)
        assert controller in re.split(r"[',\s]+", joined), message
    assert forked < int(jail.cgroup_limits(1)["pids"]["pids.max"]), message


def _reader(path: Path) -> str:
    return ('import numpy as np\n'
            f'raise ValueError("leaked: " + str(np.genfromtxt({str(path)!r}, dtype=str, delimiter="|")))\n')


@pytest.mark.skipif(not AS_ROOT, reason="the jail needs root (namespaces, a fresh uid)")
def test_a_root_only_file_and_a_sibling_submission_are_unreadable(toy, tmp_path):
    """A root-only file (mode 600 in a mode-700 folder) and another student's notebook in the same folder:
    the old kernel read both (CAP_DAC_READ_SEARCH; np.genfromtxt was not flagged) and raised them back."""
    secret = tmp_path / "root_only.txt"
    secret.write_text("ROOT-SECRET-4711")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o700)
    sub_dir = toy[1]
    bob = solved(toy)
    answer(bob, "why")["source"] = "BOB-SECRET-0815"
    (sub_dir / "bob.ipynb").write_text(json.dumps(bob))
    for path, word in ((secret, "ROOT-SECRET-4711"), (sub_dir / "bob.ipynb", "BOB-SECRET-0815")):
        code, report, out = grade(attacked(toy[2], _reader(path)), toy)
        assert report, out
        assert word not in json.dumps(report) and word not in out, (path, report)
        assert any("genfromtxt" in n for n in report["notes"]), report  # noted for the instructor


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


@pytest.mark.skipif(not AS_ROOT, reason="the jail needs root")
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


# -- the wire itself (specref_grading/trust/): what crosses, what is refused ---------------------------------
@pytest.fixture
def wire():
    """A trusted Peer here, talking to a forked 'kernel' Peer that serves `get` of a few learner objects."""
    import torch

    from specref_grading.trust.calls import Peer
    from specref_grading.trust.trusted_policy import TrustedPolicy
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the kernel side: learner-style functions that poke at what the checks pass them
        os.close(a_r)
        os.close(a_w)

        def poke(obj, what):
            if what == "closure":
                return obj._peer.request("getattr", obj._hid, "__closure__")  # a forged request, past the proxy
            if what == "globals":
                return obj._peer.request("getattr", obj._hid, "__globals__")
            if what == "public-of-function":
                return obj.seed_table
            if what == "call":
                return obj(3)
            raise ValueError(what)

        def scale_in_place(t):
            t.mul_(2)
            return None

        def draw(g):
            return torch.rand(3, generator=g).tolist(), g.initial_seed()

        learner = {"poke": poke, "scale_in_place": scale_in_place, "draw": draw}
        Peer(b_r, b_w, "jail", ops={"get": learner.__getitem__}).serve_forever()
        os._exit(0)
    os.close(b_r)
    os.close(b_w)
    peer = Peer(a_r, a_w, "trusted", timeout=30, policy=TrustedPolicy())
    yield peer
    os.close(a_w)
    os.close(a_r)
    os.waitpid(pid, 0)


def test_arrays_changed_in_place_are_copied_back_and_generators_stay_in_step_without_their_seed(wire):
    import torch
    t = torch.ones(3, dtype=torch.float64)
    wire.request("get", "scale_in_place")(t)
    assert t.tolist() == [2.0, 2.0, 2.0]  # the check sees what the learner did to its input
    g, twin = torch.Generator().manual_seed(918273), torch.Generator().manual_seed(918273)
    drawn, seed_seen = wire.request("get", "draw")(g)
    assert drawn == torch.rand(3, generator=twin).tolist() and seed_seen != 918273
    assert torch.rand(2, generator=g).tolist() == torch.rand(2, generator=twin).tolist()  # g advanced here too


# Grades in kernels whose environment specref_grading sets itself: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
