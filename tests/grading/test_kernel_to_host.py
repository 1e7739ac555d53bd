"""Kernel to host: the learner's kernel reads no solution, grader or other submission, writes nothing, and
takes no more than its share.

No learner code runs as root, ever: without a jail nothing is graded unless --unjailed asks, and then as a fresh
uid; the trusted process drops root too. The jail (namespaces, a read-only root of bind mounts, hidden installs, a
private /tmp, rlimits) holds from a checkout under /tmp; a timeout or a dead kernel ends every process of the
submission. The run's cgroups (v1 and v2) lie under the grader's own, and workers are sized by the caps:
jobs x (kernel + its /tmp + trusted caps) never exceeds the memory available.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specref_grading import classrun, jail, processes
from specref_grading import grade as grader
from specref_grading.report import Report
from specref_grading.trust import wall

from .conftest import (
    AS_ROOT,
    REPO,
    _cell,
    answer,
    as_root,
    assert_no_marks_silently,
    attacked,
    grade,
    jailed,
    scores,
    solved,
    toy_solution,
    toy_with_limits,
)


def toy_one(check: str = "assert one() == 1") -> dict:
    """one() (1 point); the test cell runs in the trusted process, so `check` may look at that process too."""
    return {"cells": [_cell("s", "import os"),
                      _cell("a", "def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "one", 0, True),
                      _cell("t", check, "one_check", 1)],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def no_jail(monkeypatch):
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    monkeypatch.setattr(wall, "can_jail", lambda: False)


def _no_kernel(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel was started")
    monkeypatch.setattr(grader, "grade_plan", refuse)


def test_without_a_jail_nothing_is_graded_unless_asked(tmp_path, no_jail, monkeypatch):
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_one()))
    _no_kernel(monkeypatch)
    report = grader.grade(sol, sol, seed=1)
    assert report.error == grader.UNJAILED_REFUSED and report.exit_code == grader.EXIT_UNGRADABLE
    assert "--unjailed" in report.error


def test_asked_for_unjailed_as_root_with_no_uid_to_drop_to_it_is_refused(tmp_path, no_jail, monkeypatch):
    """The red team's host: root, no namespaces, a venv under /root that no fresh uid can run. Before, the kernel
    ran as root and read the solutions; now nothing runs, and the report says how to install instead."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setitem(processes._DROP, 0, False)
    monkeypatch.setattr(processes, "_as_root", lambda: True)
    monkeypatch.setattr(processes.shutil, "which", lambda name: f"/usr/bin/{name}")
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_one()))
    _no_kernel(monkeypatch)
    report = grader.grade(sol, sol, seed=1, unjailed=True)
    assert report.error.startswith("refused: the learner's code would run as root"), report.error
    assert "/opt/specref-venv" in report.error
    with pytest.raises(processes.RootRefused):  # and the wall's own call refuses too, whoever calls it
        processes.unjailed_uid()


