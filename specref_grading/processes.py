"""The grader's processes on the host: a fresh uid, resource limits, dying with the grader, killing what is left.

Also whether this host can jail the learner's kernel at all (root and namespaces), and what the report says
when it cannot.
"""

from __future__ import annotations

import ctypes
import grp
import os
import pwd
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from specref_grading import jail

MARKER_ENV = "SPECREF_GRADING_RUN"

# The trusted process (specref_grading/trust/trusted.py: the solution's setup and test cells) is limited per run like
# the kernel: a CPU-time rlimit, a memory rlimit and, as root where the host has writable cgroups, a cgroup of its
# own (one CPU, TRUSTED_MEMORY_MB, a process count). The limits leave a wide margin over the largest honest grading
# (ex04, which loads the GPT-2 pair there); benchmarks/README.md ("Grading a class") measures every exercise's peaks.
# Workers are sized by the caps, never by honest peaks (`submission_cap_mb`): a submission may use all of its caps.
TRUSTED_MEMORY_MB = 6144
TRUSTED_CPU_S = 300  # the whole run; above trust.wall.TEST_CPU_S, the cap of one test
# The least memory a kernel is given when its cap is derived from the jobs asked for (classrun.sized):
# an honest kernel peaks at a few hundred MB (ex04), the checks' models live in the trusted process.
KERNEL_MIN_MB = 1024


def submission_cap_mb(kernel_mb: int) -> int:
    """What one submission may take at most: its kernel's cap, the kernel's /tmp (a tmpfs) and the trusted
    process's cap."""
    return kernel_mb + jail.TMP_MB + TRUSTED_MEMORY_MB


def _as_root() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def _free_uid() -> int:
    while True:
        uid = random.randrange(200_000, 2_000_000_000)
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)  # the same number is its group
        except KeyError:
            return uid


def _drop_cmd(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--pdeathsig", "KILL"]


PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3


def make_undumpable() -> bool:
    """Make this process non-dumpable (prctl PR_SET_DUMPABLE 0), for good; whether it now is.

    A process of the same uid (an unjailed kernel, when it is not dropped to a uid of its own: `unjailed_uid`)
    can then neither ptrace it nor open its /proc/PID/fd: the read end of the results pipe (wall.run_cells' ev_r),
    through which it could write fake results. Root still can: hence `unjailed_uid`.
    """
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_DROP: dict[int, bool] = {}

INSTALL_FOR_A_FRESH_UID = (
    "install the grader's environment where an unprivileged user can read it: a Python and a virtual environment "
    "outside any private folder (not under /root or a home of mode 0700), e.g. python3.11 -m venv "
    "/opt/specref-venv, then /opt/specref-venv/bin/pip install -e <this checkout>, with the checkout readable by all")
ROOT_REFUSED = (
    "refused: the learner's code would run as root (this host cannot jail it, and no fresh unprivileged uid can run "
    "this grader's interpreter: {why}). Learner code never runs as root: " + INSTALL_FOR_A_FRESH_UID
    + "; or grade on a host with namespaces (a jail)")


class RootRefused(RuntimeError):
    """Learner code would run as root: refused, whatever was asked."""


def can_drop() -> bool:
    """Whether a fresh unprivileged uid can run this very interpreter with specref (probed once per process, as
    root with setpriv; False otherwise): what an unjailed kernel, and the trusted process, run as."""
    if not _as_root():
        return False
    if 0 not in _DROP:
        # The same interpreter, not only one: where the fresh uid cannot reach the grader's, exec may end in another
        # (seen: a venv's python resolving to the system's 3.11.2 instead of its own 3.11.7 under /root).
        probe = f"import ctypes, json, select, specref, sys; sys.exit(sys.version != {sys.version!r})"
        try:
            _DROP[0] = subprocess.run(_drop_cmd(_free_uid()) + [sys.executable, "-I", "-c", probe],
                                      capture_output=True, timeout=120, cwd="/",
                                      env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _DROP[0] = False
    return _DROP[0]


def root_refusal() -> str | None:
    """Why an unjailed kernel cannot run here without being root (None where it can: the grader is not root, or a
    fresh uid can run the interpreter)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        return ROOT_REFUSED.format(why="setpriv, which drops to a fresh uid, is not installed")
    if not can_drop():
        return ROOT_REFUSED.format(why=f"{sys.executable} or specref is not readable by one")
    return None


def unjailed_uid() -> int | None:
    """The uid an unjailed kernel runs as: None (the grading user) where the grader is not root, a fresh uid where
    it is; RootRefused where it is root and no fresh uid can run the interpreter (`root_refusal`): a kernel never
    runs as root."""
    if os.geteuid() != 0:
        return None
    why = root_refusal()
    if why is not None:
        raise RootRefused(why)
    return _free_uid()


# The uid the trusted process drops to (as root, where a fresh uid can run the interpreter): drawn in the grading
# process by `prepare_trusted_uid`, read by `trusted_setup` in the forked child before exec.
_TRUSTED_UID: dict[int, int] = {}


def prepare_trusted_uid() -> int | None:
    """Draw a fresh uid for the next trusted processes of this grading process (as root, where one can run the
    interpreter: `can_drop`); None where they keep the grader's uid (not root, or no such uid can run it)."""
    _TRUSTED_UID.clear()
    if os.geteuid() == 0 and can_drop():
        _TRUSTED_UID[0] = _free_uid()
    return _TRUSTED_UID.get(0)


def drop_to(uid: int) -> None:  # runs in a child before exec, as root
    """Become `uid` for good: no groups, gid = uid, no_new_privs; the parent-death signal armed again (a change of
    uid clears it)."""
    parent = os.getppid()
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) != 0:  # 38 = PR_SET_NO_NEW_PRIVS
        os._exit(126)
    die_with_parent(parent)


def _hub_cache() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return os.path.expanduser("~/.cache/huggingface/hub")


def _environment(home: str, marker: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": _hub_cache(), MARKER_ENV: marker}
    for k, v in os.environ.items():
        if k.startswith("SPECREF_") and k != MARKER_ENV or k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                 "CUDA_VISIBLE_DEVICES"):
            env[k] = v
    return env


def _limits(memory_mb: int, cpu_s: int | None = None) -> None:  # runs in the child before exec
    """A child's limits: no core files, files of at most 256 MB, `memory_mb` of private memory (a memory bomb
    meets MemoryError instead of taking the host's memory), as root at most 1024 processes, and where `cpu_s` is
    given that many seconds of CPU time (SIGXCPU then, SIGKILL 15 s later)."""
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 256 << 20), (resource.RLIMIT_DATA, memory_mb << 20)]
    if cpu_s is not None:
        limits.append((resource.RLIMIT_CPU, (cpu_s, cpu_s + 15)))
    if _as_root():  # counted per uid: only the run's own fresh uid may be capped (fork bombs)
        limits.append((resource.RLIMIT_NPROC, 1024))
    for lim, value in limits:
        try:
            resource.setrlimit(lim, value if isinstance(value, tuple) else (value, value))
        except (ValueError, OSError):
            pass
    os.umask(0o077)


