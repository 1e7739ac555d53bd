"""Run a plan's cells across the wall: tests in a trusted process, everything else in a jailed kernel.

The kernel (specref_grading/jail.py) gets the setup, answer and other cells, never a test cell; the trusted
process (specref_grading/trust/trusted.py) gets the plan, runs the setup and the tests, calls into the kernel
through two pipes and reports each test's outcome on a third pipe the kernel cannot reach. This module
starts both, reads that third pipe and turns what it says into a `KernelRun`.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from specref_grading import jail
from specref_grading.processes import (
    MARKER_ENV,
    _child_setup,
    _drop_cmd,
    _environment,
    _free_uid,
    _kill_all,
    can_jail,
    make_undumpable,
    trusted_setup,
    unjailed_uid,
)
from specref_grading.trust import kernel_tree
from specref_grading.trust.program import kernel_program

CALL_TIMEOUT_S = 60  # one call of the checks into the submission's code (the cell's own limit still applies)
# The checks' process's own CPU time on one test cell (its checks, and every call it makes into the kernel or serves
# for it): what stops a flood of calls (a value looped over without end, code calling back without end), whatever
# the number of calls an honest algorithm needs. The cap leaves a wide margin over ex03's exhaustive best_k (close to
# a million calls of v(k); tests/grading/test_honest_answers.py grades it under this cap and prints what it took), stays below
# the process's CPU limit for the whole run (processes.TRUSTED_CPU_S), and under half of a test cell's time, so that
# a flood, where this side does at most about half of the work of each round trip, meets it first.
TEST_CPU_S = 240
WALL_TEST_FACTOR = 4  # a test cell across the wall may take this many cell limits (up to a million calls: ex03)
MEMORY_MB = 8192  # one kernel's private memory (RLIMIT_DATA)
MAX_EVENT_BYTES = 1 << 20  # an event is a short JSON line; a longer "line" is a flood, never an event
READY_TIMEOUT_S = 60  # how long the trusted process may take to start (and become non-dumpable)

# How the trusted process starts: non-dumpable first (PR_SET_DUMPABLE 0: no process of its uid but root can ptrace
# it or open its /proc/PID/fd, where its end of the result pipe lies), then it says so on that pipe, and only then
# does the kernel start (`run_cells`); then specref_grading/trust/trusted.py runs as ``-m`` would run it.
TRUSTED_BOOT = r"""import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(4, 0, 0, 0, 0) != 0 or libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, PR_GET_DUMPABLE
    raise SystemExit("the trusted process could not make itself non-dumpable")
