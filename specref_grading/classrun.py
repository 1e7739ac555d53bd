"""Grade a class: every submission in a folder, in parallel, resumable, with feedback and hand-grading sheets.

    python -I -m specref_grading.classrun grade submissions/ [--jobs N] [--csv book.csv] [--seed N|random]
    python -I -m specref_grading.classrun merge submissions/ [--csv book.csv]     # the instructor's hand marks
    make grade-all DIR=submissions/ JOBS=2      make grade-merge DIR=submissions/

Each submission is graded by specref_grading.grade's ``grade()`` in one of N worker processes (default: one
per core, fewer where the available memory holds fewer submissions at their caps: `default_jobs`; N asked for
lowers the kernel's cap, or the workers, until N x caps fits: `sized`). Where this host cannot jail the learner's
code the run is refused unless ``--unjailed`` asks (never as root), and the jail mode is in each submission's key.

Everything is written next to the gradebook (default DIR-grading/gradebook.csv: a folder the grader makes beside
the class's, never inside it), only through paths that are the grader's own and no link (`check_outputs`, each
file created exclusively and renamed into place: `_write_private`). Every learner string written or shown is data
(`report.as_data`: newlines, control characters and lone surrogates escaped); a submission is named in file names
and sheet rows by an opaque id (`sid`), never by its file name; a submission that cannot be read (a FIFO, a link,
a file over the size cap) is that submission's reason, never a stop of the run:

- ``gradebook.csv``: one row per submission (the autograded points per task, the hand marks per
  question, what awaits hand grading, flags, reasons, the hidden seed the row was graded with);
- ``gradebook.state.json``: per submission, what its grade depends on (the hash of its bytes, of its
  solution and of the grader's code, and the jail mode), the hidden seed it was graded with and its report, and the merged
  hand marks. A later ``grade`` of the same folder regrades only what changed;
- ``gradebook-feedback/<id>.md``: one per submission (the gradebook's ``feedback`` column names it), for the
  learner: per task the points, what failed and why (the report's own words, never an expected answer it does
  not give); no seed;
- ``gradebook-handgrading/<exercise>.<question>.csv``: one per hand-graded question, every learner's
  answer with an empty ``marks`` column (an answer left as the exercise's stub comes marked 0), the question's
  rubric from its solution (the ``rubric`` column: points per element, a model answer) and the submission's
  ``id``, by which ``merge`` reads the row (a row typed in without one is read by its ``file``). ``merge``
  reads the marks back, all or nothing: a mark must be a number in 0..points, and a sheet row must
  name a graded submission and one of its hand-graded questions.

The hidden seed: a fresh random one for every submission graded, each time it is graded: a new or
changed submission in a resumed run draws a new one, so handing in again and again within a run shows a
new hidden case each time, never the same one more closely (a failing hidden case prints its inputs).
An unchanged submission keeps its grade and its seed. ``--seed N`` grades everything with N (and regrades
what was graded with another seed); ``--fresh`` starts a new run, everything regraded. The seeds are in the
gradebook (per row) and the state, never in the learners' feedback. The outputs are readable by their
owner only: the state and the sheets hold every learner's answers.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import secrets
import stat
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from specref_grading import grade as grading
from specref_grading import jail
from specref_grading.exercises import MarkerError, check_rubrics, strip_regions
from specref_grading.grade import CELL_TIMEOUT_S, ROOT, RUN_TIMEOUT_S, grade
from specref_grading.notebook import GradeError, find_solution, nbgrader, read_capped, read_notebook
from specref_grading.plan import hidden_seed
from specref_grading.processes import KERNEL_MIN_MB, die_with_parent, submission_cap_mb
from specref_grading.report import (
    EXIT_FAILED,
    EXIT_FULL,
    EXIT_REVIEW,
    EXIT_UNGRADABLE,
    STATUS,
    Report,
    as_data,
    printable,
    status_text,
)
from specref_grading.trust.reading import parse_submission
from specref_grading.trust.wall import MEMORY_MB
from specref_grading.version import grader_version

STATE_VERSION = 1
TRANSIENT = {"timeout", "died"}  # outcomes --retry regrades even when nothing changed


class MergeError(Exception):
    """The instructor's sheets cannot be merged; the message lists every problem."""


# --------------------------------------------------------------------------------------
# Where things are, and what a grade depends on
# --------------------------------------------------------------------------------------
def outputs(csv_path: Path) -> dict[str, Path]:
    """The run's files, named after the gradebook."""
    base = csv_path.with_suffix("")
    return {"csv": csv_path, "state": base.with_name(base.name + ".state.json"),
            "feedback": base.with_name(base.name + "-feedback"),
            "sheets": base.with_name(base.name + "-handgrading")}


def default_csv(folder: Path) -> Path:
    """The gradebook when none is named: in a folder the grader makes beside the class's, never inside it
    (``submissions/`` -> ``submissions-grading/gradebook.csv``), where nothing a learner handed in can be."""
    top = Path(os.path.abspath(folder))
    if top.parent == top:
        raise GradeError(f"{folder} has no parent folder to hold the outputs: name the gradebook with --csv")
    return top.parent / f"{top.name}-grading" / "gradebook.csv"


class OutputError(GradeError):
    """An output path that is a link, or not the grader's own: the run is refused before anything is written."""


