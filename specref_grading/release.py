"""Build a release folder for a class: what a learner needs, and no solution, answer, rubric or hidden test.

    python -I -m specref_grading.release FOLDER [--graded ex02,ex05]      (make release DIR=FOLDER)

What goes in (`RELEASE`): the lectures (notebooks/, with their outputs), the exercises generated afresh from
solutions/ (`exercises.expected_files`: the same bytes `make exercises` writes), the package `specref` with its
assets (the bundled pair, the heads, the tokenizer), and what setting up needs: README.md, the Makefile,
pyproject.toml, environment.yml, requirements/, docs/ (the README's picture), tools/upkeep/probe_index.py
(the Makefile's set-up step calls it) and tools/training/ (how the bundled pair and heads were trained, which the
README and notebook 04 point at).

What stays out: solutions/ (the answers, the hidden tests, the rubrics, the exercises' closing summaries), the
grader `specref_grading` (its per-exercise checks are answer keys), tests/, benchmarks/ (development history)
and the other upkeep tools. `problems_in` then reads back every file written, and the release is refused if it
holds a solution marker (``### BEGIN SOLUTION``, ``### BEGIN HIDDEN TESTS``), a rubric or solution_only cell, or
a module of the grader. An exercise's checks cell (``"specref": {"side": "checks"}``) imports the grader's checks,
which a class folder lacks: the release rewrites it (`offline_checks`) into definitions of the same names, each
printing one line that says the instructor's grader runs it and returning None, so a learner runs the exercise top
to bottom and the instructor grades the notebooks handed in (``make grade-all``); the grader still runs its own
checks cell, whatever a learner's copy holds. What the exercises give on purpose lives in specref (ex01's
`specref.perf.machine.MACHINES`, ex07's `specref.course.server.server_rows`). Where another cell of an exercise
still uses a name only the checks cell imports, it fails in the release: `needs_grader` finds it, and the command
names it, as it names each file a released notebook points at that the release does not hold (`dead_mentions`).

**Answer keys.** The package holds the reference answer of every exercise (ex02's `specref.rejection`, ex05's
`specref.drafts.prompt_lookup`, ...: each exercise's ``FORBIDDEN``, the same names the grader keeps out of the
learner's kernel), and the lectures run on them. So a release says which exercises it is for (`--graded`):

* the exercises named there are graded from this release: the released specref is built like the kernel's copy
  (specref_grading/trust/kernel_tree.py), without their answer keys and without what needs them at import time,
  and the release is refused if the read-back finds one of those keys (`keys_present`). The lecture cells and
  exercise cells that import what is then gone are named: they run in a later release, built once those exercises
  are graded and their keys may ship;
* every other exercise is practice only: its answer key ships with the package, and a learner can copy it.

Without `--graded` nothing is removed and every exercise is practice only. The release's RELEASE.md and the
command's output say which exercises are graded, which are practice only and why, and what does not run.

The folder must be new or empty and outside this repository (a release inside the checkout would be
committed, or regraded as submissions); anything else is refused with exit status 2 and nothing is written.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from specref_grading.exercises import BEGIN_HIDDEN, BEGIN_SOLUTION, ROOT, MarkerError, expected_files, left_out
from specref_grading.notebook import source
from specref_grading.trust import kernel_tree

# (path relative to the repository, kind): "file", or "tree" (a folder, all of it but caches).
RELEASE: tuple[tuple[str, str], ...] = (
    ("README.md", "file"),
    ("Makefile", "file"),
    ("pyproject.toml", "file"),
    ("environment.yml", "file"),
    ("requirements", "tree"),
    ("docs", "tree"),
    ("tools/upkeep/probe_index.py", "file"),
    ("tools/training", "tree"),
    ("specref", "tree"),
    ("notebooks", "tree"),
)
SKIP_NAMES = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".DS_Store"}
SKIP_SUFFIXES = (".pyc", ".pyo")
# What must never be in a release: the answers' markers, and the grader.
FORBIDDEN_TEXT = (BEGIN_SOLUTION, BEGIN_HIDDEN, "### END SOLUTION", "### END HIDDEN TESTS")
FORBIDDEN_PATHS = ("solutions", "specref_grading", "tests", "benchmarks")


class ReleaseError(ValueError):
    """The release cannot be written there, or what would be written holds what a learner must not get."""


def _skipped(path: Path) -> bool:
    return path.name in SKIP_NAMES or path.name.startswith(".grading-") or path.suffix in SKIP_SUFFIXES


def _tree(folder: Path) -> list[Path]:
    """Every file under `folder`, caches and a grader's temporary copies left out; symbolic links refused."""
    out = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _skipped(Path(d)))
        for name in sorted(files):
            path = Path(top, name)
            if _skipped(path):
                continue
            if path.is_symlink():
                raise ReleaseError(f"{path} is a symbolic link: a release holds plain files only")
            out.append(path)
    return out


