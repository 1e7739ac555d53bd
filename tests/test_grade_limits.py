"""The grader's limits: a jail that works from /tmp, cgroups v1 and v2, a trusted process bounded per run (CPU,
memory, cgroup, its CPU time per test, items per message), workers sized by memory, and what an unjailed run says.

A toy exercise built here (pure Python, no torch: each kernel starts in a fraction of a second) carries the
attacks; its own test cell also reads the trusted process's limits from inside it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from test_grade_security import _code, _meta

from specref_grading import classrun, jail, processes
from specref_grading import grade as grader
from specref_grading.trust import calls, errors, trusted, values, wall, wire
from specref_grading.trust.trusted_policy import TrustedPolicy

REPO = Path(__file__).resolve().parents[1]
AS_ROOT = os.geteuid() == 0
CAN_JAIL = AS_ROOT and shutil.which("unshare") is not None


# -- a toy exercise (its cells built as tests/test_grade_security.py builds its own) ---------------------------------


LIMITS_CHECK = '''import resource
cpu = resource.getrlimit(resource.RLIMIT_CPU)[0]
data = resource.getrlimit(resource.RLIMIT_DATA)[0]
groups = open("/proc/self/cgroup").read()
assert (cpu, data >> 20) == ({cpu}, {mb}), ("the trusted process's limits", cpu, data >> 20)
if {cgroup}:
    assert "/specref-grade/run-" in groups and "-trusted" in groups, groups
'''


def toy(double_answer: str = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
        seq_answer: str = "def seq(n):\n    ### BEGIN SOLUTION\n    return list(range(n))\n    ### END SOLUTION",
        cgroup: bool = False) -> dict:
    """double() (2 points), seq() (1 point: its check loops over the value returned, item by item) and a check
    of the trusted process's own limits (1 point)."""
    cells = [
        _code("import math", cid="setup"),
        _code(double_answer, _meta("double_answer", 0, True, graded=False), "a1"),
        _code("for x in (1, 2.5, -3):\n    got = double(x)\n    assert math.isclose(got, 2 * x), f'double({x}) = {got!r}'",
              _meta("double_check", 2, False), "t1"),
        _code(seq_answer, _meta("seq_answer", 0, True, graded=False), "a2"),
        _code("xs = seq(3)\ntotal = 0\nfor i in range(len(xs)):\n    total += xs[i]\nassert total == 3, total",
              _meta("seq_check", 1, False), "t2"),
        _code(LIMITS_CHECK.format(cpu=processes.TRUSTED_CPU_S, mb=processes.TRUSTED_MEMORY_MB, cgroup=cgroup),
              _meta("limits_check", 1, False), "t3"),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def _cgroups_here() -> bool:
    return AS_ROOT and jail.cgroup_version() != 0 and os.access(
        os.path.dirname(os.path.dirname(jail.cgroup_dirs("run-x")["memory"])), os.W_OK)


def _grade_toy(tmp_path: Path, nb: dict, monkeypatch=None) -> tuple[grader.Report, list[dict], float]:
    """Grade `nb` against the honest toy in this process; (report, the trusted process's events, seconds)."""
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy(cgroup=CAN_JAIL and _cgroups_here())))
    sub = tmp_path / "sub.ipynb"
    sub.write_text(json.dumps(nb))
    events: list[dict] = []
    real = wall._event

    def spy(line: bytes):
        ev = real(line)
        if ev is not None:
            events.append(ev)
        return ev
    if monkeypatch is not None:
        monkeypatch.setattr(wall, "_event", spy)
    t0 = time.monotonic()
    report = grader.grade(sub, sol, seed=1, cell_timeout=120)
    return report, events, time.monotonic() - t0


def _outcomes(report) -> dict[str, tuple[str, str]]:
    return {t.grade_id: (t.outcome, t.message) for t in report.tests}


# -- 1. /tmp: a checkout and a venv under /tmp are jailed; the kernel's /tmp stays private --------------------------
_LIST_TMP = '''import os, sys
print(json.dumps({"tmp": sorted(os.listdir("/tmp")), "marker": open(sys.argv[-1]).read().strip(),
                  "uid": os.getuid(), "base": os.path.exists(sys.argv[-2])}))
'''


