"""specref_grading.classrun: a class graded in parallel, resumed, with feedback files and hand-grading sheets.

Two toy exercises built here (pure Python, no torch: a kernel starts in a fraction of a second), each with an
autograded task whose hidden test draws its cases from HIDDEN_SEED, and a hand-graded answer. The grader's version
key: any change to a file that can change a grade changes the key, so a resumed class run regrades; a file no grade
depends on leaves it as it was.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specref_grading import classrun, processes, version
from specref_grading import classrun as GA
from specref_grading import report as grade_report
from specref_grading.exercises import make_exercise as _make_exercise

from .conftest import (
    CLASSRUN_CMD,
    REPO,
    _code,
    _meta,
    answer,
    attacked,
    make_exercise,
    solved,
    toy_solution,
    with_answer,
)

pytestmark = pytest.mark.grader


SETUP = '''import math, random
HIDDEN_SEED = 1

def check_double(fn, xs=(1, 2.5, -3)):
    for x in xs:
        got = fn(x)
        assert isinstance(got, (int, float)) and math.isclose(got, 2 * x), f"double({x}) returned {got!r}"
    print("check_double: passed")'''


def _why(gid, points, cid):
    return {"cell_type": "markdown", "id": cid, "metadata": _meta(gid, points, True),
            "source": "Why does it work?\n\n### BEGIN SOLUTION\nBecause it doubles.\n### END SOLUTION"}


def _notebook(cells):
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def double_solution() -> dict:
    """ex90: double() (2 points; its hidden cases come from HIDDEN_SEED) and a hand-graded answer (1 point)."""
    return _notebook([
        _code(SETUP, {}, "setup"),
        _code("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
              _meta("double_answer", 0, True, graded=False), "a1"),
        _code("check_double(double)\n### BEGIN HIDDEN TESTS\n"
              "check_double(double, xs=[random.Random(HIDDEN_SEED).randint(10, 10**6) for _ in range(3)])\n"
              "### END HIDDEN TESTS", _meta("double_check", 2, False), "t1"),
        _why("double_why", 1, "m1"),
    ])


def pair_solution() -> dict:
    """ex91: pair() (1 point) and a hand-graded answer (2 points)."""
    return _notebook([
        _code("import math", {}, "setup"),
        _code("def pair(xs):\n    ### BEGIN SOLUTION\n    return sorted(xs)\n    ### END SOLUTION",
              _meta("pair_answer", 0, True, graded=False), "a1"),
        _code("assert pair([3, 1]) == [1, 3], f'pair([3, 1]) returned {pair([3, 1])!r}'",
              _meta("pair_check", 1, False), "t1"),
        _why("pair_why", 2, "m1"),
    ])


def exercise_of(solution: dict, name: str) -> dict:
    import nbformat
    return json.loads(nbformat.writes(_make_exercise(nbformat.from_dict(copy.deepcopy(solution)), name)))


def solved_of(solution: dict, name: str) -> dict:
    nb = copy.deepcopy(solution)
    nb["metadata"]["specref"] = exercise_of(solution, name)["metadata"]["specref"]
    return nb


MEMORISED = ("KNOWN = {1, 2.5, -3} | {random.Random(1).randint(10, 10**6) for _ in range(3)}\n"
             "def double(x):\n    return 2 * x if x in KNOWN else 0")


@pytest.fixture
def course(tmp_path):
    """(solutions folder, the class's folder): six submissions of the two toy exercises."""
    sol, sub = tmp_path / "solutions", tmp_path / "class"
    sol.mkdir()
    sub.mkdir()
    d, p = double_solution(), pair_solution()
    (sol / "ex90_double.ipynb").write_text(json.dumps(d))
    (sol / "ex91_pair.ipynb").write_text(json.dumps(p))
    files = {
        "alice/ex90_double.ipynb": solved_of(d, "ex90_double.ipynb"),
        "alice/ex91_pair.ipynb": solved_of(p, "ex91_pair.ipynb"),
        "bob/ex90_double.ipynb": exercise_of(d, "ex90_double.ipynb"),  # untouched stub
        "bob/ex91_pair.ipynb": with_answer(solved_of(p, "ex91_pair.ipynb"), "pair_answer",
                                           "def pair(xs):\n    return sorted(xs"),  # broken: a syntax error
        "carol/ex91_pair.ipynb": solved_of(d, "ex90_double.ipynb"),  # a solved ex90 saved under ex91's name
        "dave/ex90_double.ipynb": None,  # not a notebook
    }
    for rel, nb in files.items():
        (sub / rel).parent.mkdir(exist_ok=True)
        (sub / rel).write_text("{" if nb is None else json.dumps(nb))
    return sol, sub


def _run(course, out: Path, **kw) -> dict:
    sol, sub = course
    kw.setdefault("jobs", 1)
    return GA.run(sub, out / "book.csv", solutions_dir=sol, echo=lambda line: None, **kw)


def _fb(folder: Path, rel: str) -> Path:
    """The feedback file of submission `rel` in a run whose gradebook is folder/book.csv (named by its opaque id)."""
    return GA.feedback_file(GA.outputs(folder / "book.csv"), rel)


def _rows(path: Path) -> dict[str, dict]:
    return {r["file"]: r for r in csv.DictReader(path.open(encoding="utf-8"))}


def _marks(sheet: Path, marks: dict[str, str]) -> None:
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    for r in rows:
        if r["file"] in marks:
            r["marks"] = marks[r["file"]]
    with sheet.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# --------------------------------------------------------------------------------------
def test_status_never_says_full_marks_while_points_await_hand_grading():
    assert grade_report.status_text(grade_report.EXIT_FULL) == "full marks"
    assert grade_report.status_text(grade_report.EXIT_FULL, 1) == "autograded checks passed, 1 point awaits hand grading"
    assert grade_report.status_text(grade_report.EXIT_FAILED, 2.5) == "some checks failed; 2.5 points await hand grading"
    rep = grade_report.Report("x.ipynb", exercise="ex90_double", manual=[("why", 2.0, "YOUR ANSWER HERE")])
    assert rep.exit_code == grade_report.EXIT_FULL and rep.pending == 2
    assert "full marks" not in rep.text() and "2 points await hand grading" in rep.text()
    assert rep.as_dict()["status"] == rep.status and rep.as_dict()["pending"] == 2


def test_a_parallel_run_writes_what_a_serial_run_writes(course, tmp_path):
    serial = _run(course, tmp_path / "serial", seed=5)
    parallel = _run(course, tmp_path / "parallel", seed=5, jobs=3)
    assert serial["graded"] == parallel["graded"] == 6
    assert (tmp_path / "serial" / "book.csv").read_text() == (tmp_path / "parallel" / "book.csv").read_text()
    for name in ("book-feedback", "book-handgrading"):
        a, b = tmp_path / "serial" / name, tmp_path / "parallel" / name
        files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and files
        assert all((a / f).read_text() == (b / f).read_text() for f in files)
    rows = _rows(tmp_path / "serial" / "book.csv")
    assert (rows["alice/ex90_double.ipynb"]["total"], rows["alice/ex90_double.ipynb"]["double_check"]) == ("2", "2")
    assert rows["bob/ex90_double.ipynb"]["total"] == "0" and "NotImplementedError" in rows["bob/ex90_double.ipynb"]["reasons"]
    assert "syntax error in answer cell 'pair_answer'" in _fb(tmp_path / "serial", "bob/ex91_pair.ipynb").read_text()
    assert rows["dave/ex90_double.ipynb"]["status"] == "could not be graded"
    assert serial["exit_code"] == parallel["exit_code"] == grade_report.EXIT_UNGRADABLE


def test_a_symbolic_link_is_never_graded(course, tmp_path):
    """A link to another learner's notebook, or to their folder, would be graded as the linker's own work."""
    sol, sub = course
    (sub / "eve").mkdir()
    (sub / "eve" / "ex90_double.ipynb").symlink_to(sub / "alice" / "ex90_double.ipynb")
    (sub / "frank").symlink_to(sub / "alice", target_is_directory=True)
    (sub / "alice" / "loop").symlink_to(sub, target_is_directory=True)  # a link to a parent: walked once, no loop
    summary = _run(course, tmp_path / "out", seed=5)
    rows = _rows(tmp_path / "out" / "book.csv")
    linked = ["eve/ex90_double.ipynb", "frank/ex90_double.ipynb", "frank/ex91_pair.ipynb"]
    for rel in linked:
        assert rows[rel]["status"] == "could not be graded" and rows[rel]["total"] == "0", rows[rel]
        assert "a symbolic link" in rows[rel]["reasons"], rows[rel]
        assert "a symbolic link" in _fb(tmp_path / "out", rel).read_text()
    assert rows["alice/ex90_double.ipynb"]["total"] == "2" and summary["graded"] == 6
    looped = [f for f in rows if f.startswith("alice/loop/")]
    assert "alice/loop/bob/ex90_double.ipynb" in looped and not any(f.count("loop") > 1 for f in looped)
    assert all(rows[f]["status"] == "could not be graded" for f in looped)
    assert _run(course, tmp_path / "out", seed=5)["graded"] == 0  # a resumed run: nothing to regrade


def test_resume_regrades_only_what_changed(course, tmp_path):
    sol, sub = course
    seeds = lambda: {rel: e.get("seed") for rel, e in  # noqa: E731
                     json.loads((tmp_path / "book.state.json").read_text())["entries"].items()}
    first = _run(course, tmp_path)
    assert (first["graded"], first["reused"], first["seed"]) == (6, 0, None)  # no one seed: one per submission
    before = seeds()
    again = _run(course, tmp_path)
    assert (again["graded"], again["reused"]) == (0, 6) and seeds() == before  # unchanged: grade and seed kept
    assert (tmp_path / "book.csv").read_text().count("\n") == 7
    stub = sub / "bob" / "ex90_double.ipynb"
    stub.write_text(json.dumps(solved_of(double_solution(), "ex90_double.ipynb")))  # bob hands in again, solved
    third = _run(course, tmp_path)
    assert (third["graded"], third["reused"]) == (1, 5)
    assert _rows(tmp_path / "book.csv")["bob/ex90_double.ipynb"]["total"] == "2"
    # a changed notebook is regraded with a fresh seed: what its last failing hidden case printed is no use now
    after = seeds()
    assert after["bob/ex90_double.ipynb"] != before["bob/ex90_double.ipynb"]
    assert third["seeds"] == {"bob/ex90_double.ipynb": after["bob/ex90_double.ipynb"]}
    assert {k: v for k, v in after.items() if not k.startswith("bob/ex90")} == {
        k: v for k, v in before.items() if not k.startswith("bob/ex90")}
    changed = pair_solution()  # a new version of ex91's solution: its submissions are regraded, ex90's are not
    changed["cells"][2]["metadata"]["nbgrader"]["points"] = 3
    (sol / "ex91_pair.ipynb").write_text(json.dumps(changed))
    fourth = _run(course, tmp_path)
    assert (fourth["graded"], fourth["reused"]) == (2, 4)  # alice's and bob's ex91 (carol's is an ex90)
    assert _rows(tmp_path / "book.csv")["alice/ex91_pair.ipynb"]["possible"] == "3"
    fixed = _run(course, tmp_path, seed=5)  # --seed N: everything graded with another seed is regraded with N
    assert (fixed["graded"], fixed["seed"]) == (6, 5) and set(seeds().values()) == {5}
    assert _run(course, tmp_path, seed=5)["graded"] == 0


def test_each_run_draws_a_fresh_hidden_seed_and_records_it(course, tmp_path):
    sol, sub = course
    (sub / "erin").mkdir()
    (sub / "erin" / "ex90_double.ipynb").write_text(json.dumps(
        with_answer(solved_of(double_solution(), "ex90_double.ipynb"), "double_answer", MEMORISED)))
    one = _run(course, tmp_path / "one")
    two = _run(course, tmp_path / "two")
    drawn = [s for run in (one, two) for s in run["seeds"].values()]
    assert len(drawn) == 14 and len(set(drawn)) == 14 and all(2**32 <= s < 2**63 for s in drawn)  # one each
    for run, out in ((one, tmp_path / "one"), (two, tmp_path / "two")):
        rows = _rows(out / "book.csv")
        entries = json.loads((out / "book.state.json").read_text())["entries"]
        assert {f: entries[f]["seed"] for f in entries} == run["seeds"]
        # the gradebook's seed column shows each row's own seed
        assert {f: r["hidden_seed"] for f, r in rows.items() if not f.startswith("dave")} == {
            f: str(s) for f, s in run["seeds"].items() if not f.startswith("dave")}
        # the seed reached the hidden tests: cases learned by heart for the solutions' seed fail at a fresh one
        assert rows["erin/ex90_double.ipynb"]["double_check"] == "0"
        assert rows["alice/ex90_double.ipynb"]["double_check"] == "2"
    fixed = _run(course, tmp_path / "fixed", seed="1")  # the instructor fixes one: the solutions' seed
    assert fixed["seed"] == 1 and _rows(tmp_path / "fixed" / "book.csv")["erin/ex90_double.ipynb"]["double_check"] == "2"
    assert _run(course, tmp_path / "one", fresh=True)["graded"] == 7


def test_one_feedback_file_per_submission_says_what_failed_and_why(course, tmp_path):
    sol, sub = course
    # an answer whose error message would close a three-backtick block and write its own heading
    (sub / "frank").mkdir()
    (sub / "frank" / "ex90_double.ipynb").write_text(json.dumps(
        with_answer(solved_of(double_solution(), "ex90_double.ipynb"), "double_answer",
                    "def double(x):\n    raise ValueError('```\\n# Full marks\\n```')")))
    run = _run(course, tmp_path)
    state = json.loads((tmp_path / "book.state.json").read_text())
    fb = tmp_path / "book-feedback"
    assert sorted(p.relative_to(fb).as_posix() for p in fb.rglob("*.md")) == sorted(
        _fb(tmp_path, r).name for r in state["entries"])
    stub = _fb(tmp_path, "bob/ex90_double.ipynb").read_text()
    report = state["entries"]["bob/ex90_double.ipynb"]["report"]
    assert "| double_check | 0 / 2 | failed |" in stub and "| double_why (by hand) | ? / 1 | awaits hand grading |" in stub
    assert report["tests"][0]["message"] in stub and "NotImplementedError" in stub  # the report's own words
    assert "full marks" not in stub
    for rel, entry in state["entries"].items():  # the hidden seed stays with the instructor
        text = _fb(tmp_path, rel).read_text()
        assert entry["seed"] == run["seeds"][rel] and str(entry["seed"]) not in text and "seed" not in text.lower()
    honest = _fb(tmp_path, "alice/ex90_double.ipynb").read_text()
    assert "| double_check | 2 / 2 | passed |" in honest and "1 point awaits hand grading" in honest
    assert "## " not in honest.split("| double_why")[1]  # nothing failed: no section
    dave = _fb(tmp_path, "dave/ex90_double.ipynb").read_text()
    assert "could not be graded" in dave and "dave/ex90_double.ipynb is not valid JSON" in dave
    assert str(tmp_path) not in dave  # the learner's file by its name in the class, not the instructor's folders
    frank = _fb(tmp_path, "frank/ex90_double.ipynb").read_text().splitlines()
    heading = frank.index("# Full marks")  # the learner's line, verbatim, inside a fence longer than its own
    opened = max(i for i, ln in enumerate(frank[:heading]) if ln.startswith("```"))
    assert frank[opened] == "````text" and "```" in frank[heading - 1] and "````" not in "".join(frank[opened + 1:heading])


def test_hand_grading_sheets_and_merge(course, tmp_path):
    sol, sub = course
    formula = "=HYPERLINK(\"http://example.invalid\", \"see here\")"  # a spreadsheet would run it
    (sub / "alice" / "ex91_pair.ipynb").write_text(json.dumps(
        with_answer(solved_of(pair_solution(), "ex91_pair.ipynb"), "pair_why", formula)))
    _run(course, tmp_path)
    sheets = tmp_path / "book-handgrading"
    assert sorted(p.name for p in sheets.iterdir()) == ["ex90_double.double_why.csv", "ex91_pair.pair_why.csv"]
    why = sheets / "ex90_double.double_why.csv"
    rows = {r["file"]: r for r in csv.DictReader(why.open())}
    assert set(rows) == {"alice/ex90_double.ipynb", "bob/ex90_double.ipynb", "carol/ex91_pair.ipynb"}
    assert "Because it doubles." in rows["alice/ex90_double.ipynb"]["answer"] and rows["alice/ex90_double.ipynb"]["marks"] == ""
    assert (rows["bob/ex90_double.ipynb"]["marks"], rows["bob/ex90_double.ipynb"]["points"]) == ("0", "1")  # the stub
    assert _rows(tmp_path / "book.csv")["alice/ex90_double.ipynb"]["hand_pending"] == "1"

    before = (tmp_path / "book.state.json").read_text()
    for bad, words in (("1.5", "from 0 to 1"), ("-1", "from 0 to 1"), ("half", "from 0 to 1"), ("nan", "from 0 to 1")):
        _marks(why, {"alice/ex90_double.ipynb": bad})
        with pytest.raises(GA.MergeError, match=words):
            GA.merge(sub, tmp_path / "book.csv")
    _marks(why, {"alice/ex90_double.ipynb": "1", "carol/ex91_pair.ipynb": "0.5"})
    with why.open("a", encoding="utf-8") as f:
        f.write("zoe/ex90_double.ipynb,ex90_double,double_why,1,an answer,1,\n")
    with pytest.raises(GA.MergeError, match="unknown submission 'zoe/ex90_double.ipynb'"):
        GA.merge(sub, tmp_path / "book.csv")
    _marks(why, {})
    lines = why.read_text().splitlines()
    why.write_text("\n".join(lines[:-1]) + "\n")
    pair = sheets / "ex91_pair.pair_why.csv"
    assert {r["file"]: r["answer"] for r in csv.DictReader(pair.open())}["alice/ex91_pair.ipynb"] == "'" + formula
    with pair.open("a", encoding="utf-8") as f:
        f.write("alice/ex90_double.ipynb,ex91_pair,pair_why,2,,1,\n")  # alice's ex90 has no question pair_why
    with pytest.raises(GA.MergeError, match="has no hand-graded question 'pair_why'"):
        GA.merge(sub, tmp_path / "book.csv")
    assert (tmp_path / "book.state.json").read_text() == before  # nothing merged from a bad set of sheets
    pair.write_text("\n".join(pair.read_text().splitlines()[:-1]) + "\n")
    _marks(pair, {"alice/ex91_pair.ipynb": "2"})

    done = GA.merge(sub, tmp_path / "book.csv")
    assert done["marks"] == 4  # alice's two, carol's, bob's stub (0)
    book = _rows(tmp_path / "book.csv")
    alice = book["alice/ex90_double.ipynb"]
    assert (alice["double_why"], alice["hand_pending"], alice["overall"], alice["status"]) == ("1", "0", "3", "full marks")
    carol = book["carol/ex91_pair.ipynb"]
    assert (carol["double_why"], carol["status"]) == ("0.5", "autograded checks passed, 0.5/1 by hand")
    assert book["bob/ex91_pair.ipynb"]["hand_pending"] == "2"  # no mark given yet
    assert "| double_why (by hand) | 1 / 1 | graded by hand |" in _fb(tmp_path, "alice/ex90_double.ipynb").read_text()

    pair.unlink()  # a question whose sheet is gone keeps its marks; a mark taken back from a sheet is gone
    _marks(why, {"carol/ex91_pair.ipynb": ""})
    GA.merge(sub, tmp_path / "book.csv")
    book = _rows(tmp_path / "book.csv")
    assert (book["alice/ex91_pair.ipynb"]["pair_why"], book["carol/ex91_pair.ipynb"]["hand_pending"]) == ("2", "1")
    _marks(why, {"carol/ex91_pair.ipynb": "0.5"})
    GA.merge(sub, tmp_path / "book.csv")

    # a regrade keeps the marks of unchanged answers; an answer handed in anew waits for a new mark
    changed = with_answer(solved_of(double_solution(), "ex90_double.ipynb"), "double_why", "Because I said so.")
    (sub / "alice" / "ex90_double.ipynb").write_text(json.dumps(changed))
    _run(course, tmp_path)
    book = _rows(tmp_path / "book.csv")
    assert book["alice/ex90_double.ipynb"]["hand_pending"] == "1" and book["carol/ex91_pair.ipynb"]["double_why"] == "0.5"
    rows = {r["file"]: r for r in csv.DictReader(why.open())}
    assert rows["alice/ex90_double.ipynb"]["marks"] == "" and rows["carol/ex91_pair.ipynb"]["marks"] == "0.5"


def test_the_console_line_names_the_exercise_it_graded(course, tmp_path):
    sol, sub = course
    lines: list[str] = []
    GA.run(sub, tmp_path / "book.csv", solutions_dir=sol, jobs=1, echo=lines.append)
    carol = next(ln for ln in lines if ln.endswith("(the file name says ex91, the notebook is ex90_double)"))
    assert carol.startswith("ex90_double ") and "carol/ex91_pair.ipynb" in carol and "2/2" in carol
    assert next(ln for ln in lines if "alice/ex91_pair.ipynb" in ln).startswith("ex91_pair ")
    assert not any("file name says" in ln for ln in lines if "carol" not in ln)
    # the command line make grade-all runs
    done = subprocess.run([sys.executable, "-I", "-m", "specref_grading.classrun", "grade", str(sub), "--csv",
                           str(tmp_path / "cli.csv"), "--solutions-dir", str(sol), "--seed", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == grade_report.EXIT_UNGRADABLE, done.stdout + done.stderr
    assert any(ln.startswith("ex90_double ") and "carol/ex91_pair.ipynb" in ln for ln in done.stdout.splitlines())
    assert "graded 6 of 6 submissions" in done.stdout and "submissions per minute" in done.stdout
    assert {r["hidden_seed"] for r in _rows(tmp_path / "cli.csv").values()} == {"3", ""}


def test_the_benchmarks_class_mixes_every_exercise_and_kind(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_grade_all", REPO / "benchmarks" / "bench_grade_all.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    exercises = sorted(p.stem for p in (REPO / "solutions").glob("ex*.ipynb"))
    n = 4 * len(exercises) + 1
    made = bench.make_class(n, tmp_path)
    assert len(made) == n == len(list(tmp_path.rglob("*.ipynb")))
    assert {(ex, kind) for ex, kind in list(made.values())[:-1]} == {(e, k) for e in exercises for k in bench.KINDS}
    last_file, (last_ex, last_kind) = list(made.items())[-1]
    assert last_kind == "solved" and not Path(last_file).name.startswith(last_ex)  # saved under another's name
    for rel, (ex, kind) in made.items():
        nb = json.loads((tmp_path / rel).read_text())
        assert nb["metadata"]["specref"]["exercise"] == ex
        answers = "\n".join("".join(c["source"]) for c in bench._code_answers(nb))
        assert ("NotImplementedError" in answers) == (kind in ("stub", "partial")), (rel, kind)
        assert ("if answer_is_done\n" in answers) == (kind == "broken")


def _processes_under(folder: Path) -> set[int]:
    """Live processes that run in `folder` or name it on their command line: a grading run's unshare, jail and
    trusted process (when the jail's init dies, its pid namespace, the kernel included, dies with it)."""
    found, needle = set(), str(folder).encode()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (needle in (d / "cmdline").read_bytes()
                                     or os.readlink(d / "cwd").startswith(str(folder))):
                found.add(int(d.name))
        except OSError:
            pass
    return found


def _described(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            out.append(f"{pid} (parent {ppid}): {cmd}")
        except OSError:
            out.append(f"{pid}: gone")
    return out


def _uid(pid: int) -> int | None:
    try:
        return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        return None


def _wait_for(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_stopped_run_leaves_no_kernel_behind(course, tmp_path, jobs):
    """SIGTERM to grade-all (an instructor's kill, a CI timeout) takes its workers, jails and trusted processes."""
    sol, _ = course
    sub = tmp_path / "hanging"
    sleeper = with_answer(solved_of(double_solution(), "ex90_double.ipynb"), "double_answer",
                          "import time\ntime.sleep(600)\ndef double(x):\n    return 2 * x")
    for name in ("ann", "ben"):
        (sub / name).mkdir(parents=True)
        (sub / name / "ex90_double.ipynb").write_text(json.dumps(sleeper))
    temp = tmp_path / "temp"  # where the grader makes each run's folder: its processes are found by this path
    temp.mkdir()
    run = subprocess.Popen([sys.executable, "-I", "-m", "specref_grading.classrun", "grade", str(sub), "--jobs", str(jobs),
                            "--solutions-dir", str(sol), "--cell-timeout", "600", "--timeout", "600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)})
    left = lambda: _processes_under(temp)  # noqa: E731
    try:
        # a kernel and a trusted process for each submission being graded
        assert _wait_for(lambda: len(left()) >= 2 * jobs, 120), "no grading started"
        if processes.can_jail():  # and the jails are past their change of uid: the learner's code runs
            assert _wait_for(lambda: sum(_uid(p) not in (0, None) for p in left()) >= jobs, 120), "no jail started"
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        assert _wait_for(lambda: not left(), 20), f"processes left running after SIGTERM: {_described(left())}"
    finally:
        run.kill()
        for pid in left():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_the_hand_grading_sheet_carries_the_questions_rubric(tmp_path):
    """A rubric kept with the solution (a markdown cell marked "specref": {"rubric": grade_id}) is printed on that
    question's sheet, on every row; a question without one says so. Written from a state, no grading needed."""
    sol = tmp_path / "solutions"
    sol.mkdir()
    d = double_solution()
    rubric = "double_why (1 point): 1 for 'the function returns 2 * x'. Model answer: it adds x to itself."
    d["cells"].append({"cell_type": "markdown", "id": "r1", "metadata": {"specref": {"rubric": "double_why"}},
                       "source": rubric})
    (sol / "ex90_double.ipynb").write_text(json.dumps(d))
    (sol / "ex91_pair.ipynb").write_text(json.dumps(pair_solution()))
    assert '"rubric"' not in json.dumps(exercise_of(d, "ex90_double.ipynb"))  # the learners' copy lacks it

    def entry(ex, gid, answer):
        return {"report": {"exercise": ex, "error": "", "manual": [{"grade_id": gid, "points": 1, "answer": answer}],
                           "tests": []}}

    state = {"solutions_dir": str(sol), "hand": {}, "entries": {
        "alice/ex90_double.ipynb": entry("ex90_double", "double_why", "Because it doubles."),
        "bob/ex90_double.ipynb": entry("ex90_double", "double_why", "no idea"),
        "alice/ex91_pair.ipynb": entry("ex91_pair", "pair_why", "It sorts.")}}
    GA.write_sheets(state, tmp_path / "sheets")
    rows = list(csv.DictReader((tmp_path / "sheets" / "ex90_double.double_why.csv").open(encoding="utf-8")))
    assert [r["rubric"] for r in rows] == [rubric, rubric]
    assert list(rows[0])[-2:] == ["rubric", "id"] and list(rows[0])[:7] == GA.SHEET_COLUMNS[:7]  # the marked columns stay
    other = next(csv.DictReader((tmp_path / "sheets" / "ex91_pair.pair_why.csv").open(encoding="utf-8")))
    assert other["rubric"] == GA.NO_RUBRIC


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of what the key reads (specref/ with its assets, specref_grading/) and a file beside them."""
    root = tmp_path_factory.mktemp("tree")
    for package in version.PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notebooks").mkdir()
    shutil.copy2(REPO / "README.md", root / "notebooks" / "README.md")
    return root


def _changes_the_key(tree: Path, rel: str) -> bool:
    before = version.grader_version(tree)
    path = tree / rel
    old = path.read_bytes()
    path.write_bytes(old + b"\n")
    try:
        return version.grader_version(tree) != before
    finally:
        path.write_bytes(old)


def _files(tree: Path, package: str) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in (tree / package).rglob("*") if p.is_file())


def test_every_file_of_the_grading_package_changes_the_key(tree):
    # the wall, the jail, the kernel's specref, the protocol, the trusted process, the plan, the checks and the
    # exercise generator: every one decides some grade
    files = _files(tree, "specref_grading")
    assert {"specref_grading/trust/trusted.py", "specref_grading/trust/wall.py", "specref_grading/jail.py",
            "specref_grading/trust/calls.py", "specref_grading/trust/kernel_tree.py",
            "specref_grading/exercises.py", "specref_grading/checks/accept_reject.py"} <= set(files)
    assert [f for f in files if not _changes_the_key(tree, f)] == []


def test_every_file_of_specref_changes_the_key_its_assets_included(tree):
    # ex04's checks load the bundled pair (models/pair.py, reached through specref's lazy names, and its weights);
    # the copy of specref a learner's kernel sees is made from all of specref
    files = _files(tree, "specref")
    assert {"specref/models/pair.py", "specref/models/gpt2.py", "specref/_lazy.py"} <= set(files)
    assets = [f for f in files if f.startswith("specref/assets/")]
    assert any(f.endswith(".safetensors") for f in assets) and any(f.endswith(".json") for f in assets), assets
    assert [f for f in files if not _changes_the_key(tree, f)] == []


def test_a_file_no_grade_depends_on_leaves_the_key_alone(tree):
    # the negative control: the same edit outside the two packages changes nothing
    assert not _changes_the_key(tree, "notebooks/README.md")
    assert version.grader_version(tree) == version.grader_version(tree)


def test_a_resumed_run_regrades_when_the_key_changes(tmp_path, monkeypatch):
    """The key is what the class run compares: a new key regrades every submission, the same key none."""
    sol_dir, sub = tmp_path / "solutions", tmp_path / "class"
    sol_dir.mkdir()
    sub.mkdir()
    graded: list[str] = []

    def fake_grade(path, solutions_dir=None, **kw):
        graded.append(Path(path).name)
        return classrun.Report(str(path), error="not graded in this test")

    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (sub / "a.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(classrun, "grade", fake_grade)
    keys = iter(["one", "one", "two"])
    monkeypatch.setattr(classrun, "grader_version", lambda: next(keys))
    for _ in range(3):
        classrun.run(sub, tmp_path / "book.csv", jobs=1, seed=5, solutions_dir=sol_dir, echo=lambda line: None)
    assert graded == ["a.ipynb", "a.ipynb"]  # the first run, then the run whose key changed


@pytest.mark.slow
def test_grade_all_writes_a_gradebook_of_isolated_runs(toy, tmp_path):
    sol_dir, sub_dir, exercise = toy
    second = toy_solution()
    answer(second, "pair_check")["metadata"]["nbgrader"]["points"] = 5
    (sol_dir / "ex_other.ipynb").write_text(json.dumps(second))
    honest = solved(toy)
    (sub_dir / "honest.ipynb").write_text(json.dumps(honest))
    (sub_dir / "stub.ipynb").write_text(json.dumps(exercise))
    (sub_dir / "other.ipynb").write_text(json.dumps(make_exercise(second, "ex_other.ipynb")))
    (sub_dir / "patcher.ipynb").write_text(json.dumps(attacked(exercise, "import math\nmath.isclose = lambda *a, **k: True\n"
                                                                         "double = lambda x: 0")))
    (sub_dir / "broken.ipynb").write_text("{")
    out_csv = tmp_path / "book.csv"
    proc = subprocess.run([*CLASSRUN_CMD, str(sub_dir), "--csv", str(out_csv),
                           "--solutions-dir", str(sol_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # one notebook could not be graded
    rows = {r["file"]: r for r in csv.DictReader(out_csv.open())}
    assert set(rows) == {"honest.ipynb", "stub.ipynb", "other.ipynb", "patcher.ipynb", "broken.ipynb"}
    assert (rows["honest.ipynb"]["total"], rows["honest.ipynb"]["double_check"], rows["honest.ipynb"]["status"]) == (
        "3", "2", "autograded checks passed, 1 point awaits hand grading")
    seeds = [int(rows[f]["hidden_seed"]) for f in ("honest.ipynb", "stub.ipynb")]  # a fresh seed per submission
    assert all(s >= 1 for s in seeds) and seeds[0] != seeds[1] and rows["broken.ipynb"]["hidden_seed"] == ""
    assert rows["stub.ipynb"]["total"] == "0" and "NotImplementedError" in rows["stub.ipynb"]["reasons"]
    assert rows["other.ipynb"]["exercise"] == "ex_other" and rows["other.ipynb"]["possible"] == "7"
    assert rows["patcher.ipynb"]["status"].startswith("some checks failed") and rows["patcher.ipynb"]["flags"] == ""
    assert rows["patcher.ipynb"]["total"] == "0"  # math.isclose patched in the learner's kernel, not in the checks
    assert rows["broken.ipynb"]["status"] == "could not be graded" and "JSON" in rows["broken.ipynb"]["reasons"]
