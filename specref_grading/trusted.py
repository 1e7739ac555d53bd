"""The trusted side of the grading wall: runs the solution's tests, never the learner's code.

specref_grading/wall.py starts this file (``python -I specref_grading/trusted.py``) next to a jailed kernel
(specref_grading/jail.py) and writes the plan to its stdin:

    {"cells": [{"n", "role": "setup" | "answer" | "other" | "test", "grade_id", "source"}, ...],
     "rfd": n, "wfd": n, "events": n, "call_timeout": seconds}

* setup cells run in both processes: here, to give the tests the exercise's own objects; in the
  kernel, for the learner's answers;
* answer and other cells run only in the kernel;
* test cells (hidden tests and the HIDDEN_SEED line included) run only here. A name a test reads
  that the setup did not bind is asked of the kernel: plain data arrives as a copy, a function or
  other object as a `Remote` handle (specref_grading/protocol.py) whose calls run in the kernel, under a
  per-call time limit. What the checks hand to the learner's functions (models, samplers,
  generators' states, caches) is served from here.

The outcome of each test is decided here, from whether its cell raised, and written as a JSON
line to the `events` pipe, which the kernel cannot reach. When a call into the kernel times out
or the kernel dies, the test says so and this process stops; specref_grading/wall.py starts a fresh pair
for the tests that remain.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import sys

from specref_grading.protocol import CallTimeout, ChannelClosed, Peer, Remote, _message, describe_error

_EVENTS = -1  # the events pipe, from the plan (main)


def emit(event: dict) -> None:
    data = (json.dumps(event, default=str, ensure_ascii=True) + "\n").encode("ascii")
    while data:
        data = data[os.write(_EVENTS, data):]


def names_loaded(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)})


def _arrays(values) -> list:
    kinds = tuple(t for t in (getattr(sys.modules.get("torch"), "Tensor", None),
                              getattr(sys.modules.get("numpy"), "ndarray", None)) if t is not None)
    return [v for v in values if kinds and isinstance(v, kinds)]


def _same(a, b) -> bool:
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return bool(np.array_equal(a, b))


class Watched:
    """A learner's function as the checks see it: a call into the kernel that reports changed inputs."""

    def __init__(self, remote: Remote, name: str, flags: list[str]):
        self._remote, self.__name__, self.__qualname__, self._flags = remote, name, name, flags

    def __call__(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        before = [(a, a.clone() if hasattr(a, "clone") else a.copy()) for a in _arrays(values)]
        out = self._remote(*args, **kwargs)
        if any(not _same(a, b) for a, b in before):
            text = (f"{self.__name__}() changed an input the check passed in: a function must not modify its "
                    "input values")
            if text not in self._flags:
                self._flags.append(text)
        return out

    def __repr__(self) -> str:
        return f"<function {self.__name__} (the submission's)>"


def run_test(cell: dict, ns: dict, peer: Peer, answer_errors: list[str]) -> bool:
    """Run one test cell here; True when the kernel is still usable afterwards."""
    n = cell["n"]
    emit({"ev": "start", "n": n, "role": "test"})
    tns = dict(ns)
    flags: list[str] = []
    filename = f"<test cell {n}>"
    try:
        for name in names_loaded(cell["source"]):
            if name in tns or hasattr(builtins, name):
                continue
            try:
                value = peer.request("get", name)
            except NameError:
                continue
            tns[name] = Watched(value, name, flags) if isinstance(value, Remote) and value._kind in (
                "function", "method", "builtin_function_or_method") else value
        code = compile(cell["source"], filename, "exec", dont_inherit=True)
        exec(code, tns)  # noqa: S102 - the solution's own test cell
        outcome, message = "passed", ""
    except CallTimeout:
        emit({"ev": "stop", "n": n, "outcome": "timeout",
              "message": f"timed out: a call to the submission's code did not return within {peer.timeout:.0f} s "
                         "(an endless loop, or far too slow)", "answer_errors": answer_errors})
        return False
    except ChannelClosed as e:
        emit({"ev": "stop", "n": n, "outcome": "died",
              "message": "the kernel running the submission's code died during this test",
              "answer_errors": answer_errors, "kernel": True})
        return False
    except AssertionError as e:
        outcome, message = "failed", _message(e)
    except NotImplementedError as e:
        outcome, message = "failed", "not implemented yet: an answer still raises NotImplementedError" + (
            f" ({_message(e)})" if _message(e) else "")
    except Exception as e:  # noqa: BLE001
        outcome, message = "error", describe_error(e, filename)
    emit({"ev": "result", "n": n, "grade_id": cell.get("grade_id"), "outcome": outcome, "message": message,
          "flags": flags, "answer_errors": list(answer_errors)})
    return True


def main(_plan: dict) -> None:
    global _EVENTS
    _EVENTS = int(_plan["events"])
    cells = _plan["cells"]
    peer = Peer(int(_plan["rfd"]), int(_plan["wfd"]), "trusted", timeout=float(_plan["call_timeout"]), trusted=True)
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    answer_errors: list[str] = []
    for cell in cells:
        n, role, source = cell["n"], cell["role"], cell["source"]
        if role == "test":
            if not run_test(cell, ns, peer, answer_errors):
                return
            continue
        emit({"ev": "start", "n": n, "role": role})
        filename = f"<{role} cell {n}>"
        try:
            saved, peer.timeout = peer.timeout, None  # a cell's time is limited by the grader, per cell
            try:
                error = peer.request("exec", source, filename)
            finally:
                peer.timeout = saved
        except (ChannelClosed, CallTimeout) as e:
            emit({"ev": "stop", "n": n, "outcome": "died", "message": f"the kernel died while running "
                  f"{'answer cell ' + repr(cell.get('grade_id')) if role == 'answer' else 'cell ' + str(n)}",
                  "answer_errors": answer_errors, "kernel": True})
            return
        if role == "setup":
            if error is None:
                try:
                    exec(compile(source, filename, "exec", dont_inherit=True), ns)  # noqa: S102
                except BaseException as e:  # noqa: BLE001
                    error = "in the grader: " + describe_error(e, filename)
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