def test_the_command_lines_refuse_without_unjailed(tmp_path):
    """Run where no jail can be made (can_jail patched off in a child interpreter): exit 2 with the reason."""
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_one()))
    code = ("import sys\nfrom specref_grading import grade\nfrom specref_grading.trust import wall\n"
            "grade.can_jail = wall.can_jail = lambda: False\n"
            "sys.exit(grade.main([sys.argv[1], '--solution', sys.argv[1], '--seed', '1']))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(sol)], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == grader.EXIT_UNGRADABLE and "--unjailed" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "class").mkdir()
    code = ("import sys\nfrom specref_grading import classrun, grade\nfrom specref_grading.trust import wall\n"
            "grade.can_jail = wall.can_jail = lambda: False\nsys.exit(classrun.main(['grade', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "class")], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == grader.EXIT_UNGRADABLE and "--unjailed" in proc.stderr, proc.stdout + proc.stderr


def test_a_jailed_run_regrades_what_an_unjailed_run_graded(tmp_path, monkeypatch):
    """The jail mode is in each submission's key: an unjailed 12/12 is not kept by a later jailed resume."""
    sol, sub = tmp_path / "solutions", tmp_path / "class"
    sol.mkdir()
    sub.mkdir()
    (sub / "a.ipynb").write_text(json.dumps(toy_one()))
    graded: list[bool] = []

    def fake_grade(path, solutions_dir=None, unjailed=False, **kw):
        graded.append(grader.can_jail())
        return Report(str(path), error="not graded in this test")
    monkeypatch.setattr(classrun, "grade", fake_grade)
    monkeypatch.setattr(classrun, "grader_version", lambda: "k")
    monkeypatch.setattr(grader, "root_refusal", lambda: None)
    run = lambda **kw: classrun.run(sub, tmp_path / "out" / "book.csv", jobs=1, seed=5,  # noqa: E731
                                    solutions_dir=sol, echo=lambda line: None, **kw)
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    with pytest.raises(classrun.GradeError, match="--unjailed"):
        run()
    run(unjailed=True)
    run(unjailed=True)  # unchanged, unjailed again: kept
    monkeypatch.setattr(grader, "can_jail", lambda: True)
    run()
    assert graded == [False, True]


@pytest.mark.skipif(not AS_ROOT or shutil.which("id") is None, reason="dropping to a fresh uid needs root")
def test_the_trusted_setup_drops_to_the_uid_drawn(monkeypatch):
    """trusted_setup (the trusted process's preexec) ends as the fresh uid prepare_trusted_uid drew: no groups,
    no_new_privs."""
    monkeypatch.setitem(processes._DROP, 0, True)
    uid = processes.prepare_trusted_uid()
    assert uid is not None and uid != 0
    me = os.getpid()
    try:
        out = subprocess.run(["sh", "-c", "id -u; id -G; grep NoNewPrivs /proc/self/status"], capture_output=True,
                             text=True, timeout=60, cwd="/",
                             preexec_fn=lambda: processes.trusted_setup(me, None)).stdout.split()
    finally:
        processes._TRUSTED_UID.clear()
    assert out[:2] == [str(uid), str(uid)] and out[-1] == "1", out


@as_root
def test_a_grading_runs_its_checks_as_a_fresh_uid_where_one_can_run_the_interpreter(tmp_path, monkeypatch):
    """End to end: the test cell (the trusted side) sees a uid that is not root, and still grades full marks."""
    if not processes.can_drop():
        pytest.skip(f"no fresh uid can run {sys.executable} on this host (a private folder above it): the trusted "
                    "process stays root here, and the drop itself is tested by test_the_trusted_setup_drops_...")
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_one("assert one() == 1\nassert os.getuid() != 0, os.getuid()")))
    report = grader.grade(sol, sol, seed=1, cell_timeout=120)
    assert report.total == report.possible == 1, report.text()


# -- isolation ---------------------------------------------------------------------------------
@pytest.mark.grader
def test_files_beside_the_notebook_are_not_imported(toy):
    sub_dir = toy[1]
    (sub_dir / "conftest.py").write_text("import pytest\n@pytest.hookimpl(tryfirst=True)\n"
                                         "def pytest_runtest_makereport(item, call):\n    call.excinfo = None\n")
    (sub_dir / "pytest.py").write_text("raise SystemExit(0)\n")
    (sub_dir / "math.py").write_text("def isclose(*a, **k):\n    return True\n")
    (sub_dir / "sitecustomize.py").write_text("import builtins\nbuiltins.AssertionError = Warning\n")
    (sub_dir / "specref").mkdir()
    (sub_dir / "specref" / "__init__.py").write_text("residual = lambda p, q: p\n")
    nb = attacked(toy[2], "import math")
    nb = attacked(nb, "double = lambda x: 0")
    code, report, out = grade(nb, toy)
    assert_no_marks_silently(code, report)


def _tree_hash(*folders: Path) -> str:
    h = hashlib.sha256()
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.mark.grader
@as_root
def test_the_kernel_cannot_write_the_repository_the_solutions_or_other_submissions(toy):
    sol_dir, sub_dir, exercise = toy
    other = sub_dir / "bob.ipynb"
    other.write_text(json.dumps(toy_solution()))
    # New files only in the repository (a grader that lets them through must not damage it); appends to
    # the toy solution and to another learner's submission.
    targets = [REPO / "solutions" / "zz_attack.ipynb", REPO / "specref" / "zz_attack.py",
               sol_dir / "ex_toy.ipynb", other, REPO / ".venv" / "zz_attack"]
    before = (_tree_hash(REPO / "solutions", REPO / "specref"), sol_dir.joinpath("ex_toy.ipynb").read_bytes(),
              other.read_bytes())
    code_ = (f"import os\nfor t in {[str(t) for t in targets]!r}:\n    try:\n        open(t, 'a').write('x')\n"
             "    except OSError:\n        pass\n")
    nb = attacked(exercise, code_)
    try:
        code, report, out = grade(nb, toy)
        after = (_tree_hash(REPO / "solutions", REPO / "specref"), sol_dir.joinpath("ex_toy.ipynb").read_bytes(),
                 other.read_bytes())
        assert after == before, "the kernel changed files it must not touch"
        assert not any(t.exists() for t in targets[:2] + [targets[-1]])
        assert_no_marks_silently(code, report)
        assert any("double_answer" in n and "open" in n for n in report["notes"]), report  # noted, not a gate
    finally:
        for t in targets[:2] + [targets[-1]]:
            t.unlink(missing_ok=True)


