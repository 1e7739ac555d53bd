"""Grade exercise notebooks: the solution decides what runs, the learner supplies only the answers.

    python tools/grading/grade.py submissions/alice/ex02.ipynb                  # make grade NB=...
    python tools/grading/grade.py alice.ipynb --solution solutions/ex02_accept_reject.ipynb
    python tools/grading/grade.py --all submissions/ --csv gradebook.csv        # make grade-all DIR=...

How one submission is graded:

1. The notebook is read as JSON. Its exercise id (``metadata.specref.exercise``, stamped by
   tools/upkeep/make_exercises.py) names the solution in solutions/, whatever the file is called;
   ``--solution`` overrides it. An older exercise version is graded with today's tests.
2. What runs is built from the SOLUTION: its setup cells, its test cells (hidden tests
   included) and its order. From the submission only the source of each answer cell is
   taken, found by grade_id (or cell id). Everything else in the submission (its other
   cells, test cells, metadata, points, outputs) is ignored and listed in the report.
3. Every answer cell is read before it runs (tools/grading/grade_scan.py): use of specref (the reference
   implementation) beyond the exercise's own helpers, and code that reaches for the machinery
   around it, is flagged ("needs review", the task scores 0).
4. The cells run on two sides of a wall (run_cells_wall; the default, see WALL):
   - a jailed kernel (tools/grading/grade_jail.py) runs the solution's setup cells, the learner's answer
     cells and the exercise's other cells, never a test cell. As root it runs in its own mount,
     network, pid, IPC and UTS namespaces, chrooted into a tmpfs that holds read-only binds of
     /usr, /etc, the interpreter, the virtual environment and the specref package only, with its
     private temporary folder as /tmp, as a fresh unprivileged uid with no capabilities (bounding
     set emptied, no_new_privs) and resource limits. It can read no file of root's, of the
     repository (solutions/, tools/) or of another submission, and reach no network. Without
     root (or namespaces) it runs as a plain child process, and only the wall below holds.
   - a trusted process (tools/grading/grade_trusted.py) runs the setup cells too, then each test cell,
     hidden tests and ``HIDDEN_SEED`` included. The names a test reads from the answers are proxies:
     calling one sends plain data (numbers, strings, containers, tensors and arrays as bytes) to
     the kernel, which calls the learner's function and sends plain data back
     (tools/grading/grade_rpc.py, JSON and raw bytes, no pickle), under a per-call time limit. What the
     checks hand to the learner's code (models, caches, samplers, random generators) is served
     from the trusted process the same way; private attributes are never served. The trusted
     process decides each test's outcome from whether its cell raised and reports it on a pipe the
     kernel cannot reach: nothing the answers do in their kernel can change a grade.
   All tests share one pair of processes; when a call into the kernel hangs past its limit or the
   kernel dies, that test fails and a fresh pair runs the tests that remain. Every process of the
   kernel's uid is killed at the end. ``wall=False`` (SPECREF_GRADE_WALL=0) runs the old single
   kernel (tools/grading/grade_runner.py), where tests and answers share a process; it is kept only as a
   fallback and is not a security boundary.

Hidden tests draw their cases from ``HIDDEN_SEED``. The solutions set it to 1, and so does the
grader unless told otherwise: ``--seed N`` (N >= 1; 0 draws the visible cases) or ``--seed random``
(``grade(seed=None)``) grades with other hidden cases, which a learner who has read the solutions has
never seen. The grader binds the seed at the top of every test cell that reads it; test cells run only
in the trusted process, so the learner's kernel never sees the hidden tests or the seed. The report
names the seed, so a grade can be reproduced.

Exit status: 0 full marks; 1 some check failed; 2 could not be graded (unreadable
notebook, no matching solution, the kernel died, a report is missing); 3 needs review
(interference or use of the reference implementation was detected; flagged tasks score 0).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import pwd
import random
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "upkeep"))  # make_exercises

import grade_jail  # noqa: E402
from grade_scan import (UNREADABLE, binds_unknown, helper_names, imported_specref_names, names_bound,  # noqa: E402
                        names_used, scan)
from make_exercises import MarkerError, strip_regions, tests_version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "grade_runner.py"  # the old single-process kernel (--no-wall)
TRUSTED = Path(__file__).resolve().parent / "grade_trusted.py"
WALL = os.environ.get("SPECREF_GRADE_WALL", "1") != "0"  # tests in a trusted process, answers in a jailed kernel
CALL_TIMEOUT_S = 60  # one call of the checks into the submission's code (the cell's own limit still applies)
WALL_TEST_FACTOR = 3  # a test cell across the wall may take this many cell limits (thousands of calls: ex04)
DEFAULT_HIDDEN_SEED = 1  # what the solutions' setup cells set HIDDEN_SEED to (a test keeps them equal)
CELL_TIMEOUT_S = 180
RUN_TIMEOUT_S = 1800  # one submission, all of its tests together
MEMORY_MB = 8192  # one kernel's private memory (RLIMIT_DATA); the largest exercise (ex04) peaks near 450 MB
MAX_EVENT_BYTES = 1 << 20  # a signed event is a short JSON line; a longer "line" is a flood, never an event
EXIT_FULL, EXIT_FAILED, EXIT_UNGRADABLE, EXIT_REVIEW = 0, 1, 2, 3
STATUS = {EXIT_FULL: "full marks", EXIT_FAILED: "some checks failed", EXIT_UNGRADABLE: "could not be graded",
          EXIT_REVIEW: "NEEDS REVIEW"}
MARKER_ENV = "SPECREF_GRADING_RUN"


def status_text(exit_code: int, pending: float = 0.0) -> str:
    """The status in words; points that await hand grading are named, and "full marks" is never said while any do."""
    if not pending or exit_code == EXIT_UNGRADABLE:
        return STATUS[exit_code]
    awaits = f"{pending:g} point{'s' if pending != 1 else ''} await{'s' if pending == 1 else ''} hand grading"
    return f"autograded checks passed, {awaits}" if exit_code == EXIT_FULL else f"{STATUS[exit_code]}; {awaits}"


class GradeError(Exception):
    """The notebook cannot be graded (exit 2); the message says why."""


# --------------------------------------------------------------------------------------
# Notebooks as JSON: reading, ids and versions
# --------------------------------------------------------------------------------------
def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def read_notebook(path: Path) -> dict:
    """The notebook as a dict, checked enough to be walked safely; GradeError says what is wrong."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise GradeError(f"cannot read {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise GradeError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                         "was it saved by Jupyter?") from e
    except RecursionError as e:
        raise GradeError(f"{path} is nested too deeply to be a notebook") from e
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise GradeError(f"{path} is not a notebook (no list of cells)")
    if not isinstance(nb.get("metadata", {}), dict):
        raise GradeError(f"{path}: the notebook's metadata is not an object")
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise GradeError(f"{path}: cell {i} is broken (not an object with a cell_type)")
        src = cell.get("source", "")
        if not (isinstance(src, str) or (isinstance(src, list) and all(isinstance(s, str) for s in src))):
            raise GradeError(f"{path}: cell {i} has a broken source (not text)")
        if not isinstance(cell.get("metadata", {}), dict):
            raise GradeError(f"{path}: cell {i} has broken metadata (not an object)")
    return nb