def sid(rel: str) -> str:
    """A submission's opaque id (from a hash of its path in the class): its sheet rows' key and its feedback file's
    name, never the learner's own file name (which may be 255 bytes long, hold any byte, or look like a formula)."""
    return "s" + sha256(rel.encode("utf-8", "surrogatepass"))[:16]


def feedback_file(out: dict[str, Path], rel: str) -> Path:
    """Where the learner's feedback on submission `rel` is written (by its opaque id: `sid`)."""
    return out["feedback"] / f"{sid(rel)}.md"


def _owned(path: Path) -> None:
    """OutputError unless `path` is missing, or is no link and belongs to the grader (this process's uid)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"refused: the output path {as_data(path)} is a symbolic link; the grader writes only "
                          "through paths of its own (remove it, or name another gradebook with --csv)")
    if st.st_uid != os.geteuid():
        raise OutputError(f"refused: the output path {as_data(path)} belongs to uid {st.st_uid}, not to the grader "
                          f"(uid {os.geteuid()}); name another gradebook with --csv")


def check_outputs(folder: Path, out: dict[str, Path]) -> None:
    """Refuse (OutputError) an output path that is a link or not the grader's: each output itself and the folder
    holding them, and where they lie inside the class's folder, every folder between that folder and them (a
    learner's archive may plant either)."""
    top = Path(os.path.abspath(folder))
    for path in out.values():
        p = Path(os.path.abspath(path))
        if top in p.parents:
            parts = p.relative_to(top).parts
            for n in range(1, len(parts) + 1):
                _owned(top.joinpath(*parts[:n]))
        else:
            _owned(p)
            _owned(p.parent)


def submissions(folder: Path, skip: Path | None = None) -> list[Path]:
    """Every notebook under `folder`, those reached through a symbolic link included (`linked` says which), and
    any other entry named *.ipynb that is not a folder (a FIFO, a device: listed, never opened as a notebook);
    nothing under `skip` (the run's own outputs, where they lie inside the folder).

    A linked folder is listed, not descended into any further: a link inside it, or a link to a parent, is not
    followed, so no loop and no notebook elsewhere is ever graded.
    """
    found: list[Path] = []
    for top, dirs, files in os.walk(folder):  # followlinks=False
        if skip is not None:
            dirs[:] = [d for d in dirs if os.path.abspath(os.path.join(top, d)) != os.path.abspath(skip)]
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                found += [Path(t, f) for t, _, fs in os.walk(os.path.join(top, d)) for f in fs if f.endswith(".ipynb")]
        found += [Path(top, f) for f in files if f.endswith(".ipynb")]
    return sorted(p for p in found if ".ipynb_checkpoints" not in p.relative_to(folder).parts)


def linked(folder: Path, path: Path) -> bool:
    """Whether `path` or a folder between it and `folder` is a symbolic link (it may be another learner's file)."""
    rel = path.relative_to(folder)
    return any((folder / Path(*rel.parts[:n])).is_symlink() for n in range(1, len(rel.parts) + 1))


LINKED = "a symbolic link: only the notebook files themselves are graded, never a link to a notebook or a folder"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def solution_version(data: bytes, solutions_dir: Path) -> str:
    """The solution this submission is graded against (by its exercise id) and the hash of its bytes."""
    try:
        path = find_solution(parse_submission(data, "the submission"), solutions_dir)  # parsed in a limited process
    except GradeError:
        path = None
    if path is None:  # ungradable as it is; regraded if the set of solutions changes
        names = ",".join(p.name for p in sorted(solutions_dir.glob("*.ipynb")))
        return "none:" + sha256(names.encode())[:16]
    return f"{path.name}:{sha256(path.read_bytes())[:16]}"


def _open_dir(path: Path) -> int:
    """A descriptor of folder `path`, itself no link and the grader's own (OutputError otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(path):
            raise OutputError(f"refused: the output folder {as_data(path)} is a symbolic link") from e
        raise
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise OutputError(f"refused: the output folder {as_data(path)} is not the grader's own")
    return fd


def _write_private(path: Path, text: str) -> None:
    """Write `text` atomically, readable by the owner only, never through a link: a new file of a random name,
    created exclusively (O_EXCL | O_NOFOLLOW) in the folder opened as itself, then renamed over `path` (a rename
    replaces a link; it never writes through one). Text that cannot be encoded is written escaped."""
    dfd = _open_dir(path.parent)
    tmp = f".{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8", "backslashreplace"))
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def _read_private(path: Path) -> str | None:
    """The text of the grader's own file `path` (None where it is missing), never read through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OutputError(f"refused: {as_data(path)} is not a regular file")
        return f.read().decode("utf-8")


def _private_dir(path: Path) -> None:
    """Make folder `path` (mode 0700) or check the one there: no link, the grader's own; then mode 0700."""
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = _open_dir(path)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def load_state(path: Path) -> dict | None:
    try:
        text = _read_private(path)
        if text is None:
            return None
        state = json.loads(text)
    except (OSError, ValueError) as e:
        raise GradeError(f"cannot read the run's state {path}: {e}; --fresh starts a new run") from e
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise GradeError(f"{path} is not a state file of this grader; --fresh starts a new run")
    return state


