"""A class's release folder (specref_grading/release.py) and the README a learner and an instructor follow.

The release is built once from this checkout (a second or so: no notebook runs) and searched for every
solution's answer text, hidden tests, rubrics and summaries, as the learners would find them: inside the
notebooks' cells, not in their JSON escapes. The README is held to what the notebooks are: the reading
minutes to tools/upkeep/reading_times.py, the list of notebooks that time things to the timing calls their
code makes, and its learner path to no development history.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from specref_grading import release
from specref_grading.exercises import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    END_HIDDEN,
    END_SOLUTION,
    expected_files,
    is_solution_only,
    notebooks_in,
    rubric_for,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "upkeep"))
import learner_text  # noqa: E402
import reading_times  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("class") / "release"
    done = release.build(folder)
    assert done["folder"] == folder.resolve() and done["files"] > 0
    return folder


# -- what a learner must not get --------------------------------------------------------------------------------
def _normal(text: str) -> str:
    """Lines stripped of indentation, blank ones dropped: a snippet matches wherever it sits."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    parts = ["".join(src) if isinstance(src, list) else src]
    for out in cell.get("outputs", []):
        text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def readable(folder: Path) -> dict[str, str]:
    """{file: what a person reads in it}: a notebook's cells (sources and printed outputs), another file's text."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix in (".safetensors", ".png", ".pyc"):
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        if path.suffix == ".ipynb":
            text = "\n".join(_cell_text(c) for c in json.loads(text)["cells"])
        out[path.relative_to(folder).as_posix()] = _normal(text)
    return out


def _regions(source: str, begin: str, end: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"{re.escape(begin)}\n(.*?)\n[ \t]*{re.escape(end)}", source, re.S)]


def secrets(solution: Path) -> list[tuple[str, str]]:
    """(what, text) of everything in a solution a learner must not receive: each answer region, each hidden test
    block, each rubric and each solution_only cell. Regions of fewer than 40 characters (`return p`) are too
    common to search for."""
    nb = json.loads(solution.read_text(encoding="utf-8"))
    found = []
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if rubric_for(cell) is not None or is_solution_only(cell):
            found.append((f"{solution.name} cell {i}: a rubric or solution_only cell", src))
            continue
        found += [(f"{solution.name} cell {i}: an answer", r) for r in _regions(src, BEGIN_SOLUTION, END_SOLUTION)]
        found += [(f"{solution.name} cell {i}: hidden tests", r) for r in _regions(src, BEGIN_HIDDEN, END_HIDDEN)]
    return [(what, _normal(text)) for what, text in found if len(_normal(text)) >= 40]


SOLUTIONS = notebooks_in(REPO / "solutions")


def test_the_secrets_are_found_where_they_are():
    """Negative control: every secret is found in the text of its own solution, read as the release is read; so
    a secret copied into a release would be found there too."""
    corpus = readable(REPO / "solutions")
    everything = [s for path in SOLUTIONS for s in secrets(path)]
    assert len(everything) >= 2 * len(SOLUTIONS)  # answers and hidden tests in every exercise
    missing = [what for path in SOLUTIONS for what, text in secrets(path) if text not in corpus[path.name]]
    assert not missing, missing


def test_the_release_holds_no_answer_hidden_test_rubric_or_summary(built):
    corpus = readable(built)
    leaks = [f"{what} is in {name}" for path in SOLUTIONS for what, text in secrets(path)
             for name, body in corpus.items() if text in body]
    assert not leaks, "\n".join(leaks)


def test_the_release_has_what_a_learner_needs_and_no_grader(built):
    top = {p.name for p in built.iterdir()}
    assert top == {"README.md", "RELEASE.md", "Makefile", "pyproject.toml", "environment.yml", "requirements", "docs",
                   "tools", "specref", "notebooks", "exercises"}
    for gone in ("solutions", "specref_grading", "tests", "benchmarks", ".git", ".venv"):
        assert not (built / gone).exists(), gone
    assert sorted(p.name for p in (built / "notebooks").glob("*.ipynb")) == \
        sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert (built / "specref" / "assets" / "target" / "model.safetensors").is_file()
    assert (built / "tools" / "upkeep" / "probe_index.py").is_file()  # the Makefile's set-up calls it
    assert not list(built.rglob("__pycache__")) and not list(built.rglob("*.pyc"))
    assert release.problems_in(built) == []


def test_no_solution_marker_rubric_or_solution_only_cell_anywhere(built):
    for path in (p for p in built.rglob("*") if p.is_file() and p.suffix not in (".safetensors", ".png")):
        text = path.read_bytes().decode("utf-8", errors="replace")
        assert BEGIN_SOLUTION not in text and "BEGIN HIDDEN TESTS" not in text, path
        if path.suffix == ".ipynb":
            for cell in json.loads(text)["cells"]:
                assert rubric_for(cell) is None and not is_solution_only(cell), path


def test_the_released_exercises_are_the_generated_ones(built):
    """The generated exercises, each checks cell rewritten into stand-ins (nothing else changes)."""
    want = expected_files(REPO / "solutions")
    have = {p.name: p.read_bytes() for p in (built / "exercises").glob("*.ipynb")}
    assert have == {name: release.offline_checks(data) for name, data in want.items()}
    for name, data in have.items():
        generated = json.loads(want[name])["cells"]
        for old, new in zip(generated, json.loads(data)["cells"], strict=True):
            if (old.get("metadata", {}).get("specref") or {}).get("side") == "checks":
                assert "specref_grading" not in "".join(new["source"]), name
                assert "_graded_by_your_instructor" in "".join(new["source"]), name
            else:
                assert old == new, name


def test_a_rewritten_checks_cell_defines_the_same_checks_that_only_say_so(capsys):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from specref_grading.checks.x import (HIDDEN, check_a,\n    check_b as check_c)",
        metadata={"specref": {"side": "checks"}})])
    cell = json.loads(release.offline_checks(nbformat.writes(nb).encode()))["cells"][0]
    space: dict = {}
    exec("".join(cell["source"]), space)  # noqa: S102 - the cell the release writes
    assert space["check_a"](1, seed=2) is None and space["check_c"]() is None and "HIDDEN" not in space
    assert capsys.readouterr().out.splitlines() == [f"check_a: {release.OFFLINE_NOTE}", f"check_c: {release.OFFLINE_NOTE}"]
    nb.cells[0].source = "from specref_grading.checks.x import check_a\nprint(check_a)"  # not only imports
    with pytest.raises(release.ReleaseError, match="only imports"):
        release.offline_checks(nbformat.writes(nb).encode())
    plain = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])).encode()
    assert release.offline_checks(plain) == plain  # no checks cell: unchanged


# -- a learner works through every released exercise ------------------------------------------------------------
# What a cell of a released exercise may raise: an unanswered task's stub (or what it leaves undone: a name an earlier
# cell that raised would have bound). Never a name, module or import the class folder lacks.
STUB_ERRORS = ("NotImplementedError",)
CELL_TIMEOUT = 30


def _run(nb, folder: Path, env: dict) -> tuple[list[str], bool]:
    """Execute `nb` in one kernel (cwd `folder`, environment `env`), every cell whatever the errors; (the errors a
    learner must never meet, as "cell N: Name: message"; whether a stand-in check printed its line)."""
    from nbclient import NotebookClient

    from specref_grading.scan import names_bound
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute(env=env)
    bad, said = [], False
    unset: set[str] = set()  # what the cells that raised would have bound: a later cell may miss it
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and release.OFFLINE_NOTE in out.get("text", ""):
                said = True
            if out.get("output_type") != "error":
                continue
            ename, evalue = out["ename"], out["evalue"]
            m = re.fullmatch(r"name '(\w+)' is not defined", evalue) if ename == "NameError" else None
            if not (ename in STUB_ERRORS or (m and m.group(1) in unset)):
                bad.append(f"cell {i}: {ename}: {evalue}")
            unset |= names_bound(cell.source)  # and what its stubs say they leave to write or set:
            for named in re.findall(r'NotImplementedError\("Task \d+: (?:write|set) (.+?) \(see', cell.source):
                unset |= set(re.split(r", | and ", named))
    return bad, said


def _release_env(built: Path) -> dict:
    import os
    return {**os.environ, "PYTHONPATH": str(built), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_every_released_exercise_runs_top_to_bottom(built):
    """Each released exercise, every cell in order, in one kernel that imports the release's specref (not this
    checkout's). The only errors are the stubs' own NotImplementedError, or a NameError of a name that an earlier
    cell, which raised, would have bound (or its stub names): never a name the release lacks, an ImportError or a ModuleNotFoundError.
    Each exercise's stand-in checks print their line."""
    bad = []
    for path in sorted((built / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(  # cell numbers below count this one: cell N is N - 1 here
            f"import specref\nassert specref.__file__.startswith({str(built)!r}), specref.__file__"))
        found, said = _run(nb, path.parent, _release_env(built))
        bad += [f"{path.name} (+1) {line}" for line in found]
        assert said, f"{path.name}: no stand-in check printed {release.OFFLINE_NOTE!r}"
    assert not bad, "\n".join(bad)


def test_the_run_flags_what_a_release_lacks(built):
    """Negative control of the test above: a name nothing bound, a module the release lacks and an import from the
    grader are flagged; a stub's NotImplementedError and the NameError it leaves behind are not."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print(MACHINES)"),
        nbformat.v4.new_code_cell("import specref.not_in_the_release"),
        nbformat.v4.new_code_cell("from specref.perf.machine import SERVER_ROWS"),
        nbformat.v4.new_code_cell('rows = 1\nraise NotImplementedError("Task 1: write f (see the task above)")'),
        nbformat.v4.new_code_cell("print(rows)")])
    bad, said = _run(nb, built / "exercises", _release_env(built))
    assert [line.split(":")[:2] for line in bad] == [["cell 0", " NameError"], ["cell 1", " ModuleNotFoundError"],
                                                     ["cell 2", " ImportError"]] and not said


def test_a_release_that_would_leak_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    """Negative control of the read-back: a notebook holding a rubric cell and a solution region in what would be
    released is refused, and neither the folder nor its staging copy remains."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("model answer", metadata={"specref": {"rubric": "q"}}),
        nbformat.v4.new_code_cell(f"x = 1\n{BEGIN_SOLUTION}\nx = 2\n{END_SOLUTION}")])
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "leak.ipynb").write_text(nbformat.writes(nb))
    problems = release.problems_in(fake)
    assert any("rubric or solution_only" in p for p in problems) and any(BEGIN_SOLUTION in p for p in problems)
    real = release.contents

    def leaky(*args, **kwargs):
        files = real(*args, **kwargs)
        files["notebooks/leak.ipynb"] = (fake / "leak.ipynb").read_bytes()
        return files

    monkeypatch.setattr(release, "contents", leaky)
    target = tmp_path / "out"
    with pytest.raises(release.ReleaseError, match="must not get"):
        release.build(target)
    assert not target.exists() and not list(tmp_path.glob(".out.release-tmp*"))