def nbgrader(cell: dict) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def is_answer(cell: dict) -> bool:
    return bool(nbgrader(cell).get("solution"))


def is_test(cell: dict) -> bool:
    m = nbgrader(cell)
    return bool(m.get("grade")) and not m.get("solution") and cell.get("cell_type") == "code"


def exercise_id(solution_path: Path) -> str:
    return Path(solution_path).stem


def stamp(submission: dict) -> tuple[str | None, str | None]:
    meta = submission.get("metadata", {}).get("specref")
    if not isinstance(meta, dict):
        return None, None
    eid, ver = meta.get("exercise"), meta.get("version")
    return (eid if isinstance(eid, str) else None), (ver if isinstance(ver, str) else None)


def find_solution(submission: dict, solutions_dir: Path) -> Path:
    eid, _ = stamp(submission)
    if eid is None:
        raise GradeError("the notebook has no exercise id (metadata.specref.exercise, stamped by "
                         "tools/upkeep/make_exercises.py); name its solution with --solution")
    for path in sorted(Path(solutions_dir).glob("*.ipynb")):
        if exercise_id(path) == eid:
            return path
    raise GradeError(f"no solution in {solutions_dir} for exercise id {eid!r}; name one with --solution")


# --------------------------------------------------------------------------------------
# The plan: what runs, from the solution; the learner's answers by grade_id
# --------------------------------------------------------------------------------------
@dataclass
class TestSpec:
    n: int  # the test cell's index in the solution
    grade_id: str
    points: float
    source: str
    saved_passing: bool | None = None  # what the submission's saved output of this cell showed
    depends: set[int] = field(default_factory=set)  # solution indices of the answer cells it uses


@dataclass
class Plan:
    exercise: str
    version: str
    cells: list[dict]  # {"n", "role", "grade_id", "source"} in the solution's order; tests included
    tests: list[TestSpec]
    manual: list[tuple[str, float, str]]  # (grade_id, points, the learner's text)
    notes: list[str]
    flags: dict[int, list[str]]  # answer cell index -> findings (interference applies to all later tests)
    reference: dict[int, list[str]]  # answer cell index -> uses of specref (applies to dependent tests)
    syntax: dict[int, str]
    seed: int = DEFAULT_HIDDEN_SEED  # HIDDEN_SEED in the test cells


def _find_answer(sub_cells: list[dict], ref: dict, gid: str, notes: list[str]) -> dict | None:
    by_gid = [c for c in sub_cells if nbgrader(c).get("grade_id") == gid]
    if not by_gid and isinstance(ref.get("id"), str):
        by_gid = [c for c in sub_cells if c.get("id") == ref["id"]]
    if not by_gid:
        return None
    best = next((c for c in by_gid if c.get("cell_type") == ref.get("cell_type") and c.get("id") == ref.get("id")),
                next((c for c in by_gid if c.get("cell_type") == ref.get("cell_type")), by_gid[0]))
    if len(by_gid) > 1:
        notes.append(f"{len(by_gid)} cells claim grade_id {gid!r}: the one with cell id {best.get('id')!r} was "
                     "graded, the others were ignored")
    if best.get("cell_type") != ref.get("cell_type"):
        notes.append(f"answer {gid!r} was turned into a {best.get('cell_type')} cell; it was graded as "
                     f"{ref.get('cell_type')}")
    return best