os.write(int(sys.argv.pop(1)), b'{"ev": "ready"}\n')  # READY
import runpy
runpy.run_module("specref_grading.trust.trusted", run_name="__main__", alter_sys=True)
"""
READY = b'{"ev": "ready"}\n'


@dataclass
class RunOutcome:
    outcome: str  # passed, failed, error, timeout, died, not run
    message: str = ""
    flags: list[str] = field(default_factory=list)
    answer_errors: list[str] = field(default_factory=list)


@dataclass
class KernelRun:
    """What one kernel reported: a result per test cell it got to, and why it stopped early, if it did."""
    results: dict[int, RunOutcome] = field(default_factory=dict)
    stopped_at: dict | None = None  # the cell it was running when it timed out or died
    stop: RunOutcome | None = None
    setup_error: str = ""



def run_cells(cells: list[dict], cell_timeout: float, deadline: float, memory_mb: int = MEMORY_MB,
              call_timeout: float = CALL_TIMEOUT_S, test_cpu_s: float | None = None) -> KernelRun:
    """Run the cells across the wall: tests in a trusted process, everything else in a jailed kernel.

    Without a jail (no root, or no namespaces: `can_jail`) the kernel is a plain child process, of a fresh uid
    where the grader is root and the interpreter is readable by one (`unjailed_uid`), else of the grading user;
    this process is made non-dumpable first (`make_undumpable`), as the trusted process is before the kernel
    starts, so that such a kernel cannot open their /proc/PID/fd (the result pipe), and only the wall holds.

    `test_cpu_s` (default TEST_CPU_S) caps the checks' process's CPU time on each test cell.

    A cell of role "demo" (kernel_tree.prepare: it uses the reference the kernel lacks) is not run. The exercise's
    forbidden set comes with its setup cells ("forbidden": kernel_tree.prepare), or is read from them.
    """
    cells = [c for c in cells if c.get("role") != "demo"]
    jailed = can_jail()
    if not jailed and not make_undumpable():
        return KernelRun(setup_error="could not make the grader non-dumpable (prctl PR_SET_DUMPABLE), which an "
                                     "unjailed kernel needs")
    marker = secrets.token_hex(8)
    me = os.getpid()  # the children's parent, for die_with_parent
    base = Path(tempfile.mkdtemp(prefix="specref-grade-"))
    uid = _free_uid() if jailed else unjailed_uid()
    work = base / "work"
    work.mkdir()
    t2j_r, t2j_w = os.pipe()
    j2t_r, j2t_w = os.pipe()
    ev_r, ev_w = os.pipe()
    fds = [t2j_r, t2j_w, j2t_r, j2t_w, ev_r, ev_w]
    log = open(base / "output.log", "wb")
    tlog = open(base / "trusted.log", "wb")
    procs: list[subprocess.Popen] = []
    try:
        os.chmod(base, 0o711)
        os.chmod(work, 0o700)  # the unjailed kernel's home; a jailed one has a tmpfs of its own
        if uid is not None and not jailed:
            os.chown(work, uid, uid)
        env = _environment("/tmp" if jailed else str(work), marker)
        env["MPLCONFIGDIR"] = env["HOME"]
        source = kernel_program(jail.KERNEL)
        if jailed:
            try:  # the exercise's specref: a copy without its answer key, bound where the package lies
                tree = kernel_tree.build(*_kernel_specref(cells), into=base / "specref-copy")
            except (OSError, RuntimeError, SyntaxError, ValueError) as e:
                return KernelRun(setup_error=f"could not build the grading kernel's specref: {e}")
            read_only = jail.read_only_paths(with_specref=False)
            config = {"root": str(base / "root"), "uid": uid, "memory_mb": memory_mb,
                      "read_only": read_only, "rfd": t2j_r, "wfd": j2t_w,
                      "python": sys.executable, "source": source, "env": env, "cgroup": f"run-{marker}",
                      "specref": [str(tree), str(kernel_tree.specref_dir())],
                      "hide": jail.hidden_paths(read_only, keep=[str(kernel_tree.specref_dir())])}
            cmd = jail.command(config)
            pre = lambda: _child_setup(None, me)  # noqa: E731  # the jail sets its own limits
        else:
            cmd = (_drop_cmd(uid) if uid is not None else []) + [sys.executable, "-I", "-c", source, str(t2j_r),
                                                                 str(j2t_w)]
            pre = lambda: _child_setup(memory_mb, me)  # noqa: E731
        try:
            try:  # the trusted process first: the kernel starts only once it is non-dumpable (TRUSTED_BOOT)
                tenv = {k: v for k, v in _environment(str(base), marker).items() if k != MARKER_ENV}
                tenv["MPLCONFIGDIR"] = str(base)
                trusted = subprocess.Popen([sys.executable, "-I", "-c", TRUSTED_BOOT, str(ev_w)], stdin=subprocess.PIPE, stdout=tlog, stderr=subprocess.STDOUT,
                    cwd=base, env=tenv, pass_fds=(t2j_w, j2t_r, ev_w), start_new_session=True,
                    preexec_fn=lambda: trusted_setup(me, f"run-{marker}-trusted"))
                procs.append(trusted)
                if not _ready(trusted, ev_r):
                    return KernelRun(setup_error="could not start the grading checks' process (trusted.py): " + (
                        base / "trusted.log").read_bytes()[-1500:].decode("utf-8", "replace").strip())
                kernel = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=work, env=env, pass_fds=(t2j_r, j2t_w), start_new_session=True,
                                          preexec_fn=pre)
                procs.insert(0, kernel)
            except OSError as e:
                return KernelRun(setup_error=f"could not start the grading kernel: {e}")
            for fd in (t2j_r, t2j_w, j2t_r, j2t_w, ev_w):
                os.close(fd)
            fds = [ev_r]
            plan = json.dumps({"cells": cells, "rfd": j2t_r, "wfd": t2j_w, "events": ev_w,
                               "call_timeout": min(call_timeout, cell_timeout),
                               "test_cpu_s": TEST_CPU_S if test_cpu_s is None else test_cpu_s}).encode()
            return _collect(trusted, plan, ev_r, cells, cell_timeout, deadline, base / "output.log", kernel)
        finally:
            for proc in procs:
                _kill_all(proc, None if proc is trusted else uid, marker)
            if jailed:
                jail.remove_cgroups(f"run-{marker}")
            jail.remove_cgroups(f"run-{marker}-trusted")
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        log.close()
        tlog.close()
        shutil.rmtree(base, ignore_errors=True)


def _kernel_specref(cells: list[dict]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(forbidden set, roots) of the exercise's copy of specref: as the plan marked its setup cells
    (kernel_tree.prepare), or read from the cells."""
    marked = next((c for c in cells if c.get("forbidden") is not None and c.get("roots") is not None), None)
    if marked is not None:
        return tuple(marked["forbidden"]), tuple(marked["roots"])
    forbidden = kernel_tree.forbidden_for([c["source"] for c in cells if c.get("role") in ("checks", "setup")])
    return forbidden, kernel_tree.roots_for(kernel_tree.shared_reading(), [
        c.get("kernel_source", c["source"]) for c in cells if c.get("role") in ("setup", "other")])