def _tagged_processes(tag: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if tag.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.grader
@pytest.mark.slow
def test_a_timeout_kills_every_process_of_the_submission(toy):
    tag = f"specref-survivor-{os.getpid()}-{time.time_ns()}"
    code_ = (f"import os, subprocess, sys, time\n"
             f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{tag}'], start_new_session=True)\n"
             f"if os.fork() == 0:\n    os.setsid()\n    os.execv(sys.executable, [sys.executable, '-c', "
             f"'import time; time.sleep(120)', '{tag}'])\n"
             f"time.sleep(0.5)\nwhile True:\n    pass")
    nb = attacked(toy[2], code_)
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--cell-timeout", "4")
    try:
        assert time.monotonic() - t0 < 60
        assert_no_marks_silently(code, report)
        assert "timed out" in out and "answer cell 'double_answer'" in out
        time.sleep(0.3)
        assert _tagged_processes(tag) == [], "a process of the submission survived the grading run"
    finally:
        for pid in _tagged_processes(tag):
            os.kill(pid, 9)


@pytest.mark.grader
def test_a_dead_kernel_is_reported_at_once(toy):
    """A kernel the submission's own code kills is that submission's failure (exit 1, its cause in each test's
    message), not "could not be graded" (exit 2, which --retry takes for a fault of the grader)."""
    nb = attacked(toy[2], "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--cell-timeout", "60")
    assert time.monotonic() - t0 < 30
    assert code == 1 and report["total"] == 0 and not report["error"], out
    assert all(t["outcome"] == "failed" for t in report["tests"]), out
    assert "the kernel died while running answer cell 'double_answer' (signal 9)" in out


@pytest.mark.grader
def test_the_whole_run_has_a_time_limit(toy):
    nb = attacked(toy[2], "import time\ntime.sleep(30)")
    t0 = time.monotonic()
    code, report, out = grade(nb, toy, "alice.ipynb", "--timeout", "3")
    assert time.monotonic() - t0 < 20
    assert report["total"] == 0 and code in (1, 3), out
    assert "timed out" in out


def _forged(report: dict) -> bool:
    return any(t["score"] > 0 for t in report.get("tests", []))


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


@pytest.mark.grader
@as_root
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


@pytest.mark.grader
@as_root
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


_RESERVE = ("def double(x):\n    import numpy\n    try:\n        numpy.empty({gib} << 30, dtype=numpy.uint8)\n"
            "    except MemoryError:\n        return 2 * x\n    return -1")


@pytest.mark.grader
@pytest.mark.parametrize("gib, args", [(12, ()), (2, ("--memory", "1024"))], ids=["default", "--memory"])
def test_a_kernel_cannot_take_more_memory_than_its_limit(toy, gib, args):
    """No memory limit: one kernel could take all of the host's memory. Reserved, never touched, the memory
    probed here costs nothing; double() answers right only if the reservation is refused."""
    nb = attacked(toy[2], _RESERVE.format(gib=gib))
    code, report, out = grade(nb, toy, "alice.ipynb", *args)
    assert scores(report)["double_check"] == 2, out




# -- /tmp: a checkout and a venv under /tmp are jailed; the kernel's /tmp stays private --------------------------
_LIST_TMP = '''import os, sys
print(json.dumps({"tmp": sorted(os.listdir("/tmp")), "marker": open(sys.argv[-1]).read().strip(),
                  "uid": os.getuid(), "base": os.path.exists(sys.argv[-2])}))
'''


@pytest.mark.grader
@jailed
def test_launch_binds_read_only_paths_under_tmp_inside_the_kernels_own_empty_tmp():
    """launch mounts the kernel's /tmp tmpfs first, then the read-only binds: one under /tmp is seen at its path;
    nothing else of the host's /tmp is (not a host file, not the grader's work folder specref-grade-*)."""
    host = Path(tempfile.mkdtemp(prefix="specref-limits-"))  # under /tmp, as a venv in /tmp would be
    secret = Path(tempfile.mkstemp(prefix="specref-host-secret-", dir="/tmp")[1])
    base = Path(tempfile.mkdtemp(prefix="specref-grade-"))  # as wall.run_cells makes it
    try:
        assert str(host).startswith("/tmp/") and str(base).startswith("/tmp/")
        (host / "venv").mkdir()
        (host / "venv" / "marker").write_text("bound\n")
        os.chmod(host, 0o755)
        source = "import json\n" + _LIST_TMP
        config = {"root": str(base / "root"), "uid": processes._free_uid(), "memory_mb": 512,
                  "read_only": jail.read_only_paths() + [str(host / "venv")], "rfd": 0, "wfd": 1,
                  "python": sys.executable, "source": source, "env": {"PATH": "/usr/bin"}}
        # the kernel's argv after the fds: the work folder (must not exist inside) and the bound marker file
        config["source"] = source.replace("sys.argv[-2]", repr(str(base))).replace("sys.argv[-1]",
                                                                                   repr(str(host / "venv/marker")))
        cmd = jail.command(config)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["marker"] == "bound" and seen["uid"] == config["uid"]
        # only the top folders of the bound paths under /tmp (this one, and the checkout's own venv where the
        # checkout lies under /tmp): no host file, no work folder
        bound = {Path(p).resolve().relative_to("/tmp").parts[0] for p in config["read_only"]
                 if Path(p).resolve().is_relative_to("/tmp")}
        assert host.name in bound and seen["tmp"] == sorted(bound), seen
        assert secret.name not in seen["tmp"] and base.name not in seen["tmp"] and not seen["base"]
    finally:
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        secret.unlink(missing_ok=True)


@pytest.mark.grader
def test_launch_refuses_a_root_inside_a_read_only_path(tmp_path):
    """A read-only bind that holds the grader's work folder would show the kernel its logs: refused before any mount."""
    with pytest.raises(SystemExit, match="lies inside"):
        jail.launch({"root": str(tmp_path / "work" / "root"), "uid": 1, "read_only": ["/usr", str(tmp_path)]})
    assert not (tmp_path / "work").exists()


_GRADE_FROM_TMP = r'''set -e
D="$1"; shift
mkdir -p "$D/main"
mount --bind "$REPO" "$D/main"
if [ -n "$FINDER" ]; then
  # The venv as one overlay mount (the jail binds it without its submounts) with the edited finder on top.
  rel="${FINDER#$REPO/.venv/}"
  mkdir -p "$D/ov" && mount -t tmpfs tmpfs "$D/ov" && mkdir -p "$D/ov/u/$(dirname "$rel")" "$D/ov/w"
  cp "$FINDER_COPY" "$D/ov/u/$rel"
  mount -t overlay overlay -o "lowerdir=$REPO/.venv,upperdir=$D/ov/u,workdir=$D/ov/w" "$D/main/.venv"
fi
cd "$D"
for nb in "$@"; do
  "$D/main/.venv/bin/python" -c 'import sys; from specref_grading import jail; print("PATHS", jail.read_only_paths())'
  "$D/main/.venv/bin/python" -m specref_grading.grade "${nb%%:*}" --solution "${nb#*:}" --seed 1 --json || true
  echo "=== END"
done
'''


@pytest.mark.grader
@pytest.mark.grader
@jailed
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="needs the repository's .venv")
def test_grading_with_the_checkout_and_venv_under_tmp(tmp_path):
    """The checkout (and so its .venv and specref) bind-mounted under /tmp in a private mount namespace, the
    grader run with that interpreter: the jail binds them at their /tmp paths; ex02 (solution as submission,
    seed 1) gets full marks; a toy answer that lists /tmp sees only the top folder of those binds."""
    assert str(tmp_path).startswith("/tmp/")  # the submissions and the output sit under /tmp too
    top = Path(tempfile.mkdtemp(prefix="specref-tmpcheckout-"))
    finder = next(iter(sorted((REPO / ".venv").glob("lib/python*/site-packages/__editable__*specref*finder.py"))),
                  None)
    env = dict(os.environ, REPO=str(REPO), FINDER="", FINDER_COPY="")
    env.pop("PYTHONPATH", None)
    if finder is not None:  # the editable install maps specref to the checkout's path: map it to the /tmp one
        copy = tmp_path / "finder.py"
        copy.write_text(finder.read_text().replace(repr(str(REPO))[:-1], repr(str(top / "main"))[:-1]))
        env.update(FINDER=str(finder), FINDER_COPY=str(copy))
    lister = toy_with_limits(double_answer="def double(x):\n    import os\n    raise ValueError('TMP=' + repr(sorted(os.listdir('/tmp'))))")
    (tmp_path / "lister.ipynb").write_text(json.dumps(lister))
    (tmp_path / "toy.ipynb").write_text(json.dumps(toy_with_limits()))
    ex02 = top / "main" / "solutions" / "ex02_accept_reject.ipynb"
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _GRADE_FROM_TMP, "sh",
                               str(top), f"{ex02}:{ex02}", f"{tmp_path / 'lister.ipynb'}:{tmp_path / 'toy.ipynb'}"],
                              capture_output=True, text=True, timeout=900, env=env)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    out = proc.stdout + proc.stderr
    parts = proc.stdout.split("=== END")
    assert len(parts) == 3, out
    paths = re.search(r"PATHS (\[.*\])", parts[0]).group(1)
    assert f"'{top}/main/.venv'" in paths, paths  # the interpreter's environment really lies under /tmp
    report = json.loads(parts[0][parts[0].index("{"):])
    assert report["total"] == report["possible"] == 8, out
    lister_report = json.loads(parts[1][parts[1].index("{"):])
    listed = re.search(r"TMP=(\[.*?\])", json.dumps(lister_report)).group(1).replace('\\"', '"')
    assert eval(listed) == [top.name], listed