def _saved_output_passing(cell: dict) -> bool | None:
    outs = cell.get("outputs")
    if not isinstance(outs, list) or not outs:
        return None if cell.get("execution_count") is None else True
    return not any(isinstance(o, dict) and o.get("output_type") == "error" for o in outs)


def hidden_seed(value: str | int) -> int:
    """The seed of the hidden tests from --seed: an int in [1, 2**63), or "random" for a fresh one of 63 bits
    (printed in the report): too many to try offline, so what learner code sees cannot be matched to a seed."""
    if isinstance(value, str) and value.strip().lower() == "random":
        return 1 + secrets.randbelow(2**63 - 1)
    try:
        seed = int(value)
    except (TypeError, ValueError):
        raise GradeError(f"--seed must be an integer >= 1 or 'random', got {value!r}") from None
    if isinstance(value, bool) or not 1 <= seed < 2**63:
        raise GradeError(f"--seed must be in [1, 2**63) (0 draws the visible cases), got {value!r}")
    return seed


def with_seed(source: str, seed: int) -> str:
    """A test cell's source as the grader runs it: HIDDEN_SEED bound on the line before, if the cell reads it."""
    return f"HIDDEN_SEED = {seed}\n{source}" if "HIDDEN_SEED" in names_used(source) else source


def build_plan(solution: dict, submission: dict, solution_name: str = "solution",
               seed: int = DEFAULT_HIDDEN_SEED, wall: bool | None = None) -> Plan:
    sol_cells, sub_cells = solution["cells"], submission["cells"]
    notes: list[str] = []
    eid, ver = stamp(submission)
    version = tests_version(solution)
    if ver is not None and ver != version:
        notes.append(f"this notebook was made for an older version of the exercise ({ver}); it was graded with "
                     f"today's tests ({version})")
    first_answer = next((i for i, c in enumerate(sol_cells) if is_answer(c)), len(sol_cells))
    setup_sources = [_source(c) for i, c in enumerate(sol_cells) if i < first_answer and c.get("cell_type") == "code"]
    # The exercise's own code (setup and the given cells, not answers or tests): what it takes from specref, and
    # what it uses before each answer, which that answer may use too (ex07's server_rows(), ex08's SAMPLERS). Given
    # cells after an answer are not counted: they compare the learner's result with the reference (ex06, ex03).
    given = [(i, _source(c)) for i, c in enumerate(sol_cells)
             if c.get("cell_type") == "code" and not is_answer(c) and not is_test(c)]
    specref_names = imported_specref_names([src for _, src in given])
    helpers = helper_names(setup_sources) & specref_names  # TorchRNG, exact_distribution, distribution_test, ...
    wall = WALL if wall is None else wall
    cells: list[dict] = []
    tests: list[TestSpec] = []
    manual: list[tuple[str, float, str]] = []
    flags: dict[int, list[str]] = {}
    reference: dict[int, list[str]] = {}
    syntax: dict[int, str] = {}
    used_ids: set[int] = set()
    bound: dict[int, set[str]] = {}
    unknown: set[int] = set()  # answers that may bind any name (exec, globals(), ...): see binds_unknown
    uses: dict[int, set[str]] = {}
    for i, ref in enumerate(sol_cells):
        meta = nbgrader(ref)
        gid = meta.get("grade_id", f"cell-{i}")
        if is_answer(ref):
            got = _find_answer(sub_cells, ref, gid, notes)
            if got is not None:
                used_ids.add(id(got))
            try:
                stub = strip_regions(_source(ref), ref.get("cell_type", "code"), f"{solution_name}: cell {i}")
            except MarkerError as e:
                raise GradeError(f"the solution is broken: {e}") from e
            text = _source(got) if got is not None else stub
            if got is None:
                notes.append(f"answer cell {gid!r} is missing from the notebook: it was graded as unanswered")
            if ref.get("cell_type") != "code" or meta.get("grade"):
                # A graded answer cell (markdown, or code carrying its own points) is the learner's
                # text through and through: nothing in it can be trusted to grade itself.
                if meta.get("grade"):
                    manual.append((gid, float(meta.get("points", 0) or 0), text))
                if ref.get("cell_type") != "code":
                    continue
            try:
                shown = set().union(*(names_used(src) for j, src in given if j < i)) & specref_names
                findings = scan(text, specref_names, (names_used(_source(ref)) & specref_names) | helpers | shown, wall)
            except SyntaxError as e:
                syntax[i] = f"syntax error in answer cell {gid!r}, line {e.lineno}: {e.msg}"
                findings = []
            except UNREADABLE as e:  # null bytes, or nested too deeply for the parser (RecursionError, MemoryError)
                syntax[i] = f"answer cell {gid!r} cannot be read as Python: {str(e) or 'it is nested too deeply'}"
                findings = []
            for f in findings:
                (reference if f.kind == "reference" else flags).setdefault(i, []).append(
                    f"answer cell {gid!r}, line {f.line}: {f.text}")
            bound[i], uses[i] = names_bound(text), names_used(text)
            if binds_unknown(text):
                unknown.add(i)
            cells.append({"n": i, "role": "answer", "grade_id": gid, "source": text})
        elif is_test(ref):
            spec = TestSpec(i, gid, float(meta.get("points", 0) or 0), _source(ref))
            mine = [c for c in sub_cells if nbgrader(c).get("grade_id") == gid]
            if len(mine) > 1:
                notes.append(f"{len(mine)} cells claim test grade_id {gid!r}: the exercise's test ran once, the "
                             "copies were ignored")
            if mine:
                used_ids.update(id(c) for c in mine)
                spec.saved_passing = _saved_output_passing(mine[0])
                if _source(mine[0]).strip() and _source(mine[0]).strip() not in _source(ref):
                    notes.append(f"your copy of test cell {gid!r} differs from the exercise's; the exercise's "
                                 "tests were run")
            tests.append(spec)
            cells.append({"n": i, "role": "test", "grade_id": gid, "source": with_seed(spec.source, seed)})
        elif ref.get("cell_type") == "code":
            try:
                text = strip_regions(_source(ref), "code", f"{solution_name}: cell {i}")
            except MarkerError as e:
                raise GradeError(f"the solution is broken: {e}") from e
            cells.append({"n": i, "role": "setup" if i < first_answer else "other", "grade_id": None, "source": text})
    # What the submission has that the exercise does not.
    sol_gids = {nbgrader(c).get("grade_id") for c in sol_cells if nbgrader(c)}
    for j, c in enumerate(sub_cells):
        m = nbgrader(c)
        if id(c) in used_ids:
            ref = next((r for r in sol_cells if nbgrader(r).get("grade_id") == m.get("grade_id")), None)
            if ref is not None and any(m.get(k) != nbgrader(ref).get(k) for k in ("grade", "points", "solution")):
                notes.append(f"cell {j} ({m.get('grade_id')!r}): edited grading metadata was ignored")
            continue
        if m.get("grade") and m.get("grade_id") not in sol_gids:
            notes.append(f"cell {j}: graded cell {m.get('grade_id')!r} is not part of the exercise; ignored")
        elif c.get("cell_type") == "code" and _source(c).strip() and not m:
            if not any(_source(c).strip() == _source(r).strip() for r in sol_cells):
                notes.append(f"cell {j}: code outside the answer cells is not run by the grader "
                             "(put what your answers need into the answer cells)")
    if any(c.get("cell_type") == "code" and c.get("outputs") for c in sub_cells):
        notes.append("the outputs saved in the notebook were ignored: every cell was run again from scratch")
    # Which answers each test uses: names, followed through the answers that define them.
    for t in tests:
        want, seen = set(names_used(t.source)), set()
        while True:
            new = {i for i in bound if (bound[i] & want or i in unknown) and i < t.n} - seen
            if not new:
                break
            seen |= new
            for i in new:
                want |= uses[i]
        t.depends = seen
    if not tests and not manual:
        raise GradeError(f"{solution_name} has no graded cells (metadata.nbgrader.grade)")
    return Plan(eid or exercise_id(Path(solution_name)), version, cells, tests, manual, notes, flags, reference, syntax,
                seed)


