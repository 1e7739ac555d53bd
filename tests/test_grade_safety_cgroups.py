"""The run's cgroups lie under the grader's own cgroup (v1 and v2), and workers are sized by the caps.

A limit the instructor puts around grading (a systemd slice, a container, a batch job) must hold the learner's
code too: the run's cgroups are made below the grader's own (read from /proc/self/cgroup), never at the
hierarchy's root. And jobs x (kernel + its /tmp + trusted caps) never exceeds the memory available.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from specref_grading import classrun, jail, processes
from specref_grading.trust import wall

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


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are joined as root")
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