# -- cgroups v1 and v2 ---------------------------------------------------------------------------------------------
@pytest.mark.grader
def test_cgroup_v1_with_a_fake_root(tmp_path):
    for ctrl in ("cpu", "memory", "pids"):
        (tmp_path / ctrl).mkdir()
    assert jail.cgroup_version(str(tmp_path)) == 1
    dirs = jail.cgroup_dirs("run-t", str(tmp_path), own={})  # a grader at the hierarchy's root
    assert dirs == {c: str(tmp_path / c / "specref-grade" / "run-t") for c in ("cpu", "memory", "pids")}
    assert jail.join_cgroups("run-t", 100, root=str(tmp_path), pid=4242, own={}) == ["cpu", "memory", "pids"]
    read = lambda c, f: (tmp_path / c / "specref-grade" / "run-t" / f).read_text()
    assert read("cpu", "cpu.cfs_quota_us") == read("cpu", "cpu.cfs_period_us") == "100000"
    assert read("memory", "memory.limit_in_bytes") == str(100 << 20) and read("pids", "pids.max") == "128"
    assert all(read(c, "cgroup.procs") == "4242" for c in ("cpu", "memory", "pids"))


@pytest.mark.grader
def test_cgroup_v2_with_a_fake_root(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cpu").mkdir()  # a folder named like a v1 controller does not make it v1
    assert jail.cgroup_version(str(tmp_path)) == 2
    leaf = tmp_path / "specref-grade" / "run-t"
    assert set(jail.cgroup_dirs("run-t", str(tmp_path), own={}).values()) == {str(leaf)}
    assert jail.join_cgroups("run-t", 100, root=str(tmp_path), pid=4242, pids=64, own={}) == ["cpu", "memory", "pids"]
    assert (leaf / "cpu.max").read_text() == "100000 100000"
    assert (leaf / "memory.max").read_text() == str(100 << 20) and (leaf / "pids.max").read_text() == "64"
    assert (leaf / "cgroup.procs").read_text() == "4242"
    assert (tmp_path / "cgroup.subtree_control").read_text().startswith("+")  # controllers enabled downwards
    assert (tmp_path / "specref-grade" / "cgroup.subtree_control").read_text().startswith("+")
    assert not (tmp_path / "specref-grade" / "cgroup.procs").exists()  # v2: no process outside the leaves


@pytest.mark.grader
def test_no_cgroups_at_all(tmp_path):
    assert jail.cgroup_version(str(tmp_path)) == 0 and jail.join_cgroups("run-t", 100, root=str(tmp_path)) == []


def _join_for_real(version: int) -> None:
    name = f"run-test-{os.getpid()}"
    child = subprocess.Popen(["sleep", "60"])
    try:
        joined = jail.join_cgroups(name, 64, pid=child.pid)
        if not joined:
            pytest.skip("this host's cgroups are not writable here")
        assert set(joined) == {"cpu", "memory", "pids"}, joined
        member = Path(f"/proc/{child.pid}/cgroup").read_text()
        assert f"/specref-grade/{name}" in member, member
        if version == 2:
            assert f"0::{jail.grader_cgroup(jail.own_cgroups()[''])}/specref-grade/{name}".replace("//", "/") in member
    finally:
        child.kill()
        child.wait()
    time.sleep(0.1)
    jail.remove_cgroups(name)
    assert not any(os.path.exists(d) for d in jail.cgroup_dirs(name).values())


@pytest.mark.grader
@as_root
def test_a_real_v1_join_where_the_host_has_v1():
    if jail.cgroup_version() != 1:
        pytest.skip(f"this host's cgroups are not v1 (version {jail.cgroup_version()})")
    _join_for_real(1)


@pytest.mark.grader
@as_root
def test_a_real_v2_join_where_the_host_has_v2():
    if jail.cgroup_version() != 2:
        pytest.skip(f"this host has no unified (v2) cgroup hierarchy with controllers at {jail.CGROUP_ROOT} "
                    f"(cgroup_version() = {jail.cgroup_version()}): the v2 path is tested with a fake root only")
    _join_for_real(2)


# -- workers sized by memory ---------------------------------------------------------------------------------------
@pytest.mark.grader
@pytest.mark.parametrize("cores, memory_mb, jobs", [
    (16, 16 * processes.submission_cap_mb(wall.MEMORY_MB), 16),  # memory for all at their caps: one per core
    (16, 4 * processes.submission_cap_mb(wall.MEMORY_MB) + 100, 4),  # memory for four submissions at their caps
    (4, 1000, 1),           # never fewer than one
    (8, None, 8),           # memory unknown: one per core
])
def test_default_jobs_is_the_lesser_of_cores_and_memory(monkeypatch, cores, memory_mb, jobs):
    monkeypatch.setattr(classrun, "_cores", lambda: cores)
    monkeypatch.setattr(classrun, "_memory_available_mb", lambda: memory_mb)
    assert classrun.default_jobs() == jobs


@pytest.mark.grader
def test_the_memory_available_is_read_from_the_host():
    mb = classrun._memory_available_mb()
    assert mb is None or mb > 0
    assert 1 <= classrun.default_jobs() <= classrun._cores()


# -- without a jail -----------------------------------------------------------------------------------------------
@pytest.mark.grader
def test_the_unjailed_note_says_what_cannot_be_promised():
    note = processes.UNJAILED_NOTE
    for words in ("not jailed", "solutions", "reference answers", "hidden tests", "checks", "hidden seed",
                  "trusted process", "grade as root"):
        assert words in note, words


@pytest.mark.grader
def test_without_a_jail_an_honest_toy_gets_full_marks_and_the_note(tmp_path, monkeypatch):
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    monkeypatch.setattr(wall, "can_jail", lambda: False)
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_with_limits(cgroup=False)))
    report = grader.grade(sol, sol, seed=1, cell_timeout=120, unjailed=True)
    if processes.root_refusal() is not None:  # root, and no fresh uid can run the interpreter: never run as root
        assert report.error == processes.root_refusal(), report.text()
        return
    assert report.total == report.possible == 4, report.text()
    assert processes.UNJAILED_NOTE in report.notes