# --------------------------------------------------------------------------------------
# Running one test in a sandbox
# --------------------------------------------------------------------------------------
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


_READ_CAP: dict[int, bool] = {}


def _as_root() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def _free_uid() -> int:
    while True:
        uid = random.randrange(200_000, 2_000_000_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def _drop_cmd(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--pdeathsig", "KILL"]


def _needs_read_cap() -> bool:
    """Whether an unprivileged uid needs CAP_DAC_READ_SEARCH to run this interpreter as it is.

    A venv whose python lives in a private home (e.g. /root/.pyenv) cannot be read by other
    users; Python then starts with a different standard library, or not at all. The
    capability lets the kernel read files, never write them.
    """
    if 0 not in _READ_CAP:
        probe = "import sys; print(sys.version, sys.prefix, sys.base_prefix)"
        want = f"{sys.version} {sys.prefix} {sys.base_prefix}"
        try:
            got = subprocess.run(_drop_cmd(_free_uid()) + [sys.executable, "-I", "-c", probe], capture_output=True,
                                 text=True, timeout=60, cwd="/").stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            got = ""
        _READ_CAP[0] = got != want
    return _READ_CAP[0]


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


def _limits(memory_mb: int) -> None:  # runs in the child before exec
    """The kernel's limits: no core files, files of at most 256 MB, `memory_mb` of private memory (a memory bomb
    meets MemoryError instead of taking the host's memory), and as root at most 1024 processes."""
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 256 << 20), (resource.RLIMIT_DATA, memory_mb << 20)]
    if _as_root():  # counted per uid: only the run's own fresh uid may be capped (fork bombs)
        limits.append((resource.RLIMIT_NPROC, 1024))
    for lim, value in limits:
        try:
            resource.setrlimit(lim, (value, value))
        except (ValueError, OSError):
            pass
    os.umask(0o077)


