"""The trusted side of the grading wall: runs the solution's tests, never the learner's code.

specref_grading/trust/wall.py starts this module (``python -I``, run as ``-m`` would run it) next to a jailed
kernel (specref_grading/jail.py) and writes the plan to its stdin:

    {"cells": [{"n", "role": "setup" | "answer" | "other" | "test", "grade_id", "source"}, ...],
     "rfd": n, "wfd": n, "events": n, "call_timeout": seconds, "test_cpu_s": seconds}

* setup cells run in both processes: here, to give the tests the exercise's own objects; in the
  kernel, for the learner's answers;
* answer and other cells run only in the kernel;
* test cells (hidden tests and the HIDDEN_SEED line included) run only here. Of the names a test reads,
  only those the plan lists in its "asks" (the names the exercise's answer cells bind, plan.py) and the
  setup did not bind are asked of the kernel: plain data arrives as a copy, a function or other object as
  a `Remote` handle (specref_grading/trust/remote.py) whose calls run in the kernel, under a per-call time
  limit; every other name comes from this side or is a NameError. What the checks hand to the learner's
  functions (models, samplers, generators' states, caches) is served from here, and revoked when the test
  ends (`Codec.revoke`): a handle the kernel kept from one test is refused in the next. A test may spend at
  most "test_cpu_s" of this process's CPU time (its checks and every call across the wall, either way),
  however many calls that is.

The outcome of each test is decided here, from whether its cell raised, and written as a JSON
line to the `events` pipe, which the kernel cannot reach. When a call into the kernel times out,
the kernel dies or the test passes its CPU cap, the test says so and this process stops;
specref_grading/trust/wall.py starts a fresh pair for the tests that remain.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import signal
import sys
import time

from specref_grading.trust.calls import Peer
from specref_grading.trust.errors import (
    CallTimeout,
    ChannelClosed,
    MessageRefused,
    WorkLimit,
    describe_error,
    error_text,
)
from specref_grading.trust.remote import Remote
from specref_grading.trust.trusted_policy import TrustedPolicy

_EVENTS = -1  # the events pipe, from the plan (main)


class CpuLimit(BaseException):
    """This process used up its CPU time (RLIMIT_CPU's soft limit: SIGXCPU; the hard limit kills it soon after)."""


def _on_sigxcpu(signum, frame) -> None:
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # once: the hard limit ends the process if this is ignored
    raise CpuLimit(f"the checks' process used up its CPU time ({resource.getrlimit(resource.RLIMIT_CPU)[0]} s)")


def _usage() -> dict:
    """This process's peak memory (MB: VmHWM, its own; getrusage's ru_maxrss also counts the grader's RSS at the
    fork that made it) and CPU time (s) so far, reported with each test's result."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    peak = r.ru_maxrss
    try:
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return {"maxrss_mb": round(peak / 1024, 1), "cpu_s": round(r.ru_utime + r.ru_stime, 2)}


def emit(event: dict) -> None:
    data = (json.dumps(event, default=str, ensure_ascii=True) + "\n").encode("ascii")
    while data:
        data = data[os.write(_EVENTS, data):]


_CHANGED = "changed an input the check passed in: a function must not modify its input values"


def changed_flags(peer: Peer, names: dict[int, str]) -> list[str]:
    """The test's flags for the calls into the kernel that changed arrays in place (`Peer.changed`, from the wire:
    whatever the callee is, a function, a method, a callable object or a functools.partial of the submission)."""
    flags: list[str] = []
    for hid in peer.changed:
        text = f"{names[hid]}() {_CHANGED}" if hid in names else f"the submission's code {_CHANGED}"
        if text not in flags:
            flags.append(text)
    return flags


def run_test(cell: dict, ns: dict, peer: Peer, answer_errors: list[str], cpu_s: float | None = None) -> bool:
    """Run one test cell here; True when the kernel is still usable afterwards.

    `cpu_s` caps this process's CPU time on the test (the check's own work and every call it makes or serves): past
    it the next call across the wall stops the test (WorkLimit). The cap is on this side's work, not on the
    submission's calls: an honest answer may call what it was given as often as its algorithm needs. Only the
    names in `cell["asks"]` are asked of the kernel; what this side exported during the test is revoked at its end.
    """
    n = cell["n"]
    emit({"ev": "start", "n": n, "role": "test"})
    tns = dict(ns)
    names: dict[int, str] = {}  # the handles the test reads by name, for its flags (main clears peer.changed)
    filename = f"<test cell {n}>"
    first, cpu0 = peer.calls + peer.served, time.process_time()
    peer.cpu_limit = None if cpu_s is None else cpu0 + cpu_s
    kept = set(peer.exports)  # what was exported before the test (the served names) outlives it; nothing else
    try:
        for name in cell.get("asks", ()):
            if name in tns:
                continue
            try:
                value = peer.request("get", name)
            except NameError:
                continue
            if isinstance(value, Remote):
                names.setdefault(value._hid, name)
            tns[name] = value
        code = compile(cell["source"], filename, "exec", dont_inherit=True)
        exec(code, tns)  # noqa: S102 - the solution's own test cell
        outcome, message = "passed", ""
    except WorkLimit:
        emit({"ev": "stop", "n": n, "outcome": "failed",
              "message": f"stopped: this test took more than {cpu_s:g} s of the checks' CPU time, in "
                         f"{peer.calls + peer.served - first} calls between the checks and the submission's code "
                         "(a value the checks loop over without end, or code that calls back without end)",
              "answer_errors": answer_errors, **_usage()})
        return False
    except CpuLimit:
        emit({"ev": "stop", "n": n, "outcome": "timeout",
              "message": "stopped: the checks' process used up its CPU time for this submission "
                         f"({resource.getrlimit(resource.RLIMIT_CPU)[0]} s) in this test (an endless loop over "
                         "the submission's values, or far too slow)", "answer_errors": answer_errors, **_usage()})
        return False
    except MessageRefused as e:
        emit({"ev": "stop", "n": n, "outcome": "error",
              "message": f"the submission's code sent a value the grader refuses: {e}", "answer_errors": answer_errors,
              **_usage()})
        return False
    except MemoryError:
        emit({"ev": "stop", "n": n, "outcome": "error",
              "message": "the checks' process ran out of memory in this test (a value from the submission's code "
                         "too large to check)", "answer_errors": answer_errors, **_usage()})
        return False
    except CallTimeout:
        emit({"ev": "stop", "n": n, "outcome": "timeout",
              "message": f"timed out: a call to the submission's code did not return within {peer.timeout:.0f} s "
                         "(an endless loop, or far too slow)", "answer_errors": answer_errors})
        return False
    except ChannelClosed:
        emit({"ev": "stop", "n": n, "outcome": "died",
              "message": "the kernel running the submission's code died during this test",
              "answer_errors": answer_errors, "kernel": True})
        return False
    except AssertionError as e:
        outcome, message = "failed", error_text(e)
    except NotImplementedError as e:
        outcome, message = "failed", "not implemented yet: an answer still raises NotImplementedError" + (
            f" ({error_text(e)})" if error_text(e) else "")
    except Exception as e:  # noqa: BLE001
        outcome, message = "error", describe_error(e, filename)
    finally:
        peer.cpu_limit = None
        peer.revoke(kept)
    flags = changed_flags(peer, names)
    peer.changed.clear()
    emit({"ev": "result", "n": n, "grade_id": cell.get("grade_id"), "outcome": outcome, "message": message,
          "flags": flags, "answer_errors": list(answer_errors), "calls": peer.calls + peer.served - first,
          "test_cpu_s": round(time.process_time() - cpu0, 2),
          "peak_items": [peer.peak_items, peer.peak_sent], "peak_head": peer.peak_head, **_usage()})
    return True


def main(_plan: dict) -> None:
    global _EVENTS
    _EVENTS = int(_plan["events"])
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    try:  # not dumpable: an unjailed kernel of the same user cannot ptrace this process or open its /proc/PID/fd
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # 4 = PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass
    cells = _plan["cells"]
    peer = Peer(int(_plan["rfd"]), int(_plan["wfd"]), "trusted", timeout=float(_plan["call_timeout"]),
                policy=TrustedPolicy())
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    answer_errors: list[str] = []
    for cell in cells:
        n, role, source = cell["n"], cell["role"], cell["source"]
        if role == "test":
            peer.changed.clear()  # what the calls of this test change in place flags this test only
            if not run_test(cell, ns, peer, answer_errors, float(_plan["test_cpu_s"])):
                return
            continue
        emit({"ev": "start", "n": n, "role": role})
        filename = f"<{role} cell {n}>"
        if role in ("checks", "setup"):  # here first: what the kernel's specref lacks is then served from here
            try:
                exec(compile(source, filename, "exec", dont_inherit=True), ns)  # noqa: S102
                served = peer.policy.serve({name: ns[name] for name in cell.get("serve", []) if name in ns})
                if served:
                    peer.request("bind", served)
                error = None
            except (ChannelClosed, CallTimeout):
                emit({"ev": "stop", "n": n, "outcome": "died", "message": f"the kernel died while cell {n} was "
                      "served", "answer_errors": answer_errors, "kernel": True})
                return
            except BaseException as e:  # noqa: BLE001
                error = "in the grader: " + describe_error(e, filename)
            if error is not None:
                emit({"ev": "cell_error", "n": n, "role": "setup", "grade_id": None, "message": str(error)})
                return
            if role == "checks":  # the checks' imports: never in the kernel
                emit({"ev": "end", "n": n})
                continue
            source = cell.get("kernel_source", source)
        try:
            saved, peer.timeout = peer.timeout, None  # a cell's time is limited by the grader, per cell
            try:
                error = peer.request("exec", source, filename)
            finally:
                peer.timeout = saved
        except (ChannelClosed, CallTimeout):
            emit({"ev": "stop", "n": n, "outcome": "died", "message": f"the kernel died while running "
                  f"{'answer cell ' + repr(cell.get('grade_id')) if role == 'answer' else 'cell ' + str(n)}",
                  "answer_errors": answer_errors, "kernel": True})
            return
        if role == "setup":
            if error is not None:
                emit({"ev": "cell_error", "n": n, "role": role, "grade_id": None, "message": str(error)})
                return
        elif error is not None:
            emit({"ev": "cell_error", "n": n, "role": role, "grade_id": cell.get("grade_id"), "message": str(error)})
            answer_errors.append(f"{role} cell {cell.get('grade_id') or n}: {error}")
        emit({"ev": "end", "n": n})
    emit({"ev": "done"})



if __name__ == "__main__":
    try:
        main(json.loads(sys.stdin.buffer.read().decode("utf-8")))
    except BaseException as _e:  # noqa: BLE001
        try:
            emit({"ev": "internal_error", "message": describe_error(_e, "")})
        except BaseException:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