@pytest.mark.skipif(not CAN_JAIL, reason="the jail needs root and unshare")
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
@pytest.mark.skipif(not CAN_JAIL, reason="the jail needs root and unshare")
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
    lister = toy(double_answer="def double(x):\n    import os\n    raise ValueError('TMP=' + repr(sorted(os.listdir('/tmp'))))")
    (tmp_path / "lister.ipynb").write_text(json.dumps(lister))
    (tmp_path / "toy.ipynb").write_text(json.dumps(toy()))
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


# -- 2. cgroups v1 and v2 ---------------------------------------------------------------------------------------------
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


@pytest.mark.skipif(not AS_ROOT, reason="cgroups are joined as root")
def test_a_real_v1_join_where_the_host_has_v1():
    if jail.cgroup_version() != 1:
        pytest.skip(f"this host's cgroups are not v1 (version {jail.cgroup_version()})")
    _join_for_real(1)


@pytest.mark.skipif(not AS_ROOT, reason="cgroups are joined as root")
def test_a_real_v2_join_where_the_host_has_v2():
    if jail.cgroup_version() != 2:
        pytest.skip(f"this host has no unified (v2) cgroup hierarchy with controllers at {jail.CGROUP_ROOT} "
                    f"(cgroup_version() = {jail.cgroup_version()}): the v2 path is tested with a fake root only")
    _join_for_real(2)


# -- 3. the trusted process: limits, items per message, calls per test ------------------------------------------------
def test_json_items_counts_values_across_nested_containers_outside_strings():
    assert wire.json_items(b'{"a": [1, 2, [3]], "b": "x,y[\\"{"}') == 7
    assert wire.json_items(json.dumps([[i] for i in range(1000)]).encode()) >= 2000


def _pipe_peers():
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    return calls.Peer(a_r, a_w, "trusted", policy=TrustedPolicy()), (b_r, b_w)