def die_with_parent(parent: int) -> None:  # runs in a child before exec, or first thing in a worker
    """Ask the kernel to SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG).

    A grader stopped by SIGTERM or SIGKILL then takes its kernels, jails and trusted processes with it
    (unshare's --kill-child passes the signal on into the jail's namespace) instead of leaving them to run.
    """
    if not grade_jail.arm_parent_death():
        return  # not Linux: the process-group kill in _kill_all still applies
    if os.getppid() != parent:  # the parent died before the request took (`parent` as the parent read it)
        os._exit(1)


def _child_setup(memory_mb: int | None, parent: int) -> None:  # runs in the child before exec
    die_with_parent(parent)
    if memory_mb is not None:
        _limits(memory_mb)


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


def run_cells(cells: list[dict], cell_timeout: float, deadline: float, memory_mb: int = MEMORY_MB) -> KernelRun:
    """Run the cells (setup, answers, others, tests; in order) in a fresh sandboxed kernel."""
    secret = secrets.token_bytes(32)
    marker = secrets.token_hex(8)
    me = os.getpid()  # the children's parent, for die_with_parent
    base = Path(tempfile.mkdtemp(prefix="specref-grade-"))
    uid = _free_uid() if _as_root() else None
    work = base / "work"
    work.mkdir()
    r, w = os.pipe()
    log = open(base / "output.log", "wb")
    try:
        os.chmod(base, 0o711)
        if uid is not None:
            os.chown(work, uid, uid)
        os.chmod(work, 0o700)
        cmd = [sys.executable, "-I", "-c", RUNNER.read_text(encoding="utf-8")]
        if uid is not None:
            caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"] if _needs_read_cap() else []
            cmd = _drop_cmd(uid) + caps + ["--"] + cmd
        plan = json.dumps({"secret": secret.hex(), "fd": w, "cells": cells}).encode()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=work,
                                    env=_environment(str(work), marker), pass_fds=(w,), start_new_session=True,
                                    preexec_fn=lambda: _child_setup(memory_mb, me))
        except OSError as e:
            return KernelRun(setup_error=f"could not start the grading kernel ({cmd[0]}): {e}")
        os.close(w)
        w = -1
        try:
            return _collect(proc, plan, r, secret, cells, cell_timeout, deadline, base / "output.log")
        finally:
            _kill_all(proc, uid, marker)
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


_JAIL: dict[int, bool] = {}


UNJAILED_NOTE = ("the answers ran in a kernel of their own but not in a jail (the grader was not run as root, or "
                 "this host has no namespaces): the tests still ran apart from them, but that kernel could read "
                 "whatever the grading user can read")


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


def jail_problem(read_only: list[str]) -> str:
    """Why the jail cannot run this interpreter, or "": a path it must mount read-only (the Python environment,
    specref) lies under /tmp, which the jail covers with the kernel's own empty /tmp (a venv made in /tmp)."""
    for path in read_only:
        if any(p == "/tmp" or p.startswith("/tmp/") for p in (os.path.normpath(path), os.path.realpath(path))):
            return (f"the grading kernel cannot be jailed: {path} (the Python environment or specref) lies under /tmp, "
                    "which the jail replaces with the kernel's own empty /tmp; install them outside /tmp "
                    "(e.g. make venv in the repository) and grade with that interpreter")
    return ""


def run_cells_wall(cells: list[dict], cell_timeout: float, deadline: float, memory_mb: int = MEMORY_MB,
                   call_timeout: float = CALL_TIMEOUT_S) -> KernelRun:
    """Run the cells across the wall: tests in a trusted process, everything else in a jailed kernel.

    The kernel (tools/grading/grade_jail.py) gets the setup, answer and other cells, never a test cell; the
    trusted process (tools/grading/grade_trusted.py) gets the plan, runs the setup and the tests, calls into
    the kernel through two pipes and reports each test's outcome on a third pipe the kernel cannot reach.
    """
    jailed = can_jail()
    problem = jailed and jail_problem(grade_jail.read_only_paths())
    if problem:  # every kernel would die at start, unexplained
        return KernelRun(setup_error=problem)
    marker = secrets.token_hex(8)
    me = os.getpid()  # the children's parent, for die_with_parent
    base = Path(tempfile.mkdtemp(prefix="specref-grade-"))
    uid = _free_uid() if jailed else None
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
        env = _environment("/tmp" if jailed else str(work), marker)
        env["MPLCONFIGDIR"] = env["HOME"]
        source = grade_jail.kernel_source()
        if jailed:
            config = {"root": str(base / "root"), "uid": uid, "memory_mb": memory_mb,
                      "read_only": grade_jail.read_only_paths(), "rfd": t2j_r, "wfd": j2t_w,
                      "python": sys.executable, "source": source, "env": env, "cgroup": f"run-{marker}"}
            cmd = grade_jail.command(config)
            pre = lambda: _child_setup(None, me)  # noqa: E731  # the jail sets its own limits
        else:
            cmd = [sys.executable, "-I", "-c", source, str(t2j_r), str(j2t_w)]
            pre = lambda: _child_setup(memory_mb, me)  # noqa: E731
        try:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=work, env=env, pass_fds=(t2j_r, j2t_w), start_new_session=True,
                                          preexec_fn=pre))
            tenv = {k: v for k, v in _environment(str(base), marker).items() if k != MARKER_ENV}
            tenv["MPLCONFIGDIR"] = str(base)
            procs.append(subprocess.Popen([sys.executable, "-I", str(TRUSTED)], stdin=subprocess.PIPE, stdout=tlog,
                                          stderr=subprocess.STDOUT, cwd=base, env=tenv,
                                          pass_fds=(t2j_w, j2t_r, ev_w), start_new_session=True,
                                          preexec_fn=lambda: _child_setup(memory_mb, me)))
        except OSError as e:
            return KernelRun(setup_error=f"could not start the grading kernel: {e}")
        for fd in (t2j_r, t2j_w, j2t_r, j2t_w, ev_w):
            os.close(fd)
        fds = [ev_r]
        plan = json.dumps({"cells": cells, "rfd": j2t_r, "wfd": t2j_w, "events": ev_w,
                           "call_timeout": min(call_timeout, cell_timeout)}).encode()
        try:
            return _collect(procs[1], plan, ev_r, None, cells, cell_timeout, deadline, base / "output.log", procs[0])
        finally:
            for proc in procs:
                _kill_all(proc, uid if proc is procs[0] else None, marker)
            if jailed:
                grade_jail.remove_cgroups(f"run-{marker}")
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        log.close()
        tlog.close()
        shutil.rmtree(base, ignore_errors=True)


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