def _reachable_by_others(path: str) -> bool:
    """Whether a user with no privilege and no group can reach `path` (each folder above it searchable by others)."""
    p = Path(os.path.realpath(path))
    return all(os.stat(d).st_mode & 0o001 for d in [*reversed(p.parents)] if d != p) and bool(
        os.stat(p).st_mode & 0o004)


@pytest.mark.grader
@pytest.mark.skipif(not AS_ROOT or shutil.which("setpriv") is None, reason="runs the grader as nobody, from root")
def test_the_grader_run_as_a_plain_user_grades_and_says_so(tmp_path):
    """The grader as uid 65534 (no root: no jail, no cgroup): full marks for the honest toy, the note in its report."""
    for path in (sys.executable, sys.prefix, str(REPO / "specref_grading")):
        if not _reachable_by_others(path):
            pytest.skip(f"{os.path.realpath(path)} is not reachable by a plain user on this host (a folder above it "
                        "is private): the unjailed run is tested with can_jail patched to False")
    folder = Path(tempfile.mkdtemp(prefix="specref-nobody-"))
    try:
        os.chmod(folder, 0o777)
        sol = folder / "ex_toy.ipynb"
        sol.write_text(json.dumps(toy_with_limits(cgroup=False)))
        os.chmod(sol, 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8"}
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "specref_grading.grade", str(sol), "--solution", str(sol), "--seed", "1", "--json",
                               "--unjailed"],
                              capture_output=True, text=True, timeout=300, cwd=folder, env=env)
        report = json.loads(proc.stdout)
        assert report["total"] == report["possible"] == 4, proc.stdout + proc.stderr
        assert processes.UNJAILED_NOTE in report["notes"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.grader
def test_hidden_paths_covers_an_installed_grader_and_specref_under_a_bound_path(tmp_path):
    """A non-editable install: site-packages (under the bound venv) holds specref_grading and the real specref.
    Both are hidden, at the path they are bound at (a venv bound through a symlink too); the exercise's copy's
    place (`keep`) and anything outside the binds are not."""
    site = tmp_path / "venv" / "lib" / "site-packages"
    for name in ("specref_grading", "specref", "torch"):
        (site / name).mkdir(parents=True)
    other = tmp_path / "checkout" / "specref"
    other.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "venv")
    bound = [str(tmp_path / "venv"), str(tmp_path / "link")]
    hidden = jail.hidden_paths(bound, search=[str(site), str(tmp_path / "checkout")],
                               grader=[str(site / "specref_grading")])
    assert sorted(hidden) == sorted([str(site / "specref_grading"), str(site / "specref"),
                                     str(tmp_path / "link/lib/site-packages/specref_grading"),
                                     str(tmp_path / "link/lib/site-packages/specref")]), hidden
    kept = jail.hidden_paths(bound, keep=[str(site / "specref")], search=[str(site)], grader=[])
    assert kept == [str(site / "specref_grading"), str(tmp_path / "link/lib/site-packages/specref_grading")], kept
    assert jail.hidden_paths(["/usr"], search=[str(site)], grader=[str(site / "specref_grading")]) == []