def test_refuses_a_non_empty_folder_and_one_inside_the_repository(tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    with pytest.raises(release.ReleaseError, match="not empty"):
        release.build(full)
    assert [p.name for p in full.iterdir()] == ["notes.txt"]
    for inside in (REPO, REPO / "class-release", REPO / "notebooks" / "x"):
        with pytest.raises(release.ReleaseError, match="inside the repository"):
            release.check_target(inside)
    assert not (REPO / "class-release").exists()
    assert release.main([str(full)]) == 2 and "release refused" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert release.check_target(empty) == empty.resolve()  # an empty folder is fine


# -- answer keys: a release says which exercises it is graded for ------------------------------------------------


def test_a_release_for_no_graded_exercise_says_every_exercise_is_practice_only(built):
    """The default release ships the whole package, every exercise's reference answer with it: RELEASE.md says so,
    exercise by exercise, naming where each key lies."""
    text = (built / "RELEASE.md").read_text(encoding="utf-8")
    keys = release.answer_keys()
    assert list(keys) == [p.stem for p in SOLUTIONS] and all(keys.values())
    assert "**Practice only:** " + ", ".join(keys) in text and "Graded from this release" not in text
    for exercise, names in keys.items():
        assert f"- {exercise}: {', '.join(names)}" in text
    assert "specref.rejection" in keys["ex02_accept_reject"] and "specref.drafts.prompt_lookup" in keys["ex05_prompt_lookup"]
    assert (built / "specref" / "rejection.py").is_file()  # practice only: the key ships, and the notice says so


@pytest.fixture(scope="module")
def graded_ex05(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("class") / "graded"
    return folder, release.build(folder, graded=("ex05",))


def test_a_release_graded_for_an_exercise_holds_none_of_its_answer_key(graded_ex05):
    folder, done = graded_ex05
    keys = release.answer_keys()["ex05_prompt_lookup"]
    assert done["graded"] == ("ex05_prompt_lookup",) and "ex05_prompt_lookup" not in done["practice"]
    assert not (folder / "specref" / "drafts" / "prompt_lookup.py").exists()
    assert not (folder / "specref" / "perf" / "intervals.py").exists()
    assert release.keys_present(folder / "specref", keys) == []
    assert release.keys_present(release.ROOT / "specref", keys) == list(keys)  # the read-back finds them where they are
    assert (folder / "specref" / "assets" / "target" / "model.safetensors").is_file()  # the data ships all the same
    assert release.problems_in(folder) == []
    text = (folder / "RELEASE.md").read_text(encoding="utf-8")
    assert "**Graded from this release:** ex05_prompt_lookup." in text
    assert "**Practice only:** " + ", ".join(done["practice"]) in text and len(done["practice"]) == 7
    # what needs a removed key is named, a cell at a time; the graded exercise's own cells all run
    assert "notebooks/05_choosing_a_draft.ipynb" in done["not_running"]
    assert not any(rel.startswith("exercises/ex05") for rel in done["not_running"])
    assert "- notebooks/05_choosing_a_draft.ipynb cell " in text and "specref.PromptLookupDraft" in text


def test_the_released_package_imports_without_the_key(graded_ex05):
    folder, _ = graded_ex05
    code = ("import specref\n"
            f"assert specref.__file__.startswith({str(folder)!r}), specref.__file__\n"
            "from specref import generate, load_pair\n"
            "from specref.decoding.record import RecordedStep\n"
            "for name in ('PromptLookupDraft', 'lookup'):\n"
            "    try:\n"
            "        exec(f'from specref import {name}')\n"
            "    except ImportError:\n"
            "        print('absent', name)\n"
            "try:\n"
            "    from specref.decoding.positions import acceptance_by_position\n"
            "except ImportError:\n"
            "    print('absent acceptance_by_position')\n")
    # Without this checkout's editable-install finder, which would find a module the release lacks here: a class
    # installs the release itself.
    hide = "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable')]\n"
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(folder)!r})\n" + hide + code],
                         capture_output=True, text=True, timeout=300, cwd=folder)
    assert run.returncode == 0, run.stderr
    assert "absent PromptLookupDraft" in run.stdout and "absent acceptance_by_position" in run.stdout