def _collect(proc, plan: bytes, r: int, secret: bytes | None, cells: list[dict], cell_timeout: float, deadline: float,
             log: Path, kernel: subprocess.Popen | None = None) -> KernelRun:
    import threading
    threading.Thread(target=_feed, args=(proc, plan), daemon=True).start()
    roles = {c["n"]: c for c in cells}
    run = KernelRun()
    buf, skipping, current, started = b"", False, None, time.monotonic()
    errors: list[str] = []
    forged = 0
    done = False
    while not done:
        now = time.monotonic()
        # Across the wall a test cell's calls into the kernel are limited one by one (CALL_TIMEOUT_S); the cell
        # as a whole gets WALL_TEST_FACTOR times the cell limit, for the round trips of checks that call a lot.
        span = cell_timeout * (WALL_TEST_FACTOR if secret is None and roles.get(current, {}).get("role") == "test"
                               else 1)
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
        forged += overlong
        for line in lines:
            event = _verify(line, secret) if secret is not None else _unsigned(line)
            if event is None:
                forged += 1
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
                extra = ([f"{forged} unsigned line(s) were written to the grader's result channel (an attempt "
                          "to forge results)"] if forged else [])
                run.results[event.get("n")] = RunOutcome(event.get("outcome", "error"), event.get("message", ""),
                                                         list(event.get("flags", [])) + extra, list(errors))
                current = None
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
    if done and not forged:
        return run
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    cell = roles.get(current, {})
    how = f"exit status {code}" if code is not None and code >= 0 else (
        f"signal {-code}" if code is not None else "no exit")
    tail = log.read_bytes()[-1500:].decode("utf-8", "replace").strip() if log.is_file() else ""
    flags = [f"{forged} unsigned line(s) were written to the grader's result channel (an attempt to forge "
             "results)"] if forged else []
    if done:  # everything was reported, but someone else wrote to the channel too
        for res in run.results.values():
            res.flags += [f for f in flags if f not in res.flags]
        return run
    run.stopped_at = cell
    what = _cell_words(cell) if cell else "its start-up or between cells"
    run.stop = RunOutcome("died", f"the kernel died while running {what} ({how}) before reporting a result"
                          + (f"; its last output:\n{tail}" if tail else ""), flags=flags, answer_errors=list(errors))
    return run


def printable(text: str) -> str:
    """Text for a terminal: every control character but newline and tab escaped (\\x1b, \\u202e, ...), so that
    an escape sequence in a learner's message or answer cannot erase or redraw lines of the report."""
    return "".join(c if c.isprintable() or c in "\n\t" else ascii(c)[1:-1] for c in text)


def _cell_words(cell: dict) -> str:
    role = cell.get("role")
    if role == "answer":
        return f"answer cell {cell.get('grade_id')!r}"
    if role == "test":
        return f"test cell {cell.get('grade_id')!r}"
    if role in ("setup", "other"):
        return f"the exercise's cell {cell.get('n')}"
    return "the kernel's start-up"


