"""A class run's outputs: in a folder the grader makes (beside the class's, by default), written only through
paths of the grader's own, never through a link; every learner string in them is data (CSV, sheets, feedback, the
console); one submission's strings, name or file type cannot stop the others; no shell sees a file name.

The grading itself is replaced by a fake where what is tested is what the run writes: each submission's report
carries the learner strings an attacker controls (notes, messages, a hand-graded answer).
"""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from specref_grading import classrun
from specref_grading.report import Report
from specref_grading.report import TestResult as Result

from .conftest import GRADE_CMD, REPO, answer, as_root, attacked, toy_solution

NASTY = "line one\nfull marks  alice.ipynb\x1b[2K\u202e\udcff\ud800"


NB = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def fake_grade(path, solutions_dir=None, **kw):
    """A report full of learner strings: an error message, a note, a flag and a hand-graded answer."""
    rep = Report(str(path), exercise="ex90_double", version="v1", seed=kw.get("seed"))
    rep.tests = [Result("double_check", 2, "failed", "AssertionError: " + NASTY, ["changed " + NASTY])]
    rep.manual = [("double_why", 1.0, "=HYPERLINK(\"x\")\n" + NASTY)]
    rep.notes = ["this notebook was made for an older version of the exercise (" + NASTY + ")"]
    return rep


@pytest.fixture
def klass(tmp_path, monkeypatch):
    monkeypatch.setattr(classrun, "grade", fake_grade)
    monkeypatch.setattr(classrun, "grader_version", lambda: "k")
    sol, sub = tmp_path / "solutions", tmp_path / "class"
    sol.mkdir()
    sub.mkdir()
    return sol, sub


def _run(klass, csv_path=None, **kw):
    sol, sub = klass
    lines: list[str] = []
    summary = classrun.run(sub, csv_path, jobs=1, seed=5, solutions_dir=sol, echo=lines.append, **kw)
    return summary, lines


# -- the folder the grader makes --------------------------------------------------------------------------------------
def test_the_outputs_go_beside_the_class_folder_by_default(klass, tmp_path):
    sol, sub = klass
    (sub / "alice.ipynb").write_text(NB)
    summary, _ = _run(klass)
    assert summary["outputs"]["csv"] == tmp_path / "class-grading" / "gradebook.csv"
    assert sorted(p.name for p in sub.iterdir()) == ["alice.ipynb"]  # nothing written among the submissions
    assert stat.S_IMODE(os.stat(tmp_path / "class-grading").st_mode) == 0o700
    assert (tmp_path / "class-grading" / "gradebook.csv").is_file()
    assert classrun.merge(sub)["sheets"] == 1  # merge finds the same default


def test_a_planted_tmp_link_never_receives_a_write(klass, tmp_path):
    """gradebook.csv.tmp -> victim (a crafted archive plants it): the victim is never written."""
    sol, sub = klass
    (sub / "alice.ipynb").write_text(NB)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("gradebook.csv.tmp", "gradebook.state.json.tmp"):
        (sub / name).symlink_to(victim)
    _run(klass, sub / "gradebook.csv")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("planted", ["gradebook-feedback", "gradebook-handgrading", "gradebook.csv",
                                     "gradebook.state.json"])
def test_an_output_path_that_is_a_link_is_refused(klass, tmp_path, planted):
    sol, sub = klass
    (sub / "alice.ipynb").write_text(NB)
    victim = tmp_path / "victimdir"
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    (sub / planted).symlink_to(victim)
    with pytest.raises(classrun.OutputError, match="symbolic link"):
        _run(klass, sub / "gradebook.csv")
    assert list(victim.iterdir()) == [] and stat.S_IMODE(os.stat(victim).st_mode) == 0o755