def test_ex02_graded_leaves_out_its_residual_under_every_name(tmp_path):
    """ex02's key is the accept/reject rule wherever it lies: specref.rejection, and ex08's samplers (their private
    `_residual`) and the lectures' views, which compute the same answer under other names."""
    keys = release.answer_keys()
    selection = release.strip_keys(("ex02_accept_reject",), keys, tmp_path)
    package = tmp_path / "specref"
    assert not (package / "rejection.py").exists() and not (package / "checks" / "samplers.py").exists()
    assert release.keys_present(package, keys["ex02_accept_reject"]) == []
    assert not selection.available("specref.checks.samplers._residual")
    assert selection.available("specref.checks.rng.exact_distribution")  # ex02's own setup still runs


def test_a_release_that_would_hold_a_graded_key_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    """Negative control of the read-back: a package copy that kept a graded exercise's key is found and refused."""
    real = release.strip_keys

    def keeps_everything(graded, keys, into, root=release.ROOT):
        selection = real(graded, keys, into, root)
        shutil.copyfile(root / "specref" / "drafts" / "prompt_lookup.py", into / "specref" / "drafts" / "prompt_lookup.py")
        return selection

    monkeypatch.setattr(release, "strip_keys", keeps_everything)
    target = tmp_path / "out"
    with pytest.raises(release.ReleaseError, match="specref.drafts.prompt_lookup, the answer key of an exercise graded"):
        release.build(target, graded=("ex05_prompt_lookup",))
    assert not target.exists() and not list(tmp_path.glob(".out.release-tmp*"))