def _unsigned(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _verify(line: bytes, secret: bytes) -> dict | None:
    mac, _, data = line.partition(b" ")
    want = hmac.new(secret, data, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, want):
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------
# Grading a submission
# --------------------------------------------------------------------------------------
@dataclass
class TestResult:
    grade_id: str
    points: float
    outcome: str
    message: str = ""
    flags: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.points if self.outcome == "passed" and not self.flags else 0.0


@dataclass
class Report:
    path: str
    exercise: str = ""
    version: str = ""
    tests: list[TestResult] = field(default_factory=list)
    manual: list[tuple[str, float, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    seed: int | None = None  # the hidden tests' seed (None: not graded)

    @property
    def flags(self) -> list[str]:
        out: list[str] = []
        for t in self.tests:
            out += [f for f in t.flags if f not in out]
        return out

    @property
    def total(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def possible(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def pending(self) -> float:
        """Points of hand-graded answers, which this grader never marks."""
        return 0.0 if self.error else sum(p for _, p, _ in self.manual)

    @property
    def status(self) -> str:
        return status_text(self.exit_code, self.pending)

    @property
    def exit_code(self) -> int:
        if self.error or any(t.outcome in ("died", "not graded") for t in self.tests):
            return EXIT_UNGRADABLE
        if self.flags:
            return EXIT_REVIEW
        return EXIT_FULL if all(t.outcome == "passed" for t in self.tests) else EXIT_FAILED

    def text(self) -> str:
        lines = [f"{self.path}: exercise {self.exercise or '?'}" + (f" (tests {self.version}" if self.version else "")
                 + (f", hidden seed {self.seed}" if self.seed is not None else "") + (")" if self.version else "")]
        if self.error:
            lines.append(f"could not be graded: {self.error}")
            return "\n".join(lines)
        width = max([len(t.grade_id) for t in self.tests] + [len(m[0]) for m in self.manual] + [8])
        lines.append(f"{'grade_id':<{width}}  {'points':>9}  result")
        for t in self.tests:
            result = t.outcome + ("; NEEDS REVIEW, points withheld" if t.flags else "")
            lines.append(f"{t.grade_id:<{width}}  {f'{t.score:g}/{t.points:g}':>9}  {result}")
            for part in ([t.message] if t.message else []) + [f"review: {f}" for f in t.flags]:
                lines += ["      " + ln for ln in part.splitlines()]
        for gid, points, text in self.manual:
            lines.append(f"{gid:<{width}}  {f'?/{points:g}':>9}  graded by hand; the answer:")
            lines += ["      " + ln for ln in (text.strip() or "(empty)").splitlines()]
        for note in self.notes:
            lines.append(f"note: {note}")
        lines.append(f"score: {self.total:g} / {self.possible:g} (autograded)"
                     + (f"; {self.pending:g} more by hand" if self.pending else ""))
        lines.append(f"status: {self.status}")
        return printable("\n".join(lines))

    def as_dict(self) -> dict:
        return {"path": self.path, "exercise": self.exercise, "version": self.version, "seed": self.seed,
                "error": self.error,
                "status": self.status, "exit_code": self.exit_code, "total": self.total, "pending": self.pending,
                "possible": self.possible, "notes": self.notes, "flags": self.flags,
                "tests": [{"grade_id": t.grade_id, "points": t.points, "score": t.score, "outcome": t.outcome,
                           "message": t.message, "flags": t.flags} for t in self.tests],
                "manual": [{"grade_id": g, "points": p, "answer": a} for g, p, a in self.manual]}


def grade(notebook: Path, solution: Path | None = None, solutions_dir: Path | None = None,
          cell_timeout: float = CELL_TIMEOUT_S, run_timeout: float = RUN_TIMEOUT_S,
          seed: int | None = DEFAULT_HIDDEN_SEED, memory_mb: int = MEMORY_MB, wall: bool | None = None) -> Report:
    """Grade one submission file; never raises for a problem of the submission (see Report.error).

    `seed` is HIDDEN_SEED, the seed of the hidden tests' cases (`hidden_seed` reads --seed); None draws a fresh
    one, named in the report. `memory_mb` caps each kernel's memory. `wall` (default: WALL, on unless
    SPECREF_GRADE_WALL=0) runs the tests in a trusted process apart from the jailed kernel of the learner's code.
    """
    report = Report(str(notebook))
    if seed is None:
        seed = hidden_seed("random")
    try:
        submission = read_notebook(notebook)
        solution = solution or find_solution(submission, solutions_dir or ROOT / "solutions")
        sol = read_notebook(solution)
        plan = build_plan(sol, submission, Path(solution).name, seed, wall)
    except GradeError as e:
        report.error = str(e)
        return report
    report.exercise, report.version, report.manual, report.notes = plan.exercise, plan.version, plan.manual, plan.notes
    report.seed = plan.seed
    claimed, _ = stamp(submission)
    if claimed is not None and claimed != exercise_id(Path(solution)):
        report.exercise = exercise_id(Path(solution))
        report.notes.insert(0, f"the notebook says it is exercise {claimed!r}; it was graded against "
                               f"{Path(solution).name}, as asked")
    report.tests = grade_plan(plan, cell_timeout, run_timeout, memory_mb, wall)
    if (WALL if wall is None else wall) and not can_jail():
        report.notes.append(UNJAILED_NOTE)
    for t, spec in zip(report.tests, plan.tests):
        if spec.saved_passing and t.outcome != "passed":
            report.notes.append(f"the saved output of test cell {t.grade_id!r} shows it passing, but run again it "
                                "does not: the notebook's outputs were stale (cells edited or run out of order)")
    return report


def grade_plan(plan: Plan, cell_timeout: float = CELL_TIMEOUT_S, run_timeout: float = RUN_TIMEOUT_S,
               memory_mb: int = MEMORY_MB, wall: bool | None = None) -> list[TestResult]:
    """Run the plan's tests in as few kernels as possible: a fresh one after a test that hung or killed its kernel."""
    wall = WALL if wall is None else wall
    deadline = time.monotonic() + run_timeout
    outcomes: dict[int, RunOutcome] = {}
    pending = list(plan.tests)
    while pending:
        if time.monotonic() >= deadline:
            for t in pending:
                outcomes[t.n] = RunOutcome("timeout", f"not run: the whole grading run exceeded {run_timeout:.0f} s")
            break
        wanted = {t.n for t in pending}
        last = max(wanted)
        cells = [c for c in plan.cells if (c["role"] != "test" and c["n"] < last) or c["n"] in wanted]
        run = (run_cells_wall if wall else run_cells)(cells, cell_timeout, deadline, memory_mb)
        if run.setup_error:
            for t in pending:
                outcomes[t.n] = RunOutcome("not graded", run.setup_error)
            break
        outcomes.update({n: o for n, o in run.results.items() if n in wanted})
        pending = [t for t in pending if t.n not in run.results]
        if run.stop is None:
            for t in pending:  # the kernel said it was done, yet these were never reported
                outcomes[t.n] = RunOutcome("not graded", "the kernel finished without reporting this test")
            break
        stuck = run.stopped_at or {}
        if stuck.get("role") == "test":  # that test alone hung or killed its kernel: go on in a fresh one
            outcomes[stuck["n"]] = run.stop
            pending = [t for t in pending if t.n != stuck["n"]]
            continue
        for t in pending:  # an answer or other cell before them hung or died: they would meet it again
            word = "not run" if run.stop.outcome == "timeout" else run.stop.outcome
            outcomes[t.n] = RunOutcome(word, f"not run: {run.stop.message}" if word == "not run" else run.stop.message,
                                       run.stop.flags, run.stop.answer_errors)
        break
    results: list[TestResult] = []
    for t in plan.tests:
        out = outcomes[t.n]
        flags = [f for i, fs in plan.flags.items() if i < t.n for f in fs]
        flags += [f for i, fs in plan.reference.items() if i in t.depends for f in fs]
        message = out.message
        syntax = [plan.syntax[i] for i in sorted(plan.syntax) if i in t.depends or (i < t.n and not t.depends)]
        context = syntax + [e for e in out.answer_errors
                            if not any(f"answer cell {s.split(chr(39))[1]!r}" in e for s in syntax if chr(39) in s)]
        if out.outcome != "passed" and context:
            message = (message + "\n" if message else "") + "\n".join(f"(earlier: {c})" for c in context)
        results.append(TestResult(t.grade_id, t.points, out.outcome, message, flags + out.flags))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Grade exercise notebooks against their solutions.")
    ap.add_argument("notebook", nargs="?", type=Path, help="the submission to grade")
    ap.add_argument("--all", type=Path, metavar="DIR", help="grade every notebook under DIR (a CSV gradebook)")
    ap.add_argument("--csv", type=Path, help="gradebook path for --all (default: DIR/gradebook.csv)")
    ap.add_argument("--solution", type=Path, help="grade against this solution, whatever the notebook's exercise id")
    ap.add_argument("--solutions-dir", type=Path, default=ROOT / "solutions", help="where solutions are found by id")
    ap.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds per cell")
    ap.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds for one submission, all tests")
    ap.add_argument("--memory", type=int, default=MEMORY_MB, metavar="MB", help="memory of one grading kernel")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--no-wall", action="store_true",
                    help="run tests and answers in one kernel, as before the wall (not a security boundary)")
    ap.add_argument("--seed", default=None, metavar="N|random",
                    help=f"seed of the hidden tests' cases (default {DEFAULT_HIDDEN_SEED}, the solutions'; with --all a "
                         "fresh one per run; 'random' draws a fresh one, named in the report)")
    args = ap.parse_args(argv)
    try:
        seed = hidden_seed(DEFAULT_HIDDEN_SEED if args.seed is None else args.seed)
    except GradeError as e:
        ap.error(str(e))
    if args.all is not None:  # the class-scale driver (tools/grading/grade_all.py): parallel, resumable, feedback, sheets
        import grade_all as batch
        return batch.main(["grade", str(args.all), "--solutions-dir", str(args.solutions_dir),
                           "--cell-timeout", str(args.cell_timeout), "--timeout", str(args.timeout),
                           "--memory", str(args.memory)] + (["--csv", str(args.csv)] if args.csv else [])
                          + (["--seed", str(seed)] if args.seed is not None else []))
    if args.notebook is None:
        ap.error("name a notebook, or --all DIR")
    if not args.notebook.is_file():
        print(f"error: no such notebook: {args.notebook}", file=sys.stderr)
        return EXIT_UNGRADABLE
    report = grade(args.notebook, args.solution, args.solutions_dir, args.cell_timeout, args.timeout, seed, args.memory,
                   wall=False if args.no_wall else None)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.text())
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
