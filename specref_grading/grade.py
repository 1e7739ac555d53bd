"""Grade one exercise notebook: the solution decides what runs, the learner supplies only the answers.

    python -I -m specref_grading.grade submissions/alice/ex02.ipynb                      # make grade NB=...
    python -I -m specref_grading.grade alice.ipynb --solution solutions/ex02_accept_reject.ipynb --seed 7
    python -I -m specref_grading.classrun grade submissions/                              # make grade-all DIR=...

(-I: isolated, so that nothing in the working directory, such as a folder of submissions, is imported in the
grader's place.)

How one submission is graded:

1. The notebook is read as JSON (`notebook`). Its exercise id (``metadata.specref.exercise``, stamped by
   `specref_grading.exercises`) names the solution in solutions/, whatever the file is called; ``--solution``
   overrides it. An older exercise version is graded with today's tests.
2. The plan (`plan`): what runs is built from the SOLUTION, its setup cells, its test cells (hidden tests
   included) and its order. From the submission only the source of each answer cell is taken, found by
   grade_id (or cell id). Everything else in the submission is ignored and listed in the report.
3. The cells run on two sides of a wall (`wall`):
   - a jailed kernel (`jail`) runs the solution's setup cells, the learner's answer cells and the
     exercise's other cells, never a test cell. As root it runs in its own namespaces, chrooted into a
     tmpfs that holds read-only binds of the system, the interpreter, the virtual environment and a copy
     of specref made for the exercise, as a fresh unprivileged uid with no capabilities and resource limits.
     It can read no file of the repository (solutions/, this package) or of another submission, and reach
     no network. Without root (or namespaces) it runs as a plain child process, the report says so, and
     only the wall holds.
   - a trusted process (`trusted`) runs the setup cells too, then each test cell. The names a test reads
     from the answers are proxies: calling one sends plain data to the kernel (`protocol`), under a per-call
     time limit. The trusted process decides each test's outcome and reports it on a pipe the kernel cannot
     reach: nothing the answers do in their kernel can change a grade.
   All tests share one pair of processes; when a call into the kernel hangs past its limit or the kernel
   dies, that test fails and a fresh pair runs the tests that remain.

Hidden tests draw their cases from ``HIDDEN_SEED``: a fresh seed for every grading unless ``--seed N`` asks
for a given one (the report names the seed, so a grade can be reproduced; N >= 1, since seed 0 draws the
visible cases).

Exit status: 0 full marks; 1 some check failed; 2 could not be graded (unreadable notebook, no matching
solution, the kernel died, a report is missing); 3 needs review (a flag raised by the trusted side, e.g. a
function that modified its inputs; what the scanner notices in an answer is only a note).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specref_grading.notebook import GradeError, exercise_id, find_solution, read_notebook, stamp
from specref_grading.plan import Plan, build_plan, hidden_seed
from specref_grading.processes import UNJAILED_NOTE, can_jail, prepare_trusted_uid, root_refusal
from specref_grading.report import EXIT_UNGRADABLE, Report, TestResult, printable
from specref_grading.trust.reading import read_submission
from specref_grading.trust.wall import MEMORY_MB, RunOutcome, run_cells

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 180
RUN_TIMEOUT_S = 1800  # one submission, all of its tests together

UNJAILED_REFUSED = (
    "refused: this host cannot jail the learner's code (the grader is not root, or it has no mount, network and pid "
    "namespaces: a container without CAP_SYS_ADMIN), so the answers would run as a plain process that can read "
    "what the grading user can read: the solutions, the hidden tests, the checks, the other submissions. Grade as "
    "root on a host with namespaces; or, knowing that, ask for it with --unjailed (make grade ... UNJAILED=1)")


def jail_mode() -> str:
    """How this host runs the learner's code: "jailed" or "unjailed" (part of a class run's key: a grade made
    unjailed is regraded by a jailed run)."""
    return "jailed" if can_jail() else "unjailed"


def jail_refusal(unjailed: bool) -> str | None:
    """Why a grading is refused here (None where it may go on): no jail and `unjailed` not asked for; or, asked for,
    a grader that is root and cannot run the kernel as a fresh uid (learner code never runs as root)."""
    if can_jail():
        return None
    if not unjailed:
        return UNJAILED_REFUSED
    return root_refusal()


# What the trusted side says when the kernel that runs the submission's code ended or broke the channel: the
# submission's failure (exit 1), not the grader's. The trusted process itself dying over its limits is too.
KERNEL_ENDED = ("the kernel running the submission's code died", "the kernel died while running answer cell",
                "the kernel died while running cell")
TRUSTED_OVER_LIMITS = "was killed: over its CPU time or memory limit"
TRUSTED_DIED = "before reporting a result"  # wall's words for the trusted process itself ending


def judged(outcome: RunOutcome, stopped_at: dict | None) -> RunOutcome:
    """A kernel or channel fault as the failure of whoever caused it: "died" (could not be graded, regraded by
    --retry) only for faults of the grader; where the submission's code ended its kernel, broke the channel (a
    value the trusted side refuses, os._exit) or drove the checks past their limits, the test failed, with its
    cause."""
    if outcome.outcome != "died" or (stopped_at or {}).get("role") not in ("answer", "test", "other"):
        return outcome
    message = outcome.message
    if message.startswith(KERNEL_ENDED) and TRUSTED_DIED not in message:
        why = ("the submission's code ended its kernel or broke the channel to the checks (it exited, was killed, "
               "or sent a value the grader refuses): " + message)
    elif TRUSTED_OVER_LIMITS in message:
        why = "the submission's values drove the checks past their limits: " + message
    else:
        return outcome
    return RunOutcome("failed", why, outcome.flags, outcome.answer_errors)


def grade(notebook: Path, solution: Path | None = None, solutions_dir: Path | None = None,
          cell_timeout: float = CELL_TIMEOUT_S, run_timeout: float = RUN_TIMEOUT_S,
          seed: int | None = None, memory_mb: int = MEMORY_MB, unjailed: bool = False) -> Report:
    """Grade one submission file; never raises for a problem of the submission (see Report.error).

    `seed` is HIDDEN_SEED, the seed of the hidden tests' cases (`hidden_seed` reads --seed); None draws a fresh
    one, named in the report. `memory_mb` caps each kernel's memory. Where this host cannot jail the kernel,
    nothing runs unless `unjailed` asks, and never as root (`jail_refusal`: the report's error says why).
    """
    report = Report(str(notebook))
    if seed is None:
        seed = hidden_seed("random")
    refused = jail_refusal(unjailed)
    if refused is not None:
        report.error = refused
        return report
    prepare_trusted_uid()  # as root: the trusted process runs as a fresh uid too, where one can run the interpreter
    try:
        submission = read_submission(notebook)  # parsed in a limited process, never here
        solution = solution or find_solution(submission, solutions_dir or ROOT / "solutions")
        sol = read_notebook(solution)
        plan = build_plan(sol, submission, Path(solution).name, seed)
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
    report.tests = grade_plan(plan, cell_timeout, run_timeout, memory_mb)
    if not can_jail():
        report.notes.append(UNJAILED_NOTE)
    for t, spec in zip(report.tests, plan.tests):
        if spec.saved_passing and t.outcome != "passed":
            report.notes.append(f"the saved output of test cell {t.grade_id!r} shows it passing, but run again it "
                                "does not: the notebook's outputs were stale (cells edited or run out of order)")
    return report


def grade_plan(plan: Plan, cell_timeout: float = CELL_TIMEOUT_S, run_timeout: float = RUN_TIMEOUT_S,
               memory_mb: int = MEMORY_MB) -> list[TestResult]:
    """Run the plan's tests in as few kernels as possible: a fresh one after a test that hung or killed its kernel."""
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
        run = run_cells(cells, cell_timeout, deadline, memory_mb)
        if run.stop is not None:
            run.stop = judged(run.stop, run.stopped_at)
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
        message = out.message
        syntax = [plan.syntax[i] for i in sorted(plan.syntax) if i in t.depends or (i < t.n and not t.depends)]
        context = syntax + [e for e in out.answer_errors
                            if not any(f"answer cell {s.split(chr(39))[1]!r}" in e for s in syntax if chr(39) in s)]
        if out.outcome != "passed" and context:
            message = (message + "\n" if message else "") + "\n".join(f"(earlier: {c})" for c in context)
        results.append(TestResult(t.grade_id, t.points, out.outcome, message, out.flags))  # the trusted side's flags
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -I -m specref_grading.grade",
                                 description="Grade one exercise notebook against its solution.")
    ap.add_argument("notebook", type=Path, help="the submission to grade")
    ap.add_argument("--solution", type=Path, help="grade against this solution, whatever the notebook's exercise id")
    ap.add_argument("--solutions-dir", type=Path, default=ROOT / "solutions", help="where solutions are found by id")
    ap.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds per cell")
    ap.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds for one submission, all tests")
    ap.add_argument("--memory", type=int, default=MEMORY_MB, metavar="MB", help="memory of one grading kernel")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--unjailed", action="store_true",
                    help="grade even where this host cannot jail the learner's code (then a plain process of a fresh "
                         "uid, never root); without it such a grading is refused")
    ap.add_argument("--seed", default="random", metavar="N|random",
                    help="seed of the hidden tests' cases (default: a fresh one, named in the report; N >= 1 "
                         "reproduces a grading)")
    args = ap.parse_args(argv)
    try:
        seed = hidden_seed(args.seed)
    except GradeError as e:
        ap.error(str(e))
    if not args.notebook.is_file():
        print(f"error: no such notebook: {printable(str(args.notebook))}", file=sys.stderr)
        return EXIT_UNGRADABLE
    report = grade(args.notebook, args.solution, args.solutions_dir, args.cell_timeout, args.timeout, seed, args.memory,
                   args.unjailed)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.text())
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