def test_graded_names_an_exercise_or_the_release_is_refused(tmp_path, capsys):
    names = list(release.answer_keys())
    assert release.resolve_graded(["ex05", "ex02_accept_reject", " "], names) == ("ex02_accept_reject",
                                                                                   "ex05_prompt_lookup")
    for bad in ("ex09", "ex0", "prompt_lookup"):
        with pytest.raises(release.ReleaseError, match="no such exercise"):
            release.resolve_graded([bad], names)
    assert release.main([str(tmp_path / "out"), "--graded", "ex09"]) == 2 and "no such exercise" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_command_says_which_exercises_are_graded_and_which_practice_only(tmp_path, capsys):
    assert release.main([str(tmp_path / "out"), "--graded", "ex05,ex08"]) == 0
    out = capsys.readouterr().out
    assert "graded from this release: ex05_prompt_lookup, ex08_lossless_or_not" in out
    assert "PRACTICE ONLY: ex01_roofline, ex02_accept_reject, ex03_speedup, ex04_gpt2_pair, ex06_trees, " \
           "ex07_load_aware_k" in out


# -- the README --------------------------------------------------------------------------------------------------
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_learner_and_instructor_path_leads_to_no_development_history():
    for name, text in learner_text.readme_learner_text(README):
        assert "benchmarks/" not in text, f"README section {name!r} points at benchmarks/ (development history)"
        assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, name