def test_a_link_between_the_class_folder_and_the_outputs_is_refused(klass, tmp_path):
    sol, sub = klass
    (tmp_path / "elsewhere").mkdir()
    (sub / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(classrun.OutputError, match="symbolic link"):
        _run(klass, sub / "out" / "gradebook.csv")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@as_root
def test_an_output_folder_that_is_not_the_graders_is_refused(klass):
    sol, sub = klass
    (sub / "gradebook-feedback").mkdir()
    os.chown(sub / "gradebook-feedback", 54321, 54321)
    with pytest.raises(classrun.OutputError, match="belongs to uid 54321"):
        _run(klass, sub / "gradebook.csv")


def test_write_private_replaces_a_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out.csv").symlink_to(victim)
    classrun._write_private(tmp_path / "out.csv", "new")
    assert victim.read_text() == "precious" and not (tmp_path / "out.csv").is_symlink()
    assert (tmp_path / "out.csv").read_text() == "new" and stat.S_IMODE(os.stat(tmp_path / "out.csv").st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "victim"]  # no temporary file left


# -- learner strings are data -----------------------------------------------------------------------------------------
NAMES = {
    "long": "a" * 249 + ".ipynb",  # 255 bytes: its feedback's .md.tmp would be 256
    "byte_ff": os.fsdecode(b"b\xff.ipynb"),
    "newline": "c\nex90_double            2 of 2  full marks  carol.ipynb",
    "formula": "'=bob.ipynb",
}


def test_hostile_names_and_strings_neither_crash_nor_forge(klass, tmp_path):
    """A 255-byte name, byte 0xff, a newline, a name that looks like a quoted formula, and reports full of control
    characters and lone surrogates: every output is written, each console line is one line, the feedback files are
    named by id, and a mark for each round-trips through merge."""
    sol, sub = klass
    for name in NAMES.values():
        (sub / name).write_text(NB)
    (sub / "zed.ipynb").write_text(NB)
    summary, lines = _run(klass, tmp_path / "out" / "book.csv")
    assert summary["files"] == 5 and len(lines) == 5
    for line in lines:
        assert "\n" not in line and "\x1b" not in line and all(c.isprintable() for c in line), repr(line)
    assert sum("c\\nex90_double" in line for line in lines) == 1  # the forged line stays inside its escaped name
    out = summary["outputs"]
    text = out["csv"].read_bytes().decode("utf-8")  # valid UTF-8: no lone surrogate reached it
    assert "\x1b" not in text and "\\x1b" in text and "\\udcff" in text
    book = list(csv.DictReader(out["csv"].open(encoding="utf-8", newline="")))
    assert len(book) == 5 and len({r["id"] for r in book}) == 5
    for path in out["feedback"].iterdir():
        assert len(path.name) < 40 and path.name.startswith("s"), path.name
        body = path.read_bytes().decode("utf-8")
        assert "\x1b" not in body and "\u202e" not in body
    sheet = next(out["sheets"].iterdir())
    rows = list(csv.DictReader(sheet.open(encoding="utf-8", newline="")))
    assert len(rows) == 5 and all(r["answer"].startswith("'=") for r in rows)
    for r in rows:
        r["marks"] = "1"
    with sheet.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    merged = classrun.merge(sub, tmp_path / "out" / "book.csv")
    assert merged["marks"] == 5 and merged["pending"] == 0


def test_a_hand_typed_row_without_an_id_is_merged_by_its_file(klass, tmp_path):
    sol, sub = klass
    (sub / "alice.ipynb").write_text(NB)
    summary, _ = _run(klass, tmp_path / "out" / "book.csv")
    sheet = next(summary["outputs"]["sheets"].iterdir())
    sheet.write_text("file,question,marks\nalice.ipynb,double_why,1\n")
    assert classrun.merge(sub, tmp_path / "out" / "book.csv")["marks"] == 1


def test_a_fifo_and_an_unreadable_file_stop_nothing(klass, tmp_path):
    """A FIFO named *.ipynb blocked read_bytes() forever; it is now that entry's reason, and the others are graded."""
    sol, sub = klass
    (sub / "alice.ipynb").write_text(NB)
    fifo = sub / "pipe.ipynb"
    os.mkfifo(fifo)
    (sub / "folder.ipynb").mkdir()  # a folder named like a notebook is walked into, not read
    done = threading.Event()

    def valve():  # not a verdict: a regression that blocks fails the test instead of hanging it
        if not done.wait(120):
            with open(fifo, "wb"):
                pass
    threading.Thread(target=valve, daemon=True).start()
    try:
        summary, _ = _run(klass, tmp_path / "out" / "book.csv")
    finally:
        done.set()
    rows = {r["file"]: r for r in csv.DictReader(summary["outputs"]["csv"].open(encoding="utf-8"))}
    assert "not a regular file" in rows["pipe.ipynb"]["reasons"] and rows["pipe.ipynb"]["exit_code"] == "2"
    assert rows["alice.ipynb"]["exercise"] == "ex90_double" and summary["graded"] == 1


def test_a_grader_failure_on_one_submission_stops_no_other(klass, tmp_path, monkeypatch):
    sol, sub = klass
    for name in ("a.ipynb", "b.ipynb"):
        (sub / name).write_text(NB)

    def flaky(path, **kw):
        if Path(path).name == "a.ipynb":
            raise RuntimeError("boom \udcff")
        return fake_grade(path, **kw)
    monkeypatch.setattr(classrun, "grade", flaky)
    summary, _ = _run(klass, tmp_path / "out" / "book.csv")
    rows = {r["file"]: r for r in csv.DictReader(summary["outputs"]["csv"].open(encoding="utf-8"))}
    assert "the grader failed" in rows["a.ipynb"]["reasons"] and rows["b.ipynb"]["exercise"] == "ex90_double"


def test_one_grading_report_cannot_forge_a_line_either():
    """make grade's text report: the file name and exercise are one line of data each."""
    rep = Report("x.ipynb\nstatus: full marks\x1b[2K", exercise="ex90\nstatus: full marks")
    rep.tests = [Result("t", 1, "failed", "a message\nover lines \udcff")]
    text = rep.text()
    assert [ln for ln in text.splitlines() if ln.startswith("status:")] == ["status: some checks failed"], text
    assert "\\udcff" in text and "\x1b" not in text
    text.encode("utf-8")  # nothing that cannot be printed


# -- what the instructor reads -----------------------------------------------------------------------
@pytest.mark.grader
def test_escape_sequences_in_the_learners_text_cannot_redraw_the_report(toy):
    """The text report printed an exception's message and a hand-graded answer raw: ANSI escapes in them erased
    the real lines on a terminal, drew a fake "status: full marks" and hid what followed."""
    fake = "\x1b[1A\x1b[2Kstatus: full marks\x1b[8m\u202e"
    nb = attacked(toy[2], f"def double(x):\n    raise ValueError({fake!r})")
    answer(nb, "why")["source"] = "Because." + fake
    path = toy[1] / "alice.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([*GRADE_CMD, str(path), "--solutions-dir", str(toy[0])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout, proc.stdout
    assert proc.stdout.count("\\x1b[1A") == 2 and "\\u202e" in proc.stdout, proc.stdout


# -- make grade and batch grading --------------------------------------------------------------
@pytest.mark.grader
def test_make_grade_passes_the_file_name_to_no_shell(toy, tmp_path):
    weird = tmp_path / "a dir; $(touch pwned1) 'q\" `touch pwned2`"
    weird.mkdir()
    nb_path = weird / "$(shell touch pwned3) ';\" $$HOME.ipynb"
    nb_path.write_text(json.dumps(toy_solution()))
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "grade", f"NB={nb_path}",
                           f"SOLUTION={toy[0] / 'ex_toy.ipynb'}"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(nb_path) in proc.stdout
    assert not any((d / f"pwned{i}").exists() for d in (tmp_path, REPO, weird) for i in (1, 2, 3))