# --------------------------------------------------------------------------------------
# Grading, in parallel
# --------------------------------------------------------------------------------------
def _grade_one(path: str, seed: int, solutions_dir: str, cell_timeout: float, run_timeout: float,
               memory_mb: int, unjailed: bool = False) -> tuple[dict, float, bool]:
    """One submission in a worker: (its report as a dict, seconds, whether the grader itself failed)."""
    start = time.monotonic()
    try:
        rep = grade(Path(path), solutions_dir=Path(solutions_dir), cell_timeout=cell_timeout,
                    run_timeout=run_timeout, seed=seed, memory_mb=memory_mb, unjailed=unjailed)
        return rep.as_dict(), time.monotonic() - start, False
    except Exception as e:  # a bug of the grader, not of the submission: reported, never cached
        return _grader_failed(path, e), time.monotonic() - start, True


def _grader_failed(path: str, e: BaseException) -> dict:
    return Report(path, error=f"the grader failed on this notebook: {type(e).__name__}: {e}").as_dict()


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _cgroup_memory_left_mb() -> int | None:
    """What the grader's own cgroup still lets it take (its memory limit less its usage), in MB; None where it has
    no limit or none can be read (cgroup v2's memory.max, v1's memory.limit_in_bytes)."""
    own = jail.own_cgroups()
    pairs = []
    if "" in own:
        d = os.path.join(jail.CGROUP_ROOT, own[""].lstrip("/"))
        pairs.append((os.path.join(d, "memory.max"), os.path.join(d, "memory.current")))
    if "memory" in own:
        d = os.path.join(jail.CGROUP_ROOT, "memory", own["memory"].lstrip("/"))
        pairs.append((os.path.join(d, "memory.limit_in_bytes"), os.path.join(d, "memory.usage_in_bytes")))
    for limit, usage in pairs:
        try:
            with open(limit) as f, open(usage) as g:
                cap, used = f.read().strip(), int(g.read().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 1 << 60:
            return max(0, int(cap) - used) >> 20
    return None


def _memory_available_mb() -> int | None:
    """The memory grading may take, in MB: the host's available memory (MemAvailable of /proc/meminfo), or less
    where the grader's own cgroup has less left; None where neither can be read."""
    host = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    left = [m for m in (host, _cgroup_memory_left_mb()) if m is not None]
    return min(left) if left else None


def default_jobs(memory_mb: int = MEMORY_MB) -> int:
    """Workers for a class: min(cores, available memory / what one submission may take), at least 1.

    One core per worker (each kernel and its trusted process get one CPU's time), and no more workers than the
    memory available now holds at the caps of one submission, its kernel (`memory_mb`), the kernel's /tmp and its
    trusted process together (processes.submission_cap_mb): jobs x caps <= available memory, so that no set of
    submissions can together take more than the host has. Where the memory cannot be read, one per core.
    """
    cores = _cores()
    memory = _memory_available_mb()
    if memory is None:
        return cores
    return max(1, min(cores, memory // submission_cap_mb(memory_mb)))


def sized(jobs: int, memory_mb: int, available: int | None) -> tuple[int, int]:
    """(workers, kernel cap) for `jobs` workers asked for, so that workers x (kernel + /tmp + trusted caps) <=
    `available` memory: the kernel's cap `memory_mb` lowered where the workers need it (never below KERNEL_MIN_MB),
    and fewer workers where even that does not fit (at least one, which keeps `memory_mb`: its caps exceed nothing
    that workers add)."""
    if jobs == 1 or available is None or jobs * submission_cap_mb(memory_mb) <= available:
        return jobs, memory_mb
    jobs = max(1, min(jobs, available // submission_cap_mb(KERNEL_MIN_MB)))
    if jobs == 1:
        return 1, memory_mb
    return jobs, min(memory_mb, available // jobs - submission_cap_mb(0))


def jail_refusal(unjailed: bool) -> str | None:
    """Why this run refuses to grade (None where it may): no jail here and --unjailed not given, or learner code
    that would run as root (`grade.jail_refusal`)."""
    return grading.jail_refusal(unjailed)


def _read_submission(path: Path) -> bytes:
    """A submission's bytes: a regular file, no link, size-capped (notebook.read_capped); GradeError otherwise."""
    return read_capped(path, follow=False)


def _unreadable(rel: str, error: str, echo) -> dict:
    """The state entry of a submission that cannot be read: never graded, never cached (it is tried on every run)."""
    report = {**Report(rel, error=error).as_dict(), "path": rel}
    echo(console_line(rel, report, {}))
    return {"key": None, "report": report, "seconds": 0.0}


def run(folder: Path, csv_path: Path | None = None, *, jobs: int | None = None, seed: str | int | None = None,
        fresh: bool = False, retry: bool = False, solutions_dir: Path | None = None,
        cell_timeout: float = CELL_TIMEOUT_S, run_timeout: float = RUN_TIMEOUT_S, memory_mb: int = MEMORY_MB,
        echo=print, progress: bool = False, unjailed: bool = False) -> dict:
    """Grade every submission under `folder` that is new or changed; write the gradebook, feedback and sheets.

    `echo` gets each graded submission's console line (learner strings escaped: `as_data`); `progress` shows a
    progress bar (tqdm, on stderr). Each submission graded here gets a fresh hidden seed of its own
    (`hidden_seed("random")`), unless `seed` fixes one for all; an unchanged one keeps its report and its seed (the
    state's entry holds both). The outputs go to `csv_path`'s folder (default: `default_csv`, beside the class's
    folder); an output path that is a link or not the grader's is refused before anything runs (`check_outputs`).
    Without a jail, nothing is graded unless `unjailed` asks (`jail_refusal`); the jail mode is part of each
    submission's key, so a jailed run regrades what an unjailed one graded.
    Returns a summary: seed (the fixed seed, or None: one per submission, see `seeds`), seeds (per file, of
    the submissions graded now), files, graded, reused, wall_s, per_minute, mean_s, exit_code, rows, outputs.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise GradeError(f"no such folder: {folder}")
    out = outputs(Path(csv_path) if csv_path else default_csv(folder))
    check_outputs(folder, out)
    why = jail_refusal(unjailed)
    if why is not None:
        raise GradeError(why)
    mode = grading.jail_mode()
    solutions_dir = Path(solutions_dir or ROOT / "solutions")
    jobs = default_jobs(memory_mb) if jobs is None else jobs
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise GradeError(f"--jobs must be an integer >= 1, got {jobs!r}")
    jobs, memory_mb = sized(jobs, memory_mb, _memory_available_mb())
    _out_dir(out["csv"].parent)
    state = None if fresh else load_state(out["state"])
    fixed = hidden_seed(seed) if seed is not None else None  # None: a fresh seed per submission graded
    if state is None:
        state = {"version": STATE_VERSION, "entries": {}, "hand": {}}
    state.pop("seed", None)  # a state of the one-seed-per-run grader: each entry has its own now
    state["solutions_dir"] = str(solutions_dir.resolve())
    grader = grader_version()  # specref and this package, hashed once per run

    files = submissions(folder, skip=out["csv"].parent)
    keys: dict[str, dict] = {}
    todo: list[tuple[str, Path]] = []
    seeds: dict[str, int] = {}  # the seed each submission graded now is graded with
    for path in files:
        rel = path.relative_to(folder).as_posix()
        if linked(folder, path):  # never read, never graded: recorded as it is, on every run
            keys[rel] = {"linked": True}
            state["entries"][rel] = _unreadable(rel, LINKED, echo)
            continue
        try:  # one submission that cannot be read is that submission's problem, never the run's
            data = _read_submission(path)
            key = {"submission": sha256(data), "solution": solution_version(data, solutions_dir), "grader": grader,
                   "jail": mode}
        except (GradeError, OSError) as e:
            keys[rel] = {"unreadable": True}
            state["entries"][rel] = _unreadable(rel, str(e).replace(str(path), rel), echo)
            continue
        keys[rel] = key
        old = state["entries"].get(rel)
        old_key = dict(old.get("key") or {}) if old else {}
        old_seed = old.get("seed", old_key.pop("seed", None)) if old else None  # a key of old held the seed
        stale = old is None or old.get("key") is None or old_key != key
        if not stale and fixed is not None:
            stale = old_seed != fixed
        if not stale and retry:
            stale = any(t.get("outcome") in TRANSIENT for t in old["report"].get("tests", []))
        if stale:
            todo.append((rel, path))
            # A fresh seed for every grading: what a failing hidden case printed last time is no use this time.
            seeds[rel] = fixed if fixed is not None else hidden_seed("random")
        elif "seed" not in old:
            old["seed"] = old_seed
    state["entries"] = {rel: e for rel, e in state["entries"].items() if rel in keys}  # deleted files leave

    start = time.monotonic()
    args = (str(solutions_dir), cell_timeout, run_timeout, memory_mb, unjailed)
    seconds: list[float] = []
    bar = None
    if progress and todo:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="grading", unit="notebook")
        if echo is print:
            echo = tqdm.write

    def done(rel: str, result: tuple[dict, float, bool]) -> None:
        report, secs, failed = result
        seconds.append(secs)
        report["path"] = rel
        if report.get("error"):  # the learner's feedback names their file, not the instructor's folders
            report["error"] = report["error"].replace(str(folder / rel), rel)
        entry = {"key": None if failed else keys[rel], "seed": seeds[rel], "report": report, "seconds": round(secs, 3)}
        state["entries"][rel] = entry
        _write_private(out["state"], json.dumps(state, indent=1))  # a run stopped half-way resumes from here
        echo(console_line(rel, report, _hand(state, rel, report)))
        if bar is not None:
            bar.update(1)

    if todo and jobs == 1:
        for rel, path in todo:
            done(rel, _grade_one(str(path), seeds[rel], *args))
    elif todo:
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)),
                                 mp_context=multiprocessing.get_context("spawn"),
                                 initializer=die_with_parent,  # a stopped run stops its workers
                                 initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(_grade_one, str(path), seeds[rel], *args): rel for rel, path in todo}
            for fut in as_completed(futures):
                try:
                    result = fut.result()
                except Exception as e:  # a worker lost (killed, out of memory): the grader's fault, never cached
                    result = (_grader_failed(futures[fut], e), 0.0, True)
                done(futures[fut], result)
    wall = time.monotonic() - start
    if bar is not None:
        bar.close()
    _write_private(out["state"], json.dumps(state, indent=1))
    rows = write_outputs(state, out)
    codes = [r["exit_code"] for r in rows]
    worst = next((c for c in (EXIT_UNGRADABLE, EXIT_REVIEW, EXIT_FAILED) if c in codes), EXIT_FULL)
    return {"seed": fixed, "seeds": seeds, "files": len(files), "graded": len(todo), "reused": len(files) - len(todo),
            "wall_s": wall, "per_minute": 60 * len(todo) / wall if todo and wall > 0 else None,
            "mean_s": sum(seconds) / len(seconds) if seconds else None, "jobs": jobs, "memory_mb": memory_mb,
            "exit_code": worst, "rows": rows, "outputs": out}


def _out_dir(path: Path) -> None:
    """The folder of the outputs: made (mode 0700, its parents too) where it is missing; else checked: no link,
    the grader's own (its mode left as the instructor set it)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.close(_open_dir(path))


# --------------------------------------------------------------------------------------
# Hand marks, rows and the console line
# --------------------------------------------------------------------------------------
def _hand(state: dict, rel: str, report: dict) -> dict[str, dict]:
    """The merged hand marks that still apply: those given to the very answer the report holds."""
    marks = state.get("hand", {}).get(rel, {})
    out = {}
    for m in report.get("manual", []):
        got = marks.get(m["grade_id"])
        if got is not None and got.get("answer") == sha256(m["answer"].encode("utf-8", "surrogatepass")):
            out[m["grade_id"]] = got
    return out


def _pending(report: dict, hand: dict) -> float:
    return 0.0 if report.get("error") else sum(m["points"] for m in report.get("manual", [])
                                               if m["grade_id"] not in hand)


def _status(report: dict, hand: dict) -> str:
    """grade.status_text, and "full marks" only when the hand marks are full too."""
    text = status_text(report["exit_code"], _pending(report, hand))
    got, possible = sum(h["marks"] for h in hand.values()), sum(m["points"] for m in report.get("manual", []))
    if text == STATUS[EXIT_FULL] and got < possible:
        return f"autograded checks passed, {got:g}/{possible:g} by hand"
    return text


def _exercise_in_name(rel: str) -> str | None:
    m = re.match(r"(ex\d+)", Path(rel).name)
    return m.group(1) if m else None


def console_line(rel: str, report: dict, hand: dict) -> str:
    """One line per submission: status, points, the exercise it was graded as, the file; every string in it is
    data (`as_data`: a newline or an escape sequence in a file name cannot forge or redraw a line)."""
    status = _status(report, hand)
    exercise = as_data(report.get("exercise") or "?")
    named = _exercise_in_name(rel)
    warn = (f"  (the file name says {named}, the notebook is {exercise})"
            if named and report.get("exercise") and not exercise.startswith(named + "_") and exercise != named else "")
    return f"{exercise:<22} {report['total']:g}/{report['possible']:g}  {as_data(status)}  {as_data(rel)}{warn}"


def row(rel: str, report: dict, hand: dict, feedback: str) -> dict:
    """A gradebook row; every string from the submission or its report is one line of data (`as_data`)."""
    pending = _pending(report, hand)
    hand_marks = sum(h["marks"] for h in hand.values())
    hand_possible = sum(m["points"] for m in report.get("manual", []))
    reasons = [report["error"]] if report.get("error") else []
    reasons += [f"{t['grade_id']}: {t['outcome']}: {t['message'].splitlines()[0] if t['message'] else ''}".rstrip(": ")
                for t in report.get("tests", []) if t["outcome"] != "passed"]
    r = {"file": as_data(rel), "id": sid(rel), "exercise": as_data(report.get("exercise", "")),
         "status": _status(report, hand),
         "exit_code": report["exit_code"], "total": f"{report['total']:g}", "possible": f"{report['possible']:g}",
         "hand_marks": f"{hand_marks:g}", "hand_possible": f"{hand_possible:g}", "hand_pending": f"{pending:g}",
         "overall": f"{report['total'] + hand_marks:g}", "overall_possible": f"{report['possible'] + hand_possible:g}",
         "hidden_seed": "" if report.get("seed") is None else report["seed"]}
    r["scores"] = {t["grade_id"]: f"{t['score']:g}" for t in report.get("tests", [])}
    r["scores"].update({m["grade_id"]: f"{hand[m['grade_id']]['marks']:g}" if m["grade_id"] in hand else ""
                        for m in report.get("manual", [])})
    r["flags"] = " | ".join(as_data(f) for f in report.get("flags", []))
    r["reasons"] = " | ".join(as_data(x) for x in reasons + report.get("notes", []))
    r["feedback"] = feedback
    return r


FIXED = ["file", "id", "exercise", "status", "exit_code", "total", "possible", "hand_marks", "hand_possible",
         "hand_pending", "overall", "overall_possible", "hidden_seed"]


def _entry_row(state: dict, rel: str, out: dict[str, Path]) -> dict:
    """Submission `rel`'s feedback file, written, and its gradebook row; a feedback that cannot be written is said
    in the row's reasons, never a stop of the others."""
    report = state["entries"][rel]["report"]
    hand = _hand(state, rel, report)
    fb = feedback_file(out, rel)
    try:
        _write_private(fb, feedback(rel, report, hand))
    except OutputError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        r = row(rel, report, hand, "")
        r["reasons"] = " | ".join(x for x in (r["reasons"], as_data(f"its feedback could not be written: {e}")) if x)
        return r
    return row(rel, report, hand, os.path.relpath(fb, out["csv"].parent))


def write_outputs(state: dict, out: dict[str, Path]) -> list[dict]:
    """The gradebook, one feedback file per submission and one sheet per hand-graded question, from the state."""
    for d in (out["feedback"], out["sheets"]):
        _private_dir(d)
    rows = [_entry_row(state, rel, out) for rel in sorted(state["entries"])]
    auto, manual = [], []
    for rel in sorted(state["entries"]):
        report = state["entries"][rel]["report"]
        auto += [t["grade_id"] for t in report.get("tests", []) if t["grade_id"] not in auto]
        manual += [m["grade_id"] for m in report.get("manual", []) if m["grade_id"] not in manual]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(FIXED + auto + manual + ["flags", "reasons", "feedback"])
    for r in rows:
        w.writerow([cell(str(r[c])) for c in FIXED] + [r["scores"].get(g, "") for g in auto + manual]
                   + [cell(r["flags"]), cell(r["reasons"]), cell(r["feedback"])])
    _write_private(out["csv"], buf.getvalue())
    write_sheets(state, out["sheets"])
    return rows


# --------------------------------------------------------------------------------------
# Feedback for the learner
# --------------------------------------------------------------------------------------
def _fenced(text: str) -> list[str]:
    """Text shown verbatim in Markdown: a fence longer than any run of backticks in it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", printable(text.rstrip("\n")), fence]


def feedback(rel: str, report: dict, hand: dict) -> str:
    """The learner's feedback file: per task the points, what failed and why, the notes and flags."""
    name = as_data(rel).replace("`", "'")
    lines = [f"# Feedback on `{name}`", ""]
    if report.get("error"):
        lines += ["This notebook could not be graded:", "", *_fenced(report["error"]), ""]
        return "\n".join(lines)
    pending = _pending(report, hand)
    hand_marks = sum(h["marks"] for h in hand.values())
    hand_possible = sum(m["points"] for m in report.get("manual", []))
    lines += [f"Exercise: **{as_data(report.get('exercise') or '?')}**"
              + (f" (tests version {report['version']})" if report.get("version") else ""), "",
              f"- Autograded: **{report['total']:g} / {report['possible']:g}** points"]
    if hand_possible and pending == hand_possible:
        lines.append(f"- Graded by hand: {hand_possible:g} points, not graded yet")
    elif hand_possible:
        lines.append(f"- Graded by hand: **{hand_marks:g} / {hand_possible:g}** points"
                     + (f" ({pending:g} not graded yet)" if pending else ""))
    lines += [f"- Status: {_status(report, hand)}", "",
              "| task | points | result |", "|---|---|---|"]
    for t in report.get("tests", []):
        result = t["outcome"] + ("; needs review, points withheld" if t.get("flags") else "")
        lines.append(f"| {t['grade_id']} | {t['score']:g} / {t['points']:g} | {result} |")
    for m in report.get("manual", []):
        got = hand.get(m["grade_id"])
        lines.append(f"| {m['grade_id']} (by hand) | {got['marks']:g} / {m['points']:g} | graded by hand |" if got
                     else f"| {m['grade_id']} (by hand) | ? / {m['points']:g} | awaits hand grading |")
    lines.append("")
    for t in report.get("tests", []):
        if t["outcome"] == "passed" and not t.get("flags"):
            continue
        lines += [f"## {t['grade_id']}: {t['outcome']} ({t['score']:g} / {t['points']:g})", ""]
        if t.get("message"):
            lines += [*_fenced(t["message"]), ""]
        if t.get("flags"):
            lines += ["Flagged for review (no points until your instructor decides):", "",
                      *_fenced("\n".join(t["flags"])), ""]
    for m in report.get("manual", []):
        got = hand.get(m["grade_id"])
        if got and got.get("comment"):
            lines += [f"## {m['grade_id']} (graded by hand): {got['marks']:g} / {m['points']:g}", "",
                      *_fenced(got["comment"]), ""]
    if report.get("notes"):
        lines += ["## Notes", "", *_fenced("\n".join(report["notes"])), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Hand grading: one sheet per question, merged back
# --------------------------------------------------------------------------------------
# "rubric": the task's rubric from its solution (points per element, a model answer), the same on every row; last,
# so that the columns the instructor fills in keep their places.
# "id": the submission's opaque id (`sid`), the key a row is merged by; "file" is only shown.
SHEET_COLUMNS = ["file", "exercise", "question", "points", "answer", "marks", "comment", "rubric", "id"]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may run as a formula


def cell(text: str, lines: bool = False) -> str:
    """A learner's text as a CSV cell a spreadsheet shows as text: data (`as_data`; `lines` keeps its newlines, as
    an answer's), and a leading formula character gets a quote."""
    text = as_data(text, lines)
    return "'" + text if text.startswith(FORMULA_START) else text


def uncell(text: str) -> str:
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_START) else text


def _sheet_name(exercise: str, gid: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{exercise}.{gid}")
    return (name if len(name) <= 120 else name[:80] + "." + sha256(name.encode())[:16]) + ".csv"


def _read_sheet(path: Path) -> list[dict]:
    text = _read_private(path)
    if text is None:
        raise MergeError(f"{path.name}: no such sheet")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in ("file", "question", "marks") if c not in (reader.fieldnames or [])]
    if missing:
        raise MergeError(f"{path.name}: no column {', '.join(missing)} (the columns are {', '.join(SHEET_COLUMNS)})")
    return list(reader)


def stubs(solutions_dir: Path) -> dict[tuple[str, str], str]:
    """(exercise, question) -> the hand-graded answer as the exercise hands it out (its stub), stripped."""
    out = {}
    for path in sorted(solutions_dir.glob("*.ipynb")):
        try:
            for i, cell in enumerate(read_notebook(path)["cells"]):
                meta = nbgrader(cell)
                if meta.get("solution") and meta.get("grade"):
                    src = cell.get("source", "")
                    out[(path.stem, meta.get("grade_id", f"cell-{i}"))] = strip_regions(
                        "".join(src) if isinstance(src, list) else src, cell["cell_type"], path.name).strip()
        except (GradeError, MarkerError):
            continue
    return out


NO_RUBRIC = ('(no rubric in the solution: add a markdown cell after the answer with the metadata '
             '"specref": {"rubric": "<question>"})')


def rubrics(solutions_dir: Path) -> dict[tuple[str, str], str]:
    """(exercise, question) -> the question's rubric: the solution's markdown cell marked
    ``"specref": {"rubric": "<question>"}`` (a solution that cannot be read gives none)."""
    out = {}
    for path in sorted(solutions_dir.glob("*.ipynb")):
        try:
            found = check_rubrics(read_notebook(path), path.name)
        except (GradeError, MarkerError):
            continue
        out.update({(path.stem, gid): text.strip() for gid, text in found.items()})
    return out


def write_sheets(state: dict, folder: Path) -> None:
    """A sheet per (exercise, question): every learner's answer and the question's rubric; marks already in a sheet
    for the same answer stay."""
    stub = stubs(Path(state["solutions_dir"])) if state.get("solutions_dir") else {}
    rubric = rubrics(Path(state["solutions_dir"])) if state.get("solutions_dir") else {}
    sheets: dict[str, list[dict]] = {}
    for rel in sorted(state["entries"]):
        report = state["entries"][rel]["report"]
        if report.get("error"):
            continue
        hand = _hand(state, rel, report)
        for m in report.get("manual", []):
            got = hand.get(m["grade_id"])
            unanswered = m["answer"].strip() in ("", stub.get((report["exercise"], m["grade_id"])))
            marks = f"{got['marks']:g}" if got else ("0" if unanswered else "")
            comment = got.get("comment", "") if got else ("unanswered: the exercise's stub" if unanswered else "")
            sheets.setdefault(_sheet_name(report["exercise"], m["grade_id"]), []).append(
                {"file": cell(rel), "exercise": cell(report["exercise"]), "question": m["grade_id"],
                 "points": f"{m['points']:g}", "answer": cell(m["answer"], lines=True), "marks": marks,
                 "comment": cell(comment, lines=True),
                 "rubric": cell(rubric.get((report["exercise"], m["grade_id"]), NO_RUBRIC), lines=True),
                 "id": sid(rel)})
    _private_dir(folder)
    for old_sheet in folder.glob("*.csv"):  # a question nobody in the run answers any more
        if old_sheet.name not in sheets:
            old_sheet.unlink()
    for name, rows in sheets.items():
        path = folder / name
        try:  # marks typed into the sheet but not merged yet: kept while the answer is the same
            old = {(r.get("id") or r.get("file"), r.get("question")): r for r in _read_sheet(path)}
        except (MergeError, OSError, csv.Error, UnicodeDecodeError):
            old = {}
        if old:
            for r in rows:
                o = old.get((r["id"], r["question"]), old.get((r["file"], r["question"])))
                if o is not None and o.get("answer") == r["answer"] and (o.get("marks") or "").strip():
                    r["marks"], r["comment"] = o["marks"], o.get("comment") or ""
        buf = io.StringIO()
        w = csv.DictWriter(buf, SHEET_COLUMNS)
        w.writeheader()
        w.writerows(rows)
        try:
            _write_private(path, buf.getvalue())
        except OutputError:
            raise
        except (OSError, ValueError) as e:  # one sheet that cannot be written stops no other output
            print(f"warning: the hand-grading sheet {path.name} could not be written: {as_data(e)}", file=sys.stderr)


def _row_submission(r: dict, by_id: dict[str, str], state: dict) -> str | None:
    """The submission a sheet row is about: by its opaque id (`sid`); a row without one (typed in by hand) by its
    file as shown."""
    ident = (r.get("id") or "").strip()
    if ident:
        return by_id.get(ident)
    shown = r.get("file") or ""
    return next((rel for rel in (shown, uncell(shown)) if rel in state["entries"]), None)


def merge(folder: Path, csv_path: Path | None = None) -> dict:
    """Read every sheet's marks into the run's state and rewrite the gradebook and feedback; MergeError if any is bad."""
    out = outputs(Path(csv_path) if csv_path else default_csv(Path(folder)))
    check_outputs(Path(folder), out)
    state = load_state(out["state"])
    if state is None:
        raise MergeError(f"no graded run at {out['state']}: run grade first")
    by_id = {sid(rel): rel for rel in state["entries"]}
    if not out["sheets"].is_dir():
        raise MergeError(f"no hand-grading sheets in {out['sheets']}")
    errors: list[str] = []
    marks = {rel: dict(qs) for rel, qs in state.get("hand", {}).items()}  # a question without a sheet keeps its marks
    seen: set[tuple[str, str]] = set()
    sheets = sorted(out["sheets"].glob("*.csv"))
    for sheet in sheets:
        try:
            rows = _read_sheet(sheet)
        except (MergeError, OSError, csv.Error, UnicodeDecodeError) as e:
            errors.append(str(e) if isinstance(e, MergeError) else f"{sheet.name}: cannot be read: {e}")
            continue
        for line, r in enumerate(rows, 2):
            where = f"{sheet.name}, line {line}"
            rel, gid, text = _row_submission(r, by_id, state), r.get("question") or "", (r.get("marks") or "").strip()
            entry = state["entries"].get(rel) if rel is not None else None
            if entry is None:
                errors.append(f"{where}: unknown submission {as_data(r.get('file') or '')!r}"
                              + (f" (id {as_data(r['id'])!r})" if r.get("id") else "") + " (not in this run's gradebook)")
                continue
            manual = {m["grade_id"]: m for m in entry["report"].get("manual", [])}
            if gid not in manual:
                errors.append(f"{where}: {rel!r} has no hand-graded question {gid!r}"
                              + (f" (its questions: {', '.join(manual)})" if manual else ""))
                continue
            if (rel, gid) in seen:
                errors.append(f"{where}: a second row for {rel!r}, question {gid!r}")
                continue
            seen.add((rel, gid))
            if not text:  # no mark (or one taken back)
                marks.get(rel, {}).pop(gid, None)
                continue
            points = manual[gid]["points"]
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and 0 <= value <= points):
                errors.append(f"{where}: marks for {rel!r}, question {gid!r} must be a number from 0 to {points:g}, "
                              f"got {text!r}")
                continue
            marks.setdefault(rel, {})[gid] = {"marks": value, "comment": (r.get("comment") or "").strip(),
                                              "answer": sha256(manual[gid]["answer"].encode("utf-8", "surrogatepass"))}
    if errors:
        raise MergeError("\n".join(errors))
    state["hand"] = marks
    _write_private(out["state"], json.dumps(state, indent=1))
    rows = write_outputs(state, out)
    return {"sheets": len(sheets), "marks": len(seen & {(f, g) for f, qs in marks.items() for g in qs}),
            "pending": sum(float(r["hand_pending"]) for r in rows), "rows": rows, "outputs": out}


# --------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -I -m specref_grading.classrun",
                                 description="Grade a folder of submissions (a class), or merge hand marks.")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade every new or changed submission under DIR")
    g.add_argument("dir", type=Path)
    g.add_argument("--csv", type=Path, help="the gradebook (default DIR-grading/gradebook.csv, a folder the grader "
                   "makes beside DIR); the other outputs go beside it")
    g.add_argument("--jobs", type=int, default=None,
                   help="worker processes (default: one per core, fewer where the available memory holds fewer "
                        "submissions at their peak)")
    g.add_argument("--seed", default=None, metavar="N|random",
                   help="one hidden seed for every submission (default: a fresh random one for each submission "
                        "graded, each time it is graded)")
    g.add_argument("--fresh", action="store_true", help="start a new run: every submission regraded, with new seeds")
    g.add_argument("--retry", action="store_true", help="also regrade unchanged submissions that timed out or died")
    g.add_argument("--solutions-dir", type=Path, default=ROOT / "solutions")
    g.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S)
    g.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds for one submission, all tests")
    g.add_argument("--memory", type=int, default=MEMORY_MB, metavar="MB")
    g.add_argument("--unjailed", action="store_true",
                   help="grade even where this host cannot jail the learner's code (no namespaces): the answers then "
                        "run as a plain process of a fresh uid, never as root; without it such a run is refused")
    m = sub.add_parser("merge", help="merge the hand-grading sheets' marks into the gradebook")
    m.add_argument("dir", type=Path)
    m.add_argument("--csv", type=Path, help="the gradebook (default DIR-grading/gradebook.csv)")
    args = ap.parse_args(argv)
    if args.command == "merge":
        try:
            done = merge(args.dir, args.csv)
        except (MergeError, GradeError) as e:
            print(f"nothing merged:\n{printable(str(e))}", file=sys.stderr)
            return EXIT_UNGRADABLE
        print(f"merged {done['marks']} hand marks from {done['sheets']} sheets; {done['pending']:g} points still await "
              f"hand grading; gradebook: {done['outputs']['csv']}")
        return 0
    try:
        s = run(args.dir, args.csv, jobs=args.jobs, seed=args.seed, fresh=args.fresh, retry=args.retry,
                solutions_dir=args.solutions_dir, cell_timeout=args.cell_timeout, run_timeout=args.timeout,
                memory_mb=args.memory, progress=True, unjailed=args.unjailed)
    except GradeError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return EXIT_UNGRADABLE
    out = s["outputs"]
    pending = sum(float(r["hand_pending"]) for r in s["rows"])
    rate = (f"{s['per_minute']:.1f} submissions per minute, {s['mean_s']:.1f} s each in a worker"
            if s["per_minute"] else "nothing to grade")
    print(f"graded {s['graded']} of {s['files']} submissions in {s['wall_s']:.1f} s with {s['jobs']} workers ({rate}); "
          f"{s['reused']} unchanged, not regraded; "
          + (f"hidden seed {s['seed']}" if s["seed"] is not None else "a fresh hidden seed for each graded submission "
             "(the gradebook's hidden_seed column)"))
    print(f"gradebook: {out['csv']}; feedback: {out['feedback']}/; hand grading: {out['sheets']}/ "
          f"({pending:g} points await hand grading; then: python -I -m specref_grading.classrun merge {args.dir}"
          + (f" --csv {args.csv}" if args.csv else "") + ")")
    return s["exit_code"]


if __name__ == "__main__":
    raise SystemExit(main())