def _readme_minutes() -> tuple[dict[str, int], int]:
    rows = dict(re.findall(r"^\| \d\d \| `(\d\d_\w+\.ipynb)` \|.*\| (\d+) \|$", README, re.M))
    m = re.search(r"(\d+) h(?: (\d+))? in all", README)
    assert m, "the README gives no total reading time ('N h MM in all')"
    return {k: int(v) for k, v in rows.items()}, int(m.group(1)) * 60 + int(m.group(2) or 0)


def test_the_readme_reading_times_are_what_the_script_computes():
    """Within the README's rounding (ROUND_TO minutes): a notebook edited since the numbers were written fails."""
    rows, total = _readme_minutes()
    lectures = reading_times.lectures()
    assert sorted(rows) == [p.name for p in lectures]
    half = reading_times.ROUND_TO / 2 + 1e-9
    computed = {p.name: reading_times.reading(p).minutes for p in lectures}
    off = {n: (rows[n], round(m, 1)) for n, m in computed.items() if abs(rows[n] - m) > half}
    assert not off, f"README minutes against tools/upkeep/reading_times.py: {off}"
    assert abs(total - sum(computed.values())) <= half, (total, sum(computed.values()))
    for rate in (reading_times.WORDS_PER_MINUTE, reading_times.SECONDS_PER_CELL, reading_times.SECONDS_PER_LINE,
                 reading_times.SECONDS_PER_OUTPUT_LINE, reading_times.SECONDS_PER_FIGURE):
        assert re.search(rf"\b{rate}\b", README.split("## For learners")[1].split("| #")[0]), rate


def test_reading_times_count_what_a_notebook_holds(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(" ".join(["word"] * 240)),  # 2 min
        nbformat.v4.new_code_cell("x = 1\n\ny = 2", outputs=[  # 15 s + 2 x 5 s
            nbformat.v4.new_output("stream", name="stdout", text="a\nb\n"),  # 2 x 3 s
            nbformat.v4.new_output("display_data", data={"image/png": "", "text/plain": "<Figure>"})])])  # 30 s
    path = tmp_path / "01_x.ipynb"
    path.write_text(nbformat.writes(nb))
    r = reading_times.reading(path)
    assert (r.words, r.cells, r.lines, r.output_lines, r.figures) == (240, 1, 2, 2, 1)
    assert r.minutes == pytest.approx(2 + (15 + 10 + 6 + 30) / 60)
    assert reading_times.rounded(37.4) == 35 and reading_times.rounded(1) == 5 and reading_times.hours(390) == "6 h 30"


# What times something in a notebook's code: the clock, an import of specref's timing modules, or a call (not a
# method of a cost model such as `gpu.plain_time`) of specref's timing helpers, or of specref.perf.hf's timed runs.
TIMING = re.compile(r"\bperf_counter\b|\btime\.time\(|\bmonotonic\(|\btimeit\b"
                    r"|\b(?:from|import) specref\.(?:perf\.live|perf\.measure|perf\.tree_timing|timing)\b"
                    r"|(?<![\w.])(?:forward_time|pass_times|median_time|repeat_times|memory_bandwidth|peak_matmul_flops"
                    r"|plain_time|speculative_run|time_passes|time_decoding|time_tree_decoding"
                    r"|measure_tree_pass_costs)\("
                    r"|\btime_repeats\(|\.(?:hf_generate|specref_generate|time_libraries)\(")  # specref.perf.hf's runs time themselves