def die_with_parent(parent: int) -> None:  # runs in a child before exec, or first thing in a worker
    """Ask the kernel to SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG).

    A grader stopped by SIGTERM or SIGKILL then takes its kernels, jails and trusted processes with it
    (unshare's --kill-child passes the signal on into the jail's namespace) instead of leaving them to run.
    """
    if not jail.arm_parent_death():
        return  # not Linux: the process-group kill in _kill_all still applies
    if os.getppid() != parent:  # the parent died before the request took (`parent` as the parent read it)
        os._exit(1)


def _child_setup(memory_mb: int | None, parent: int) -> None:  # runs in the child before exec
    die_with_parent(parent)
    if memory_mb is not None:
        _limits(memory_mb)


def trusted_setup(parent: int, cgroup: str | None = None) -> None:  # runs in the trusted child before exec
    """The trusted process's limits: it dies with the grader, joins cgroup `cgroup` (as root, where the host has
    writable cgroups: one CPU, TRUSTED_MEMORY_MB, a process count) and gets TRUSTED_CPU_S of CPU time and
    TRUSTED_MEMORY_MB of private memory; then, as root, it drops to the fresh uid `prepare_trusted_uid` drew (none
    drawn: it stays root, the case of an interpreter no fresh uid can run)."""
    die_with_parent(parent)
    if cgroup and os.geteuid() == 0:
        jail.join_cgroups(cgroup, TRUSTED_MEMORY_MB, pids=512)  # torch's threads count as processes
    _limits(TRUSTED_MEMORY_MB, TRUSTED_CPU_S)
    if os.geteuid() == 0 and _TRUSTED_UID.get(0) is not None:  # root no longer: `prepare_trusted_uid`
        drop_to(_TRUSTED_UID[0])


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (what a grading run leaves behind)."""
    found = []
    needle = f"{MARKER_ENV}={marker}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def _kill_all(proc: subprocess.Popen, uid: int | None, marker: str) -> None:
    for _ in range(5):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if uid is not None:  # every process of the run's own uid, whatever group or session it moved to
            subprocess.run(_drop_cmd(uid) + ["kill", "-KILL", "-1"], capture_output=True, timeout=30)
        for pid in processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.02)
        if not processes_with(marker):
            return


_JAIL: dict[int, bool] = {}


UNJAILED_NOTE = (
    "not jailed (the grader did not run as root, or this host has no namespaces): the answers ran in a kernel of "
    "their own, a plain process (of a fresh uid where the grader ran as root: never root itself; else of the grading "
    "user), so this grading cannot promise that they did not read what that "
    "user can read: the solutions (the reference answers and the hidden tests), the checks (specref_grading) and the "
    "code that draws the hidden seed, the whole of specref (the exercise's reference answers with it), the other "
    "submissions, and the network. It was graded so only because --unjailed asked for it. The "
    "results were still decided by the separate trusted process, and neither it nor the grading process can be "
    "traced or have its open files reached by another process of its user (both are made non-dumpable before the "
    "kernel starts); the kernel could only stop them, which fails the tests and scores nothing, or signal other "
    "processes of its user. For grades that matter, grade as root on a host with namespaces")


def can_jail() -> bool:
    """Whether the learner's kernel can be jailed here: root, with mount, network and pid namespaces."""
    if 0 not in _JAIL:
        ok = os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None
        if ok:
            try:
                ok = subprocess.run(["unshare", "--mount", "--net", "--pid", "--fork", "--propagation", "private",
                                     "true"], capture_output=True, timeout=60).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _JAIL[0] = ok
    return _JAIL[0]