@pytest.mark.grader
def test_the_grader_as_installed_here_is_not_under_a_bound_path_or_is_hidden():
    import importlib.util

    from specref_grading.trust import kernel_tree
    ro = jail.read_only_paths(with_specref=False)
    hidden = jail.hidden_paths(ro, keep=[str(kernel_tree.specref_dir())])
    spec = importlib.util.find_spec("specref_grading")
    grader = os.path.realpath(os.path.dirname(spec.origin) if spec.origin else list(spec.submodule_search_locations)[0])
    under = [p for p in ro if os.path.commonpath([grader, os.path.realpath(p)]) == os.path.realpath(p)]
    assert not under or grader in hidden, (under, hidden)


_READ_HIDDEN = '''import os, sys
def look(p):
    try:
        return sorted(os.listdir(p))
    except OSError as e:
        return type(e).__name__
print(json.dumps({"hidden": look(HIDDEN), "kept": look(KEPT)}))
'''


@pytest.mark.grader
@jailed
def test_launch_hides_a_folder_under_a_bound_path():
    """A folder under a read-only bind (as site-packages/specref_grading under the venv) is an empty folder inside."""
    host = Path(tempfile.mkdtemp(prefix="specref-hide-", dir="/var/tmp"))
    base = Path(tempfile.mkdtemp(prefix="specref-grade-"))
    try:
        for name in ("specref_grading", "other"):
            (host / "site" / name).mkdir(parents=True)
            (host / "site" / name / "checks.py").write_text("SECRET = 1\n")
        os.chmod(host, 0o755)
        source = "import json\n" + _READ_HIDDEN.replace("HIDDEN", repr(str(host / "site/specref_grading"))).replace(
            "KEPT", repr(str(host / "site/other")))
        config = {"root": str(base / "root"), "uid": processes._free_uid(), "memory_mb": 512,
                  "read_only": jail.read_only_paths() + [str(host / "site")], "rfd": 0, "wfd": 1,
                  "python": sys.executable, "source": source, "env": {"PATH": "/usr/bin"},
                  "hide": jail.hidden_paths([str(host / "site")], search=[str(host / "site")], grader=[])}
        assert config["hide"] == [str(host / "site/specref_grading")]
        proc = subprocess.run(jail.command(config), capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen == {"hidden": [], "kept": ["checks.py"]}, seen
    finally:
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


PROC_V1 = "4:memory:/batch/job7\n2:cpu,cpuacct:/batch/job7\n8:pids:/batch/job7\n0::/\n"


PROC_V2 = "0::/grading.slice/instructor.scope\n"


def test_own_cgroups_reads_v1_controllers_and_the_v2_path():
    own = jail.own_cgroups(PROC_V1)
    assert (own["memory"], own["cpu"], own["cpuacct"], own["pids"], own[""]) == (
        "/batch/job7", "/batch/job7", "/batch/job7", "/batch/job7", "/")
    assert jail.own_cgroups(PROC_V2) == {"": "/grading.slice/instructor.scope"}


def test_a_process_of_the_run_or_the_graders_leaf_names_the_graders_cgroup():
    assert jail.grader_cgroup("/a/b") == "/a/b"
    assert jail.grader_cgroup(f"/a/b/{jail.GRADER_LEAF}") == "/a/b"
    assert jail.grader_cgroup(f"/a/b/{jail.CGROUP_PARENT}/run-x") == "/a/b"
    assert jail.grader_cgroup("/") == "/"


def test_v1_cgroups_are_made_under_the_graders_own(tmp_path):
    for ctrl in ("cpu", "memory", "pids"):
        (tmp_path / ctrl).mkdir()
    own = jail.own_cgroups(PROC_V1)
    dirs = jail.cgroup_dirs("run-t", str(tmp_path), own=own)
    assert dirs == {c: str(tmp_path / c / "batch" / "job7" / "specref-grade" / "run-t") for c in ("cpu", "memory", "pids")}
    assert jail.join_cgroups("run-t", 100, root=str(tmp_path), pid=4242, own=own) == ["cpu", "memory", "pids"]
    assert (tmp_path / "memory/batch/job7/specref-grade/run-t/memory.limit_in_bytes").read_text() == str(100 << 20)
    assert not (tmp_path / "memory" / "specref-grade").exists()  # nothing at the hierarchy's root


def test_v2_cgroups_are_made_under_the_graders_own(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    scope = tmp_path / "grading.slice" / "instructor.scope"
    scope.mkdir(parents=True)
    (scope / "cgroup.controllers").write_text("cpu memory pids\n")
    own = jail.own_cgroups(PROC_V2)
    leaf = scope / "specref-grade" / "run-t"
    assert set(jail.cgroup_dirs("run-t", str(tmp_path), own=own).values()) == {str(leaf)}
    assert jail.join_cgroups("run-t", 100, root=str(tmp_path), pid=4242, own=own) == ["cpu", "memory", "pids"]
    assert (leaf / "memory.max").read_text() == str(100 << 20) and (leaf / "cgroup.procs").read_text() == "4242"
    assert (scope / "cgroup.subtree_control").exists()  # the controllers handed down to the grader's cgroup
    assert not (tmp_path / "specref-grade").exists()


@as_root
def test_a_real_join_lies_under_the_graders_own_memory_cgroup():
    """On this host's hierarchy: the child's memory cgroup is the grader's own path followed by specref-grade/."""
    version = jail.cgroup_version()
    own = jail.own_cgroups()
    key = "" if version == 2 else "memory"
    if version == 0 or key not in own:
        pytest.skip("no cgroup hierarchy with a memory controller here")
    name = f"run-safety-{os.getpid()}"
    child = subprocess.Popen(["sleep", "60"])
    try:
        if not jail.join_cgroups(name, 64, pid=child.pid):
            pytest.skip("this host's cgroups are not writable here")
        line = next(ln for ln in Path(f"/proc/{child.pid}/cgroup").read_text().splitlines()
                    if (ln.split(":")[1] == "" if version == 2 else "memory" in ln.split(":")[1].split(",")))
        expected = (jail.grader_cgroup(own[key]).rstrip("/") + f"/specref-grade/{name}")
        assert line.split(":", 2)[2] == expected, (line, expected)
    finally:
        child.kill()
        child.wait()
        jail.remove_cgroups(name)


def test_default_jobs_are_sized_by_the_caps_not_by_honest_peaks(monkeypatch):
    """24 GB and 16 cores: one submission may take 8192 (kernel) + 512 (its /tmp) + 6144 (trusted) MB, so one
    worker, not the six the honest peak (3700 MB) would allow."""
    cap = processes.submission_cap_mb(wall.MEMORY_MB)
    assert cap == wall.MEMORY_MB + jail.TMP_MB + processes.TRUSTED_MEMORY_MB
    monkeypatch.setattr(classrun, "_cores", lambda: 16)
    monkeypatch.setattr(classrun, "_memory_available_mb", lambda: 24 * 1024)
    assert classrun.default_jobs() == 1
    monkeypatch.setattr(classrun, "_memory_available_mb", lambda: 3 * cap)
    assert classrun.default_jobs() == 3


@pytest.mark.parametrize("asked, available", [(2, 24 * 1024), (3, 24 * 1024), (8, 24 * 1024), (4, 100_000)])
def test_jobs_asked_for_get_caps_that_fit_the_memory(asked, available):
    """--jobs N: the kernel's cap is lowered (never below KERNEL_MIN_MB) or fewer workers run, so that
    workers x (kernel + /tmp + trusted caps) <= available."""
    jobs, kernel = classrun.sized(asked, wall.MEMORY_MB, available)
    assert 1 <= jobs <= asked and processes.KERNEL_MIN_MB <= kernel <= wall.MEMORY_MB
    assert jobs == 1 or jobs * processes.submission_cap_mb(kernel) <= available


def test_one_worker_keeps_its_caps():
    assert classrun.sized(1, wall.MEMORY_MB, 4096) == (1, wall.MEMORY_MB)