def contents(root: Path = ROOT, package: Path | None = None) -> dict[str, bytes | Path]:
    """{relative path: a file to copy, or the bytes to write} of the release built from the checkout at `root`;
    the package's files from `package` (a copy without answer keys, `strip_keys`) when given, else `root/specref`."""
    out: dict[str, bytes | Path] = {}
    for rel, kind in RELEASE:
        src = package if rel == "specref" and package is not None else root / rel
        if kind == "file":
            if not src.is_file():
                raise ReleaseError(f"{src} is missing: a release needs it")
            out[rel] = src
        else:
            if not src.is_dir():
                raise ReleaseError(f"{src} is missing: a release needs it")
            out.update({f"{rel}/{p.relative_to(src).as_posix()}": p for p in _tree(src)})
    try:
        exercises = expected_files(root / "solutions")
    except MarkerError as e:
        raise ReleaseError(f"the exercises cannot be generated: {e}") from e
    if not exercises:
        raise ReleaseError(f"no solutions in {root / 'solutions'}: nothing to generate exercises from")
    out.update({f"exercises/{name}": offline_checks(data) for name, data in exercises.items()})
    return out


OFFLINE_NOTE = "your instructor's grader runs this check"


def _checks_names(src: str) -> list[str]:
    """The names a checks cell binds by its imports, in order (ValueError when it does anything else)."""
    tree = ast.parse(src)
    names = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            raise ValueError(f"a checks cell only imports; it has a {type(node).__name__}")
        names += [a.asname or a.name.split(".")[0] for a in node.names]
    return names


def offline_checks(data: bytes) -> bytes:
    """An exercise notebook whose checks cell defines, instead of importing them from the grader, each check it
    imports (``check_*``) as a function that prints "check_x: your instructor's grader runs this check" and returns
    None. Other names the cell imports are the grader's (hidden settings) and are not defined: what an exercise gives
    on purpose lives in specref. A notebook without a checks cell comes back unchanged; ReleaseError when the cell
    does anything but import."""
    nb = json.loads(data)
    changed = False
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("specref")
        if not (isinstance(meta, dict) and meta.get("side") == "checks"):
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            names = _checks_names(src)
        except (SyntaxError, ValueError) as e:
            raise ReleaseError(f"a checks cell cannot be rewritten for a class folder: {e}") from e
        # The grader's other names (ex04's SAMPLING_HIDDEN, for its hidden tests) stay undefined: `needs_grader`
        # names any cell of the exercise that uses one.
        names = [n for n in names if n.startswith("check_")]
        lines = ["# The checks that grade your answers run in your instructor's grader (not in this folder): here each",
                 "# one only says so. Hand in the notebook; the grader runs the real checks on its own side.",
                 "def _graded_by_your_instructor(name):",
                 "    def check(*args, **kwargs):",
                 f"        print(f\"{{name}}: {OFFLINE_NOTE}\")",
                 "    check.__name__ = name",
                 "    return check",
                 ""]
        lines += [f"{n} = _graded_by_your_instructor({n!r})" for n in names]
        cell["source"] = "\n".join(lines)
        cell["outputs"], cell["execution_count"] = [], None
        changed = True
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode("utf-8") if changed else data


# -- answer keys: which exercises a release is for ----------------------------------------------------------------


def _code(nb: dict) -> list[str]:
    """A notebook's code cells, magics and shell lines blanked (they are not Python)."""
    return ["\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source(c).splitlines())
            for c in nb["cells"] if c.get("cell_type") == "code"]


