"""How fast `make grade-all` grades a class: N submissions of a mix of exercises, JOBS workers.

The class is made here, from solutions/ and exercises/ (specref_grading.exercises' output), for
every exercise in turn (ex01, ex02, ... ex08, ex01, ...), each round of them starting one kind further
(so that every exercise meets every kind within four rounds):

- ``solved``:  the solution, stamped with the exercise's id as a learner's saved notebook is;
- ``stub``:    the exercise as handed out, nothing answered;
- ``broken``:  the solution with a syntax error typed into its first code answer;
- ``partial``: the solution with its last code answer put back to the exercise's stub.

The last of the N is a solved notebook saved under the next exercise's file name (the console line
must name the exercise graded). Then specref_grading.classrun grades the folder (a fresh seed each), and grades it again
(every submission unchanged: the resumed run must regrade none). Printed: the wall time, submissions
per minute, the mean seconds one submission takes in a worker, per exercise, and the host's load
average before and after (other work on the host slows every figure).

    python benchmarks/bench_grade_all.py --n 200 --jobs 2 [--out FILE] [--keep DIR] [--no-resume]

Writes benchmarks/results/grade_all_cpu.json unless --out names another file; the class and its
gradebook, feedback and hand-grading sheets go to a temporary folder (or --keep DIR, kept).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from specref.perf.machine import machine_name
from specref_grading import classrun as GA
from specref_grading.exercises import strip_regions

KINDS = ("solved", "stub", "broken", "partial")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _code_answers(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("solution")]


def submission(exercise_id: str, kind: str) -> dict:
    """One learner's notebook of this exercise, of this kind (see the module docstring)."""
    if kind == "stub":
        return json.loads((ROOT / "exercises" / f"{exercise_id}.ipynb").read_text(encoding="utf-8"))
    nb = json.loads((ROOT / "solutions" / f"{exercise_id}.ipynb").read_text(encoding="utf-8"))
    stamped = json.loads((ROOT / "exercises" / f"{exercise_id}.ipynb").read_text(encoding="utf-8"))
    nb["metadata"]["specref"] = copy.deepcopy(stamped["metadata"]["specref"])
    answers = _code_answers(nb)
    if kind == "broken":
        answers[0]["source"] = _source(answers[0]) + "\nif answer_is_done\n"
    elif kind == "partial":
        answers[-1]["source"] = strip_regions(_source(answers[-1]), "code", exercise_id)
    return nb


def make_class(n: int, folder: Path) -> dict[str, tuple[str, str]]:
    """Write n submissions under folder/student_NNN/; {relative path: (exercise, kind)}."""
    exercises = sorted(p.stem for p in (ROOT / "solutions").glob("ex*.ipynb"))
    made = {}
    for i in range(n):
        ex = exercises[i % len(exercises)]
        kind = KINDS[(i + i // len(exercises)) % len(KINDS)]  # each round shifts: every pair in 4 rounds
        name = ex
        if i == n - 1 and n > 1:  # the last one: solved, under the next exercise's file name
            kind, name = "solved", exercises[(i + 1) % len(exercises)]
        rel = f"student_{i:03d}/{name}.ipynb"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(json.dumps(submission(ex, kind)), encoding="utf-8")
        made[rel] = (ex, kind)
    return made


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="submissions in the class")
    ap.add_argument("--jobs", type=int, default=GA.default_jobs(), help="grade-all's worker processes")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grade_all_cpu.json")
    ap.add_argument("--no-resume", action="store_true", help="skip the second, resumed run (it regrades everything "
                    "if the grader's code or a solution changed meanwhile)")
    ap.add_argument("--keep", type=Path, help="make the class here and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.jobs < 1:
        ap.error("--n and --jobs must be >= 1")
    base = args.keep or Path(tempfile.mkdtemp(prefix="specref-class-"))
    folder = base / "class"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    made = make_class(args.n, folder)
    load_before = os.getloadavg()
    print(f"{args.n} submissions in {folder}; grading with {args.jobs} workers; load average before "
          f"{load_before[0]:.2f} ({os.cpu_count()} CPUs)")
    first = GA.run(folder, base / "gradebook.csv", jobs=args.jobs)
    load_after = os.getloadavg()
    state = json.loads((base / "gradebook.state.json").read_text())
    per: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, int] = defaultdict(int)
    for r in first["rows"]:
        statuses[f"{made[r['file']][1]}: {r['status']}"] += 1
    for rel, entry in state["entries"].items():
        per[made[rel][0]].append(entry["seconds"])
    result = {"machine": machine_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d"), "n": args.n, "jobs": args.jobs, "wall_s": first["wall_s"],
              "per_minute": first["per_minute"], "mean_worker_s": first["mean_s"], "load_before": load_before[0],
              "load_after": load_after[0], "seed": first["seed"],
              "per_exercise_mean_s": {ex: sum(v) / len(v) for ex, v in sorted(per.items())},
              "statuses": dict(sorted(statuses.items())), "class": str(base) if args.keep else None,
              "timeouts": sorted(f"{rel}: {t['grade_id']}" for rel, e in state["entries"].items()
                                 for t in e["report"].get("tests", []) if t["outcome"] == "timeout")}
    print(f"grade-all: {args.n} submissions in {first['wall_s']:.1f} s with {args.jobs} workers: "
          f"{first['per_minute']:.1f} per minute, {first['wall_s'] / args.n:.2f} s of wall time per submission, "
          f"{first['mean_s']:.1f} s each in a worker; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    for ex, mean in result["per_exercise_mean_s"].items():
        print(f"  {ex:<22} {mean:6.1f} s per submission in a worker ({len(per[ex])} submissions)")
    for what, count in result["statuses"].items():
        print(f"  {count:4d}  {what}")
    if result["timeouts"]:
        print(f"  tests that ran out of time (a loaded host?): {', '.join(result['timeouts'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {args.out}", flush=True)
    # Resumed: nothing changed, so nothing is regraded (unless the grader's code or a solution changed meanwhile).
    if not args.no_resume:
        again = GA.run(folder, base / "gradebook.csv", jobs=args.jobs, echo=lambda line: None)
        result["resumed"] = {"graded": again["graded"], "reused": again["reused"], "wall_s": again["wall_s"]}
        print(f"resumed: {again['graded']} regraded, {again['reused']} reused in {again['wall_s']:.1f} s")
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