def _times_something(path: Path) -> bool:
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = "\n".join(line for c in nb["cells"] if c["cell_type"] == "code"
                     for line in "".join(c["source"]).splitlines() if not line.lstrip().startswith("#"))
    return bool(TIMING.search(code))


def test_the_readme_says_which_notebooks_time_things():
    """The README's "What is timed" paragraph against the timing calls each lecture's code makes."""
    para = README.split("**What is timed.**")[1].split("\n\n")[0]
    sentence = next(s for s in re.split(r"(?<=\.) ", para) if "time nothing" in s)
    untimed = set(re.findall(r"\b(\d\d)\b", sentence))
    timed = set(re.findall(r"\b(0\d)\b", para)) - untimed
    lectures: dict[str, list[Path]] = {}  # a number -> its lectures (05 has a companion lecture of its own)
    for path in reading_times.lectures():
        lectures.setdefault(path.name[:2], []).append(path)
    assert timed | untimed == set(lectures) and not timed & untimed
    times = {n: any(_times_something(p) for p in paths) for n, paths in lectures.items()}
    wrong = {n: t for n, t in times.items() if t != (n in timed)}
    assert not wrong, f"notebooks the README says the opposite of (True: it times something): {wrong}"


def test_the_cells_that_need_the_grader_are_named():
    """An exercise's own cell that uses what its checks cell imports fails in a release: `needs_grader` names it;
    test cells (which call the checks by design) and a name that only contains the given one are not counted."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from specref_grading.checks.x import ROWS, check_fit",
                                  metadata={"specref": {"side": "checks"}}),
        nbformat.v4.new_code_cell("rows = ROWS()\nMY_ROWS = 1"),
        nbformat.v4.new_code_cell("fit = 2", metadata={"nbgrader": {"grade": False, "solution": True,
                                                                     "grade_id": "a"}}),
        nbformat.v4.new_code_cell("check_fit(fit)", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                            "grade_id": "t", "points": 1}}),
        nbformat.v4.new_code_cell("print(OTHER_ROWS, obj.ROWS)")])
    assert release.needs_grader(json.loads(nbformat.writes(nb))) == {"ROWS": [1]}
    nb.cells[0].metadata = {}  # no checks cell: nothing is the grader's
    assert release.needs_grader(json.loads(nbformat.writes(nb))) == {}



def test_paths_a_learner_is_pointed_at_but_the_release_lacks_are_named(tmp_path):
    """A released notebook's text that names a file the release does not hold (tests/, benchmarks/) is a dead end
    for a learner: `dead_mentions` names each, and only those."""
    (tmp_path / "specref").mkdir()
    (tmp_path / "specref" / "x.py").write_text("")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("See `specref/x.py`, `benchmarks/bench_hf.py` and `tests/test_x.py`."),
        nbformat.v4.new_code_cell("# `benchmarks/in_code.py` is code, not text")])
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(nbformat.writes(nb))
    assert release.dead_mentions(tmp_path) == ["notebooks/01_x.ipynb cell 0: benchmarks/bench_hf.py",
                                               "notebooks/01_x.ipynb cell 0: tests/test_x.py"]


def test_the_readme_points_learners_only_at_what_the_release_holds(built):
    """The README's learner sections name only files a class folder holds (the instructor's section is read in the
    repository)."""
    dead = [f"README {name}: {m}" for name, text in learner_text.readme_learner_text(README)
            if name != "For instructors" for m in release.PATH_MENTION.findall(text) if not (built / m).exists()]
    assert not dead, dead


@pytest.mark.parametrize("code, times", [
    ("t0 = time.perf_counter()", True), ("from specref.perf.live import time_passes", True),
    ("rows = pass_times(target, [1, 5])", True), ("ts = hf.time_repeats(run, 3)", True),
    ("timed = time_tree_decoding(grown, draft, prompts, 24, trees)", True),
    ("from specref.perf.tree_timing import complete_tree", True),
    ("per_token = gpu.plain_time(1)  # a cost model", False), ("def measure(target, draft):\n    pass", False),
    ("# t0 = time.perf_counter()", False),
])
def test_what_counts_as_timing(tmp_path, code, times):
    path = tmp_path / "01_x.ipynb"
    path.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])))
    assert _times_something(path) is times
