"""What one grading costs, per exercise and kind of submission, here and in another checkout (a baseline).

Each exercise's four kinds (bench_grade_all.submission: solved, stub, broken, partial), made by each tree's own
bench_grade_all from its own solutions/ and exercises/, are graded alone with the single-submission CLI
(``python -I -m specref_grading.grade --seed S``), the trees interleaved, REPEATS times. Measured for each grading:
wall seconds, CPU seconds of the whole process tree (a cpuacct cgroup of its own, as root on cgroup v1: it counts
every descendant, the jailed kernel included, which getrusage's RUSAGE_CHILDREN misses; else that), and where the wall
time goes: the grader's phases before the run (start and imports, reading, plan), the trusted process's start,
then the cells by role (setup, answer, other, test), from the events the checks send (the trusted process's CPU
seconds come with each test's result). Printed: the medians per exercise x kind x tree. --warm grades in one
long-lived process per tree instead, as a class run's worker does (classrun._grade_one).

    python benchmarks/bench_grade_kinds.py [--base-root /path/to/checkout --base-python /its/venv/bin/python]
        [--exercises ex01,ex04] [--kinds solved,stub] [--repeats 3] [--seed 7] [--warm] [--out FILE]

The baseline's interpreter must import that checkout's specref and specref_grading (an environment of its own,
e.g. an editable install of it). Writes benchmarks/results/grade_kinds_cpu.json unless --out names another file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("solved", "stub", "broken", "partial")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")

# Made by each tree's own interpreter: that tree's bench_grade_all.submission for every exercise and kind.
MAKE = """import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import bench_grade_all as B
out = Path(sys.argv[2])
for ex in sys.argv[3].split(","):
    for kind in sys.argv[4].split(","):
        (out / f"{ex}.{kind}.ipynb").write_text(json.dumps(B.submission(ex, kind)), encoding="utf-8")
"""

# Runs the grade CLI in this process, timing its phases and the trusted process's events (both trees' layouts).
PHASES = """import sys, time, json, importlib, os
t0 = time.monotonic()
from specref_grading import grade as G
W = importlib.import_module(G.run_cells.__module__)
marks = {"import": time.monotonic() - t0, "files": [G.__file__, W.__file__], "phases": [], "events": []}
def timed(mod, name, label):
    fn = getattr(mod, name, None)
    if fn is None:
        return
    def wrapper(*a, **k):
        s = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            marks["phases"].append([label, s - t0, time.monotonic() - t0])
    setattr(mod, name, wrapper)
for mod, name, label in ((G, "read_submission", "read"), (G, "read_notebook", "read"), (G, "build_plan", "plan"),
                         (G, "prepare_trusted_uid", "prepare"), (G, "run_cells", "run"), (W, "_ready", "trusted start"),
                         (W.kernel_tree, "build", "kernel tree")):
    timed(mod, name, label)
event = W._event
def seen(line):
    e = event(line)
    if e:
        marks["events"].append([time.monotonic() - t0, e.get("ev"), e.get("n"), e.get("role"), e.get("cpu_s"),
                                e.get("test_cpu_s"), e.get("calls"), e.get("outcome")])
    return e
W._event = seen
if sys.argv[1:] != ["--serve"]:
    try:
        code = G.main(sys.argv[1:])
    finally:
        marks["end"] = time.monotonic() - t0
        sys.stderr.write("\\nBENCH_PHASES " + json.dumps(marks) + "\\n")
    raise SystemExit(code)