def _ready(trusted: subprocess.Popen, r: int, timeout: float = READY_TIMEOUT_S) -> bool:
    """Wait for the trusted process's READY line on the result pipe (read byte by byte: nothing after it is taken)."""
    got, end = b"", time.monotonic() + timeout
    while time.monotonic() < end and trusted.poll() is None:
        ready, _, _ = select.select([r], [], [], 0.2)
        if not ready:
            continue
        byte = os.read(r, 1)
        if not byte:
            return False
        got += byte
        if byte == b"\n" or len(got) >= len(READY):
            return got == READY
    return False


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _split_events(buf: bytes, chunk: bytes, skipping: bool,
                  max_bytes: int = MAX_EVENT_BYTES) -> tuple[list[bytes], bytes, bool, int]:
    """Whole lines of the result channel in buf + chunk; the rest stays buffered, but never more than max_bytes.

    A line that grows past max_bytes is dropped as it arrives (counted once in `overlong`) and the channel
    skips to its end, so a kernel that writes one endless line cannot grow the grader's memory.
    Returns (lines, rest, skipping, overlong).
    """
    buf += chunk
    lines, overlong = [], 0
    while True:
        if skipping:
            end = buf.find(b"\n")
            if end < 0:
                return lines, b"", True, overlong
            buf, skipping = buf[end + 1:], False
        end = buf.find(b"\n")
        if end < 0:
            break
        lines.append(buf[:end])
        buf = buf[end + 1:]
    if len(buf) > max_bytes:
        return lines, b"", True, overlong + 1
    return lines, buf, False, overlong


def _kernel_end(kernel: subprocess.Popen, log: Path) -> str:
    """' (signal 9)' or ' (exit status 1)' of the jailed kernel, and its last output."""
    try:
        code = kernel.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return ""
    how = f"signal {code - 128}" if code > 128 else f"signal {-code}" if code < 0 else f"exit status {code}"
    tail = log.read_bytes()[-1500:].decode("utf-8", "replace").strip() if log.is_file() else ""
    return f" ({how})" + (f"; its last output:\n{tail}" if tail else "")