def answer_keys(root: Path = ROOT) -> dict[str, tuple[str, ...]]:
    """{exercise: the specref names that are its answer key}: the ``FORBIDDEN`` of the check modules its solution
    imports (what the grader keeps out of the learner's kernel), specref's only; exercises in file order."""
    keys = {}
    for path in sorted((root / "solutions").glob("ex*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        keys[path.stem] = tuple(k for k in kernel_tree.forbidden_for(_code(nb)) if k.startswith("specref."))
    return keys


def resolve_graded(names: list[str], exercises: list[str]) -> tuple[str, ...]:
    """The exercises `names` mean ("ex02" or "ex02_accept_reject"), in course order; ReleaseError for a name that
    is no exercise, or that means more than one."""
    out = set()
    for name in (n.strip() for n in names if n.strip()):
        found = [e for e in exercises if e == name or e.split("_", 1)[0] == name]
        if len(found) != 1:
            raise ReleaseError(f"--graded {name!r}: no such exercise (the exercises: {', '.join(exercises)})")
        out.add(found[0])
    return tuple(e for e in exercises if e in out)


def strip_keys(graded: tuple[str, ...], keys: dict[str, tuple[str, ...]], into: Path,
               root: Path = ROOT) -> kernel_tree.Selection:
    """Write into `into`/specref the package without the answer keys of the `graded` exercises, built as the
    kernel's copy is (every module of the package is a root; each key's module and whatever needs one at import
    time left out, every other module the package's own file); the selection it wrote."""
    reading = kernel_tree.Reading(root / "specref")
    forbidden = tuple(sorted({k for e in graded for k in keys[e]}))
    selection = kernel_tree.select(reading, tuple(sorted(reading.modules)), forbidden)
    kernel_tree.write_tree(selection, into / "specref")
    for path in _tree(root / "specref"):  # the data (the bundled models, the tokenizer), outside a dropped package
        rel = path.relative_to(root / "specref")
        owners = [".".join(("specref",) + rel.parts[:n]) for n in range(len(rel.parts) - 1, -1, -1)]
        package = next((m for m in owners if m in reading.modules), "specref")
        if path.suffix != ".py" and package in selection.kept and not (into / "specref" / rel).exists():
            (into / "specref" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, into / "specref" / rel)
    return selection


def keys_present(package: Path, keys: tuple[str, ...]) -> list[str]:
    """The answer keys (dotted specref modules: FORBIDDEN names modules only) that the package folder `package`
    holds, read back from its files alone: the module's source or compiled file, or a module under it."""
    modules: set[str] = set()
    for path in package.rglob("*.py*"):
        if path.suffix not in (".py", ".pyc"):
            continue
        rel = path.relative_to(package.parent)
        parts = list(rel.parent.parts if rel.parent.name != "__pycache__" else rel.parent.parent.parts)
        stem = path.name.split(".")[0]
        parts += [] if stem == "__init__" else [stem]
        modules.add(".".join(parts))
    return [key for key in keys if key in modules or any(m.startswith(key + ".") for m in modules)]


def _imports(sources: list[str]) -> list[str]:
    """The specref names code imports, dotted (``from specref.x import y``: specref.x.y; ``import specref.x``)."""
    out = []
    for node in kernel_tree.nodes_of(sources):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "specref":
            out += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "specref"]
    return out


def not_running(files: dict[str, bytes | Path], selection: kernel_tree.Selection) -> dict[str, dict[int, list[str]]]:
    """{notebook: {cell index: [what it imports that the stripped package lacks]}} over the released lectures and
    exercises (an exercise's checks and test cells left out: they never run in a release)."""
    out: dict[str, dict[int, list[str]]] = {}
    for rel, src in sorted(files.items()):
        if not rel.endswith(".ipynb") or rel.split("/")[0] not in ("notebooks", "exercises"):
            continue
        nb = json.loads(src.read_bytes() if isinstance(src, Path) else src)
        for i, cell in enumerate(nb["cells"]):
            meta, grading = cell.get("metadata", {}).get("specref"), cell.get("metadata", {}).get("nbgrader") or {}
            if cell.get("cell_type") != "code" or (isinstance(meta, dict) and meta.get("side") == "checks") or (
                    grading.get("grade") and not grading.get("solution")):
                continue
            gone = sorted({name for name in _imports(_code({"cells": [cell]})) if not selection.available(name)})
            if gone:
                out.setdefault(rel, {})[i] = gone
    return out


def notice(graded: tuple[str, ...], keys: dict[str, tuple[str, ...]],
           blocked: dict[str, dict[int, list[str]]]) -> str:
    """RELEASE.md: which exercises this release is graded for, which are practice only and why, what does not run."""
    practice = [e for e in keys if e not in graded]
    lines = ["# This release", ""]
    if graded:
        lines += ["**Graded from this release:** " + ", ".join(graded) + ". The package here lacks their reference "
                  "answers (" + "; ".join(f"{e}: {', '.join(keys[e])}" for e in graded) + ").", ""]
    if practice:
        lines += ["**Practice only:** " + ", ".join(practice) + ". The package here holds each one's reference "
                  "answer, which a learner can copy into an answer, so a grade on these says little; they are for "
                  "practice, or graded from a later release built for them (`python -I -m specref_grading.release "
                  "FOLDER --graded ...`):", ""]
        lines += [f"- {e}: {', '.join(keys[e]) or 'nothing of the package'}" for e in practice] + [""]
    if blocked:
        lines += ["**What does not run here:** these cells import what this release leaves out (an answer key, or "
                  "what needs one); they run in a later release, once those exercises are graded:", ""]
        lines += [f"- {rel} cell {i}: {', '.join(names)}" for rel, cells in blocked.items()
                  for i, names in cells.items()] + [""]
    return "\n".join(lines)


def check_target(folder: Path, root: Path = ROOT) -> Path:
    """The folder to write, resolved; ReleaseError when it is inside the repository or not an empty folder."""
    target = Path(folder).expanduser().resolve()
    repo = root.resolve()
    if target == repo or repo in target.parents:
        raise ReleaseError(f"{target} is inside the repository {repo}: a release is written outside it "
                           "(inside, it would be committed with the course or graded as submissions)")
    if target.exists() and not target.is_dir():
        raise ReleaseError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        raise ReleaseError(f"{target} is not empty: a release is written into a new or empty folder only")
    return target


def problems_in(folder: Path) -> list[str]:
    """What a learner must not get, found in a written release: solution markers, rubric or solution_only cells,
    the grader, solutions, tests. Empty when the release is clean."""
    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if rel.parts[0] in FORBIDDEN_PATHS:
            problems.append(f"{rel}: {rel.parts[0]}/ is not for learners")
        if path.suffix in (".safetensors", ".png"):
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        problems += [f"{rel}: holds {marker!r}" for marker in FORBIDDEN_TEXT if marker in text]
        if path.suffix == ".ipynb":
            try:
                cells = json.loads(text).get("cells", [])
            except ValueError:
                problems.append(f"{rel}: not valid JSON")
                continue
            problems += [f"{rel}: cell {i} is a rubric or solution_only cell" for i, c in enumerate(cells)
                         if isinstance(c, dict) and left_out(c)]
    return problems


PATH_MENTION = re.compile(r"`((?:benchmarks|tools|specref|notebooks|exercises|solutions|docs|requirements|tests)/"
                          r"[\w./-]*[\w/])`")


def dead_mentions(folder: Path) -> list[str]:
    """'<notebook> cell N: <path>' for each file a released notebook's text names (in backticks) that the release
    does not hold: a learner following it finds nothing (tests/, benchmarks/ and solutions/ stay out)."""
    dead = []
    for path in sorted((folder / "notebooks").glob("*.ipynb")) + sorted((folder / "exercises").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell.get("cell_type") != "markdown":
                continue
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            dead += [f"{path.relative_to(folder).as_posix()} cell {i}: {m}" for m in PATH_MENTION.findall(text)
                     if not (folder / m.rstrip("/")).exists()]
    return dead


def needs_grader(nb: dict) -> dict[str, list[int]]:
    """{name: [cell index, ...]}: what an exercise's own cells (not its test cells) use of the names its checks cell
    (``"specref": {"side": "checks"}``) imports. Those cells fail where the grader is absent, as in a release."""
    names: set[str] = set()
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("specref")
        if isinstance(meta, dict) and meta.get("side") == "checks":
            try:
                tree = ast.parse("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
            except SyntaxError:
                continue
            names |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    used: dict[str, list[int]] = {}
    for i, cell in enumerate(nb["cells"]):
        meta, grading = cell.get("metadata", {}).get("specref"), cell.get("metadata", {}).get("nbgrader") or {}
        if cell.get("cell_type") != "code" or (isinstance(meta, dict) and meta.get("side") == "checks") or (
                grading.get("grade") and not grading.get("solution")):
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for name in sorted(names):
            if re.search(rf"(?<![\w.]){re.escape(name)}\b", src):
                used.setdefault(name, []).append(i)
    return used


def build(folder: Path, root: Path = ROOT, graded: tuple[str, ...] = ()) -> dict:
    """Write the release into `folder` (new or empty, outside the repository), graded for the exercises `graded`
    (their answer keys left out of the package; every other exercise practice only); {"folder", "files", "bytes",
    "graded", "practice", "not_running", "needs_grader", "dead"}.

    Everything is written into a temporary folder beside `folder` first and checked (`problems_in`, and
    `keys_present` for the graded exercises' keys); only a clean release is moved into place, so a refused one
    leaves nothing behind.
    """
    target = check_target(folder, root)
    keys = answer_keys(root)
    graded = resolve_graded(list(graded), list(keys))
    with tempfile.TemporaryDirectory(prefix="specref-release-") as scratch:
        selection = strip_keys(graded, keys, Path(scratch), root) if graded else None
        files = contents(root, Path(scratch) / "specref" if selection is not None else None)
        blocked = not_running(files, selection) if selection is not None else {}
        files["RELEASE.md"] = notice(graded, keys, blocked).encode("utf-8")
        done = _write(target, files, tuple(k for e in graded for k in keys[e]))
    # Read from the exercises as generated, before their checks cells were rewritten (`offline_checks`).
    grader = {f"exercises/{name}": found for name, data in sorted(expected_files(root / "solutions").items())
              for found in [needs_grader(json.loads(data))] if found}
    return {**done, "needs_grader": grader, "graded": graded, "practice": tuple(e for e in keys if e not in graded),
            "not_running": blocked}


def _write(target: Path, files: dict[str, bytes | Path], keys: tuple[str, ...]) -> dict:
    """Write `files` into a staging folder beside `target`, check it, and move it into place (module docstring)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.release-tmp")
    if staging.exists():
        shutil.rmtree(staging)
    try:
        size = 0
        for rel, src in sorted(files.items()):
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, Path):
                shutil.copyfile(src, dest)
                size += dest.stat().st_size
            else:
                dest.write_bytes(src)
                size += len(src)
        problems = problems_in(staging) + [f"specref: holds {key}, the answer key of an exercise graded from this "
                                           "release" for key in keys_present(staging / "specref", keys)]
        if problems:
            raise ReleaseError("the release would hand learners what they must not get:\n" + "\n".join(problems))
        if target.is_dir():
            target.rmdir()  # empty (check_target)
        dead = dead_mentions(staging)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return {"folder": target, "files": len(files), "bytes": size, "dead": dead}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -I -m specref_grading.release",
                                 description="Build a folder for a class: the lectures, the exercises, the package "
                                             "and its set-up; no solutions, answers, rubrics or hidden tests.")
    ap.add_argument("folder", type=Path, help="a new or empty folder outside the repository")
    ap.add_argument("--graded", action="append", default=[], metavar="EXERCISES",
                    help="the exercises graded from this release, comma-separated (ex02 or ex02_accept_reject; "
                         "repeatable): their answer keys are left out of the package. Every other exercise is "
                         "practice only (its reference answer ships). Default: none, all practice only")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the course's checkout, whose notebooks, exercises and package are released (default: the "
                         "one this grader lies in; name it where the grader is installed with `pip install .`)")
    args = ap.parse_args(argv)
    try:
        done = build(args.folder, root=args.root.resolve(), graded=tuple(n for arg in args.graded for n in arg.split(",")))
    except ReleaseError as e:
        print(f"release refused: {e}", file=sys.stderr)
        return 2
    print(f"release written to {done['folder']}: {done['files']} files, {done['bytes'] / 1e6:.1f} MB "
          "(notebooks/, exercises/, specref/ and its set-up; no solutions, rubrics or grader). "
          f"Learners run `make lab` there; you grade what they hand in here, with `make grade-all DIR=...`.")
    for rel, found in done["needs_grader"].items():
        uses = "; ".join(f"{name} (cell{'s' if len(cells) > 1 else ''} {', '.join(map(str, cells))})"
                         for name, cells in found.items())
        print(f"note: {rel} uses what only the grader's checks give, so those cells fail in the release: {uses}")
    print("note: exercise 8's six samplers ship as code (specref/checks/samplers.py): they are its problem statement; "
          "the verdicts are decided by the grader alone.")
    for line in done["dead"]:
        print(f"note: {line} is named there but is not in the release")
    if done["graded"]:
        print(f"graded from this release: {', '.join(done['graded'])} (their answer keys are not in its specref)")
    if done["practice"]:
        print(f"PRACTICE ONLY: {', '.join(done['practice'])}: the released specref holds their reference answers, "
              "which a learner can copy; to grade one, release with --graded naming it (RELEASE.md says which "
              "modules hold each key)")
    for rel, cells in done["not_running"].items():
        print(f"note: {rel} cells {', '.join(map(str, cells))} import what this release leaves out: they run in a "
              "later release (RELEASE.md names each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