from pathlib import Path
root_group = None
for line in sys.stdin:  # a class run's worker: grade() again and again in this process (classrun._grade_one)
    ask = json.loads(line)
    t0 = time.monotonic()
    marks = {"import": 0.0, "files": [G.__file__, W.__file__], "phases": [], "events": []}
    if ask["cgroup"]:
        with open(ask["cgroup"] + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    try:
        report = G.grade(Path(ask["notebook"]), solutions_dir=Path(ask["solutions"]), seed=ask["seed"])
        out = {"exit": report.exit_code, "outcomes": [t.outcome for t in report.tests]}
    finally:
        if ask["cgroup"]:
            with open(os.path.dirname(ask["cgroup"]) + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
    marks["end"] = time.monotonic() - t0
    sys.stdout.write(json.dumps({**out, "marks": marks}) + "\\n")
    sys.stdout.flush()
"""


def make_submissions(root: Path, python: str, folder: Path, exercises: list[str], kinds: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-I", "-c", MAKE, str(root), str(folder), ",".join(exercises), ",".join(kinds)],
                   check=True, cwd=folder)


def _cgroup(tag: str) -> Path | None:
    """A cpuacct cgroup of its own for one grading (None where this host has no cgroup-v1 cpuacct to write)."""
    path = CPUACCT / f"bench-grade-kinds-{os.getpid()}-{tag}"
    try:
        path.mkdir()
        return path
    except OSError:
        return None


def grade_once(root: Path, python: str, notebook: Path, seed: int, tag: str,
               worker: subprocess.Popen | None = None) -> dict:
    """One grading: in a fresh CLI process, or by `worker` (a long-lived process that calls grade() as a class
    run's worker does); wall, CPU of the whole tree, exit status, the phases and events (PHASES)."""
    group = _cgroup(tag)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    if worker is None:
        join = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
        proc = subprocess.run([python, "-I", "-c", PHASES, "--solutions-dir", str(root / "solutions"), "--seed",
                               str(seed), "--json", str(notebook)], cwd=notebook.parent, capture_output=True,
                              text=True, preexec_fn=join)
        line = next((x for x in proc.stderr.splitlines() if x.startswith("BENCH_PHASES ")), None)
        marks = json.loads(line.split(" ", 1)[1]) if line else {}
        try:
            got = {"exit": proc.returncode, "outcomes": [t["outcome"] for t in json.loads(proc.stdout)["tests"]]}
        except (ValueError, KeyError):
            got = {"exit": proc.returncode, "outcomes": []}
    else:
        worker.stdin.write(json.dumps({"notebook": str(notebook), "solutions": str(root / "solutions"),
                                       "seed": seed, "cgroup": str(group) if group else None}) + "\n")
        worker.stdin.flush()
        got = json.loads(worker.stdout.readline())
        marks = got.pop("marks")
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cpu = None
    if group is not None:
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    return {"wall_s": wall, "cpu_s": cpu if cpu is not None else rusage, "rusage_children_s": rusage, **got,
            "breakdown": breakdown(marks), "cells": per_cell(marks), "files": marks.get("files", [])}


def breakdown(marks: dict) -> dict:
    """Seconds of wall per phase; the cells' time by role; the trusted process's CPU (s) and its tests' calls."""
    out: dict[str, float] = {"start+import": marks.get("import", 0.0)}
    for label, s, e in marks.get("phases", []):
        out[label] = out.get(label, 0.0) + e - s
    starts: dict = {}
    last = 0.0  # the trusted process's CPU so far (cumulative in each process; a fresh pair starts from 0)
    for t, ev, n, role, cpu_s, test_cpu, calls, _ in marks.get("events", []):
        if ev == "start":
            starts[n] = (t, role)
        elif ev in ("end", "result", "stop", "cell_error") and n in starts:
            s, r = starts.pop(n)
            out[f"cells:{r}"] = out.get(f"cells:{r}", 0.0) + t - s
        if cpu_s is not None:
            out["trusted_cpu"] = out.get("trusted_cpu", 0.0) + (cpu_s - last if cpu_s >= last else cpu_s)
            last = cpu_s
        if ev == "result":
            out["test_cpu"] = out.get("test_cpu", 0.0) + (test_cpu or 0.0)
            out["calls"] = out.get("calls", 0) + (calls or 0)
    if "end" in marks:
        out["end"] = marks["end"]
    return out


def per_cell(marks: dict) -> list[list]:
    """[n, role, wall seconds, the test's CPU in the trusted process, its calls across the wall] per cell run."""
    starts, out = {}, []
    for t, ev, n, role, _, test_cpu, calls, _ in marks.get("events", []):
        if ev == "start":
            starts[n] = (t, role)
        elif ev in ("end", "result", "stop", "cell_error") and n in starts:
            s, r = starts.pop(n)
            out.append([n, r, round(t - s, 3), test_cpu, calls])
    return out


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-root", type=Path, help="another checkout to compare with (the baseline)")
    ap.add_argument("--base-python", help="the baseline's interpreter (its environment imports that checkout)")
    ap.add_argument("--python", default=sys.executable, help="this checkout's interpreter")
    ap.add_argument("--exercises", help="comma-separated ids (default: every solution's, ex01_roofline -> ex01)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7, help="the hidden tests' seed (the same for every grading)")
    ap.add_argument("--warm", action="store_true", help="grade in one long-lived process per tree, as a class run's "
                    "worker does, instead of a fresh CLI process per grading")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grade_kinds_cpu.json")
    args = ap.parse_args(argv)
    if (args.base_root is None) != (args.base_python is None):
        ap.error("--base-root and --base-python go together")
    names = sorted(p.stem for p in (ROOT / "solutions").glob("ex*.ipynb"))
    wanted = args.exercises.split(",") if args.exercises else [n.split("_")[0] for n in names]
    exercises = [n for n in names if n.split("_")[0] in wanted]
    kinds = args.kinds.split(",")
    trees = {"head": (ROOT, args.python)}
    if args.base_root:
        trees["base"] = (args.base_root.resolve(), args.base_python)
    work = Path(tempfile.mkdtemp(prefix="bench-grade-kinds-"))
    for name, (root, python) in trees.items():
        make_submissions(root, python, work / name, exercises, kinds)
    workers = {name: subprocess.Popen([python, "-I", "-c", PHASES, "--serve"], cwd=work, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for name, (root, python) in trees.items()} if args.warm else {}
    runs: dict[str, list[dict]] = {}
    print(f"{len(exercises)} exercises x {len(kinds)} kinds x {len(trees)} trees x {args.repeats}; load average "
          f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    for rep in range(args.repeats):
        for ex in exercises:
            for kind in kinds:
                order = list(trees) if rep % 2 == 0 else list(trees)[::-1]  # interleaved, each first in turn
                for name in order:
                    root, python = trees[name]
                    r = grade_once(root, python, work / name / f"{ex}.{kind}.ipynb", args.seed, f"{name}-{rep}",
                                   workers.get(name))
                    runs.setdefault(f"{ex.split('_')[0]} {kind} {name}", []).append(r)
                    print(f"  {rep} {ex.split('_')[0]} {kind:<8} {name:<5} wall {r['wall_s']:6.1f} cpu "
                          f"{r['cpu_s']:6.1f} exit {r['exit']} {r['files'][:1]}", flush=True)
                    save(args, trees, runs)  # after every grading: a run stopped half-way keeps what it measured
    for w in workers.values():
        w.stdin.close()
        w.wait()
    rows = save(args, trees, runs)
    shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {args.repeats} (s); load average {os.getloadavg()[0]:.2f}")
    print(f"{'exercise kind tree':<24}{'wall':>7}{'cpu':>7}  where the wall goes")
    for key, row in rows.items():
        b = row["breakdown"]
        parts = " ".join(f"{k.replace('cells:', '')} {v:.1f}" for k, v in b.items() if k not in ("calls", "end"))
        print(f"{key:<24}{row['wall_s']:7.1f}{row['cpu_s']:7.1f}  {parts}")
    print(f"written: {args.out}")
    return rows


def save(args: argparse.Namespace, trees: dict, runs: dict[str, list[dict]]) -> dict:
    """The medians per exercise x kind x tree (and every run), written to args.out."""
    rows = {key: {"wall_s": median(rs, "wall_s"), "cpu_s": median(rs, "cpu_s"),
                  "breakdown": {k: statistics.median(r["breakdown"].get(k, 0.0) for r in rs)
                                for k in sorted({k for r in rs for k in r["breakdown"]})},
                  "exits": [r["exit"] for r in rs], "runs": rs} for key, rs in runs.items()}
    result = {"python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M"), "seed": args.seed,
              "repeats": args.repeats, "warm": args.warm, "trees": {k: str(v[0]) for k, v in trees.items()},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