def test_a_message_of_a_million_tiny_lists_is_refused_before_it_is_parsed():
    """The receiver scans the header's bytes (4 MB here) and refuses it: it never builds the million lists."""
    peer, (_, b_w) = _pipe_peers()
    head = json.dumps({"re": 1, "ok": [[0]] * 1_000_000, "back": [], "gens": [], "blobs": []}).encode()
    writer = threading.Thread(target=lambda: os.write(b_w, struct.pack(">I", len(head))) and
                              [os.write(b_w, head[i:i + 65536]) for i in range(0, len(head), 65536)], daemon=True)
    writer.start()
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(errors.MessageRefused, match="more than 262144 values"):
            peer._recv(time.monotonic() + 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert peak < 4 * len(head), peak  # the bytes and a scan of them; the parsed lists would be ~100 MB


def test_a_value_of_too_many_items_is_refused_by_its_sender():
    peer, _ = _pipe_peers()
    with pytest.raises(ValueError, match="items"):
        peer.encode([[i] for i in range(wire.MAX_MESSAGE_ITEMS)], values.Frame())
    assert peer.encode([[i] for i in range(1000)], values.Frame())  # a learner's few thousand values pass


def test_the_cpu_cap_stops_a_loop_over_a_handle():
    """A value whose len() is 10**12, looped over item by item: the calls across the wall stop once this process has
    spent its CPU cap (`Peer.cpu_limit`), whatever their number."""
    class Endless:
        def __len__(self):
            return 10**12

        def __getitem__(self, i):
            return 0
    t2k_r, t2k_w = os.pipe()
    k2t_r, k2t_w = os.pipe()
    kernel = calls.Peer(t2k_r, k2t_w, "jail", ops={"get": lambda name: Endless()})
    threading.Thread(target=kernel.serve_forever, daemon=True).start()
    peer = calls.Peer(k2t_r, t2k_w, "trusted", timeout=30, policy=TrustedPolicy())
    xs = peer.request("get", "xs")
    peer.cpu_limit = time.process_time() + 0.5
    n = 0
    with pytest.raises(errors.WorkLimit):
        for i in range(len(xs)):
            n += xs[i]
    assert time.process_time() >= peer.cpu_limit and peer.calls > 10 and peer.broken
    with pytest.raises(errors.ChannelClosed):  # a broken channel stays broken
        xs[0]
    os.close(t2k_w)


def test_grading_the_honest_toy_gives_full_marks_and_the_trusted_process_its_limits(tmp_path, monkeypatch):
    """Full marks (the toy's own check reads the trusted process's CPU and memory rlimits and, as root with
    writable cgroups, its cgroup); each result reports the calls it made."""
    report, events, _ = _grade_toy(tmp_path, toy(), monkeypatch)
    assert report.total == report.possible == 4, report.text()
    results = [e for e in events if e.get("ev") == "result"]
    calls = {e["grade_id"]: e["calls"] for e in results}
    assert calls["seq_check"] >= 5 and calls["double_check"] >= 4, calls  # get, len, 3 items; get, 3 calls


@pytest.mark.grader
def test_a_huge_nested_list_from_the_learner_is_refused_quickly_and_costs_the_grader_nothing(tmp_path, monkeypatch):
    """double() returns a million one-item lists. Its kernel's own encoder refuses it (the test errs, saying why);
    a kernel that lifts its own limit first gets its reply refused by the trusted side from the header's bytes,
    before parsing: the test fails with a clear message within seconds and the trusted process stays small."""
    honest = toy(double_answer="def double(x):\n    return [[i] for i in range(10**6)]")
    report, events, secs = _grade_toy(tmp_path, honest, monkeypatch)
    outcome, message = _outcomes(report)["double_check"]
    assert outcome == "error" and "items" in message and "too large" in message, message
    lifted = toy(double_answer="import sys\nsys.modules['__main__'].MAX_MESSAGE_ITEMS = 10**9\n"
                               "def double(x):\n    return [[i] for i in range(10**6)]")
    report, events, secs = _grade_toy(tmp_path, lifted, monkeypatch)
    outcome, message = _outcomes(report)["double_check"]
    assert outcome == "error" and "refuses" in message and "values" in message, message
    assert _outcomes(report)["seq_check"][0] == "passed"  # the other tests ran in a fresh pair
    stop = next(e for e in events if e.get("ev") == "stop")
    assert stop["maxrss_mb"] < 100, stop  # measured 40 MB (12 MB before it); parsed, the reply is ~150 MB more
    assert secs < 60


@pytest.mark.grader
def test_a_handle_looped_over_forever_is_stopped_by_the_cpu_cap(tmp_path, monkeypatch):
    """seq() returns an object of len() 10**12 whose items are all 0; the check loops over it item by item. Stopped
    once the checks' process has spent its CPU cap on the test (lowered here to 3 s from wall.TEST_CPU_S, to keep the
    test short), the test fails and says why; the others still pass."""
    monkeypatch.setattr(wall, "TEST_CPU_S", 3.0)
    endless = toy(seq_answer="class Endless:\n    def __len__(self):\n        return 10**12\n"
                             "    def __getitem__(self, i):\n        return 0\n\n"
                             "def seq(n):\n    return Endless()")
    report, events, secs = _grade_toy(tmp_path, endless, monkeypatch)
    outcome, message = _outcomes(report)["seq_check"]
    assert outcome == "failed" and "more than 3 s of the checks' CPU time" in message, message
    assert re.search(r"in \d+ calls between the checks and the submission's code", message), message
    assert _outcomes(report)["double_check"][0] == "passed" and _outcomes(report)["limits_check"][0] == "passed"
    stop = next(e for e in events if e.get("ev") == "stop")
    assert stop["cpu_s"] >= 3.0, stop
    assert secs < 300, secs


def test_the_cpu_cap_of_a_test_fits_in_its_time_and_under_the_runs_cpu_limit():
    """A flood costs this side at most about half of each round trip's work: the cap must be met before the test
    cell's wall-clock limit (grade.CELL_TIMEOUT_S x wall.WALL_TEST_FACTOR), and before the whole run's RLIMIT_CPU."""
    assert 2 * wall.TEST_CPU_S <= grader.CELL_TIMEOUT_S * wall.WALL_TEST_FACTOR
    assert wall.TEST_CPU_S < processes.TRUSTED_CPU_S


@pytest.mark.grader
def test_an_honest_exhaustive_best_k_keeps_its_points_under_the_cpu_cap():
    """ex03's best_k by exhaustive search to a proven bound (tests/model_factory.py) calls v(k) close to a million
    times across the wall, visible and hidden cases: far more than any count of calls a cap could allow a flood. It
    passes under the default cap on the checks' CPU time, which is what the test prints."""
    from model_factory import best_k_exhaustive
    from test_grade_notes import _answer_cell, _solution

    from specref_grading.plan import build_plan
    sol = _solution("ex03_speedup")
    sub = json.loads(json.dumps(sol))
    _answer_cell(sub, "ex03_bestk_answer")["source"] = inspect.getsource(best_k_exhaustive).replace(
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


def test_what_follows_a_long_test_gets_its_own_time_limit(tmp_path):
    """A test that runs past one cell's limit within its own (WALL_TEST_FACTOR cell limits) is followed by cells
    timed from its end, not from its start."""
    r, w = os.pipe()
    cells = [{"n": 1, "role": "test", "grade_id": "long"}, {"n": 2, "role": "test", "grade_id": "next"}]

    def events():
        for ev, pause in ((b'{"ev": "start", "n": 1}', 0.0), (b'{"ev": "result", "n": 1, "outcome": "passed"}', 1.5),
                          (b'{"ev": "start", "n": 2}', 0.3), (b'{"ev": "result", "n": 2, "outcome": "passed"}', 0.1),
                          (b'{"ev": "done"}', 0.0)):
            time.sleep(pause)
            os.write(w, ev + b"\n")
        os.close(w)
    threading.Thread(target=events, daemon=True).start()
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    try:
        run = wall._collect(proc, b"{}", r, cells, 1.0, time.monotonic() + 60, tmp_path / "log")
    finally:
        os.close(r)
        proc.wait()
    assert run.stop is None and {n: o.outcome for n, o in run.results.items()} == {1: "passed", 2: "passed"}, run


def test_a_cpu_limit_stops_the_trusted_process_with_a_clear_message(monkeypatch):
    """SIGXCPU (RLIMIT_CPU's soft limit) becomes CpuLimit in the trusted process: the test stops, saying why."""
    emitted: list[dict] = []
    monkeypatch.setattr(trusted, "emit", emitted.append)

    class Busy:
        timeout, calls, served, cpu_limit = 1.0, 0, 0, None

        def request(self, op, *args):
            raise NameError(args[0])
    cell = {"n": 3, "role": "test", "grade_id": "spin", "source": "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\nwhile True:\n    pass"}
    old = __import__("signal").signal(__import__("signal").SIGXCPU, trusted._on_sigxcpu)
    try:
        assert trusted.run_test(cell, {"__builtins__": __builtins__}, Busy(), []) is False
    finally:
        __import__("signal").signal(__import__("signal").SIGXCPU, old)
    assert emitted[-1]["ev"] == "stop" and "CPU time" in emitted[-1]["message"], emitted


def test_the_trusted_process_gets_cpu_and_memory_rlimits():
    code = ("import resource, os\nfrom specref_grading import processes\nprocesses._limits(processes.TRUSTED_MEMORY_MB, "
            "processes.TRUSTED_CPU_S)\nprint(resource.getrlimit(resource.RLIMIT_CPU), "
            "resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO).stdout
    cpu = processes.TRUSTED_CPU_S
    assert out.split() == [f"({cpu},", f"{cpu + 15})", str(processes.TRUSTED_MEMORY_MB)], out


# -- 4. workers sized by memory ---------------------------------------------------------------------------------------
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


def test_the_memory_available_is_read_from_the_host():
    mb = classrun._memory_available_mb()
    assert mb is None or mb > 0
    assert 1 <= classrun.default_jobs() <= classrun._cores()


# -- 5. without a jail -----------------------------------------------------------------------------------------------
def test_the_unjailed_note_says_what_cannot_be_promised():
    note = processes.UNJAILED_NOTE
    for words in ("not jailed", "solutions", "reference answers", "hidden tests", "checks", "hidden seed",
                  "trusted process", "grade as root"):
        assert words in note, words


def test_without_a_jail_an_honest_toy_gets_full_marks_and_the_note(tmp_path, monkeypatch):
    monkeypatch.setattr(grader, "can_jail", lambda: False)
    monkeypatch.setattr(wall, "can_jail", lambda: False)
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy(cgroup=False)))
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
        sol.write_text(json.dumps(toy(cgroup=False)))
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


# -- 6. an unjailed kernel cannot forge results; an installed grader is hidden in the jail -------------------------
_FORGE = r'''
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
    sol.write_text(json.dumps(toy(cgroup=False)))
    forging = toy(seq_answer="def seq(n):\n    return []\n" + _FORGE, cgroup=False)
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


@pytest.mark.skipif(not CAN_JAIL, reason="the jail needs root and unshare")
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


# About the grader, not numerics of ours: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