def _collect(proc, plan: bytes, r: int, cells: list[dict], cell_timeout: float, deadline: float, log: Path,
             kernel: subprocess.Popen | None = None) -> KernelRun:
    """Read the trusted process's events until it is done, a cell runs past its limit, or it dies."""
    threading.Thread(target=_feed, args=(proc, plan), daemon=True).start()
    roles = {c["n"]: c for c in cells}
    run = KernelRun()
    buf, skipping, current, started = b"", False, None, time.monotonic()
    errors: list[str] = []
    malformed = 0  # lines of the trusted process's channel that are not events: a fault of the grader
    done = False
    while not done:
        now = time.monotonic()
        # Across the wall a test cell's calls into the kernel are limited one by one (CALL_TIMEOUT_S); the cell
        # as a whole gets WALL_TEST_FACTOR times the cell limit, for the round trips of checks that call a lot.
        span = cell_timeout * (WALL_TEST_FACTOR if roles.get(current, {}).get("role") == "test" else 1)
        limit = min(deadline, started + span)
        if now >= limit:
            cell = roles.get(current, {})
            why = "the whole grading run" if deadline <= started + span else "one cell"
            run.stopped_at = cell
            run.stop = RunOutcome("timeout", f"timed out: {_cell_words(cell)} was still running after "
                                  f"{min(span, deadline - started):.0f} s (the limit for {why}); an endless "
                                  "loop, or far too slow", answer_errors=list(errors))
            return run
        ready, _, _ = select.select([r], [], [], max(0.0, min(limit - now, 1.0)))
        if not ready:
            continue
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        lines, buf, skipping, overlong = _split_events(buf, chunk, skipping)
        malformed += overlong
        for line in lines:
            event = _event(line)
            if event is None:
                malformed += 1
                continue
            ev = event.get("ev")
            if ev == "start":
                current, started = event.get("n"), time.monotonic()
            elif ev == "cell_error":
                if event.get("role") == "setup":
                    run.setup_error = f"the exercise's setup cell {event.get('n')} failed: {event.get('message')}"
                    return run
                errors.append(f"{_cell_words(roles.get(event.get('n'), {}))} raised {event.get('message')}")
            elif ev == "result":
                run.results[event.get("n")] = RunOutcome(event.get("outcome", "error"), event.get("message", ""),
                                                         list(event.get("flags", [])), list(errors))
                current, started = None, time.monotonic()  # what follows a long test gets its own limit
            elif ev == "stop":  # the wall's trusted process: the kernel hung or died in this cell
                run.stopped_at = roles.get(event.get("n"), {})
                message = str(event.get("message", ""))
                if event.get("kernel") and kernel is not None:
                    message += _kernel_end(kernel, log)
                run.stop = RunOutcome(str(event.get("outcome", "died")), message, answer_errors=list(errors))
                return run
            elif ev == "internal_error":
                errors.append(f"the grading kernel failed: {event.get('message')}")
            elif ev == "done":
                done = True
    if malformed:
        errors.append(f"{malformed} malformed line(s) on the grader's result channel (a fault of the grader)")
    if done:
        return run
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    cell = roles.get(current, {})
    how = f"exit status {code}" if code is not None and code >= 0 else (
        f"signal {-code}" if code is not None else "no exit")
    tail = log.read_bytes()[-1500:].decode("utf-8", "replace").strip() if log.is_file() else ""
    run.stopped_at = cell
    what = _cell_words(cell) if cell else "its start-up or between cells"
    limits = ("; the checks' process (trusted.py) was killed: over its CPU time or memory limit (a loop over the "
              "submission's values, or a value from it too large to check)") if code in (-9, -24) else ""
    run.stop = RunOutcome("died", f"the kernel died while running {what} ({how}) before reporting a result" + limits
                          + (f"; its last output:\n{tail}" if tail else ""), answer_errors=list(errors))
    return run


def _cell_words(cell: dict) -> str:
    role = cell.get("role")
    if role == "answer":
        return f"answer cell {cell.get('grade_id')!r}"
    if role == "test":
        return f"test cell {cell.get('grade_id')!r}"
    if role in ("setup", "other"):
        return f"the exercise's cell {cell.get('n')}"
    return "the kernel's start-up"


def _event(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


