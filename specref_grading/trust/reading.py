"""The learner's notebook read in a limited process: its JSON and its answers' Python are parsed only there.

The rule: the grading process never parses what the learner wrote. The notebook's bytes (already size-capped:
notebook.read_capped) and the answer cells' text (each at most notebook.MAX_ANSWER_CHARS, checked before it is
sent) go to a fresh ``python -I`` that first limits itself (RLIMIT_AS: READ_MEMORY_MB of address space, RLIMIT_CPU:
READ_CPU_S), as root then becomes a fresh unprivileged uid with no groups (`_drop_self`: after its imports, before
it reads a byte of the learner's, so no account needs to be able to run the interpreter), and then parses them;
what comes back is plain data only:

* `read_submission`: the notebook slimmed to what grading reads (each cell's type, id, source, execution count,
  the types of its outputs, the scalar fields of its ``nbgrader`` and ``specref`` metadata; the notebook's
  ``specref`` stamp), checked as notebook.check_notebook checks it;
* `read_answers`: per answer, the scanner's notes, the names it binds and uses, whether it may bind names no
  reading settles (`scan.binds_unknown`), or why it cannot be read as Python.

Every failure (bad UTF-8 or JSON, an integer of thousands of digits, nesting too deep, the process over its memory
or CPU time, killed, or silent past READ_TIMEOUT_S) is a GradeError with its reason: the notebook could not be
graded, the run goes on with the next one.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from specref_grading.notebook import GradeError, check_notebook, parse_notebook, read_capped
from specref_grading.processes import _free_uid
from specref_grading.scan import UNREADABLE, binds_unknown, names_bound, names_used, scan

READ_MEMORY_MB = 1024  # the reading process's address space: ~200 bytes a byte of Python at the answers' cap
READ_CPU_S = 30  # its CPU time (SIGXCPU, then SIGKILL: RLIMIT_CPU's hard limit)
PR_SET_NO_NEW_PRIVS = 38
READ_TIMEOUT_S = 120  # its wall-clock time, on a loaded host
_SCALARS = (str, int, float, bool, type(None))
_META_KEYS = ("nbgrader", "specref")


# -- in the grading process ------------------------------------------------------------------------------------------
def _ask(op: str, payload: bytes, what: str) -> object:
    """Run `op` on `payload` in a fresh limited process; its answer, or GradeError naming `what` and why not. As
    root, that process becomes a fresh unprivileged uid before it reads the payload (`_drop_self`)."""
    cmd = [sys.executable, "-I", "-m", "specref_grading.trust.reading", op]
    if os.geteuid() == 0:
        cmd.append(str(_free_uid()))
    try:
        proc = subprocess.run(cmd, input=payload, capture_output=True, timeout=READ_TIMEOUT_S, cwd="/",
                              env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired:
        raise GradeError(f"{what} could not be read: reading it took more than {READ_TIMEOUT_S} s") from None
    except OSError as e:
        raise GradeError(f"{what} could not be read: the reading process did not start ({e})") from None
    try:
        reply = json.loads(proc.stdout)  # UTF-8, lone surrogates passed through as the learner wrote them
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict) or not ("ok" in reply or isinstance(reply.get("error"), str)):
        code = proc.returncode
        how = (f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        why = " (over its CPU time)" if code in (-9, -24) else ""
        raise GradeError(f"{what} could not be read: the process reading it ended ({how}){why}, over its "
                         f"limits ({READ_MEMORY_MB} MB, {READ_CPU_S} s of CPU): too large or nested too deeply")
    if "error" in reply:
        raise GradeError(reply["error"])
    return reply["ok"]


def parse_submission(data: bytes, path: Path | str) -> dict:
    """The submission in `data` (its file's bytes), parsed in the limited process and slimmed (module docstring)."""
    name = str(path).encode("utf-8", "replace").replace(b"\n", b" ")
    return check_notebook(_ask("notebook", name + b"\n" + data, str(path)), path)


def read_submission(path: Path | str) -> dict:
    """The submission at `path`: a regular file of at most MAX_NOTEBOOK_BYTES (notebook.read_capped), parsed in the
    limited process (`parse_submission`)."""
    return parse_submission(read_capped(Path(path)), path)


def read_answers(answers: dict[str, str], specref_names: set[str], allowed: dict[str, set[str]]) -> dict[str, dict]:
    """What the plan needs of each answer (`answers`: key -> its text), read in the limited process.

    Per key: {"findings": [[line, text], ...], "bound": [names], "used": [names], "unknown": bool,
    "syntax": None | [line, message] | [None, message]} (a SyntaxError's line and message, or why the text cannot be
    read as Python at all). `allowed[key]` is the specref names that answer may use without a note (scan.scan).
    """
    if not answers:
        return {}
    request = {"answers": answers, "specref_names": sorted(specref_names),
               "allowed": {k: sorted(v) for k, v in allowed.items()}}
    got = _ask("answers", json.dumps(request, ensure_ascii=True).encode("ascii"), "the answer cells")
    if not isinstance(got, dict) or set(got) != set(answers):
        raise GradeError("the answer cells could not be read: the reading process answered something else")
    return got


# -- in the reading process ------------------------------------------------------------------------------------------
def _limit_self() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (READ_MEMORY_MB << 20, READ_MEMORY_MB << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (READ_CPU_S, READ_CPU_S + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_self(uid: int) -> None:
    """Become `uid` (> 0; real, effective and saved; its own group; no supplementary groups), for good, with
    no_new_privs set and no capability left: the learner's bytes are parsed by an account that owns nothing."""
    if uid <= 0:
        raise SystemExit("the reading process drops to a fresh uid, never to root")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    caps = [int(status.get(k, "1").strip(), 16) for k in ("CapEff", "CapPrm", "NoNewPrivs")]
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups() or caps != [0, 0, 1]:
        raise SystemExit("the reading process could not drop root")


def _scalars(meta: object) -> dict:
    return {k: v for k, v in meta.items() if type(k) is str and type(v) in _SCALARS} if isinstance(meta, dict) else {}


def slim(nb: dict) -> dict:
    """A checked notebook reduced to what grading reads: nothing nested deeper than a cell's metadata fields."""
    cells = []
    for c in nb["cells"]:
        meta = c.get("metadata", {})
        src = c.get("source", "")
        cell = {"cell_type": c["cell_type"], "source": "".join(src) if isinstance(src, list) else src,
                "metadata": {k: _scalars(meta[k]) for k in _META_KEYS if isinstance(meta.get(k), dict)}}
        if isinstance(c.get("id"), str):
            cell["id"] = c["id"]
        if type(c.get("execution_count")) is int:
            cell["execution_count"] = c["execution_count"]
        if isinstance(c.get("outputs"), list):
            cell["outputs"] = [{"output_type": o["output_type"]} if isinstance(o, dict) and isinstance(
                o.get("output_type"), str) else {} for o in c["outputs"]]
        cells.append(cell)
    meta = nb.get("metadata", {})
    return {"cells": cells, "metadata": {"specref": _scalars(meta["specref"])} if isinstance(meta.get("specref"),
                                                                                            dict) else {}}


def _read_notebook(payload: bytes) -> dict:
    path, _, data = payload.partition(b"\n")
    return slim(parse_notebook(data, path.decode("utf-8", "replace")))


def answer_facts(text: str, specref_names: set[str], allowed: set[str]) -> dict:
    """One answer's facts (read_answers); never raises for what the text holds."""
    facts: dict = {"findings": [], "bound": [], "used": [], "unknown": False, "syntax": None}
    try:
        facts["findings"] = [[f.line, f.text] for f in scan(text, specref_names, allowed)]
        facts["bound"], facts["used"] = sorted(names_bound(text)), sorted(names_used(text))
        facts["unknown"] = binds_unknown(text)
    except SyntaxError as e:
        facts["syntax"] = [e.lineno, str(e.msg)]
    except UNREADABLE as e:  # null bytes, or nested too deeply for the parser or the walk (RecursionError, MemoryError)
        facts.update(findings=[], bound=[], used=[], unknown=False,
                     syntax=[None, str(e) if isinstance(e, ValueError) and str(e) else "it is nested too deeply"])
    return facts


def _read_answers(payload: bytes) -> dict:
    req = json.loads(payload.decode("ascii"))
    names = set(req["specref_names"])
    return {k: answer_facts(text, names, set(req["allowed"].get(k, ()))) for k, text in req["answers"].items()}


def main(op: str, uid: str | None = None) -> None:
    _limit_self()
    if uid is not None:
        _drop_self(int(uid))
    elif os.geteuid() == 0:
        raise SystemExit("as root the reading process needs the uid to drop to")
    payload = sys.stdin.buffer.read()
    try:
        reply = {"ok": {"notebook": _read_notebook, "answers": _read_answers}[op](payload)}
    except GradeError as e:
        reply = {"error": str(e)}
    except MemoryError:
        reply = {"error": f"it could not be read within {READ_MEMORY_MB} MB: too large or nested too deeply"}
    except RecursionError:
        reply = {"error": "it is nested too deeply to be read"}
    try:
        out = json.dumps(reply, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except MemoryError:
        out = json.dumps({"error": f"it could not be read within {READ_MEMORY_MB} MB"}).encode("ascii")
    sys.stdout.buffer.write(out)
    sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])
