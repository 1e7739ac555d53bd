"""No answer in sight before its question: a check-your-understanding answer or an exercise's expected value
must not be printed or written where the learner reads it first.

The rule. For each lecture (notebooks/NN_*.ipynb) the answers are the text inside each <details>...</details>
of the markdown cells from the 'Check your understanding' heading on (the heading `lint_notebooks` requires).
For each exercise (solutions/exNN_*.ipynb) the expected values are the hand-graded answers: the markdown
solution regions (### BEGIN SOLUTION ... ### END SOLUTION) and the rubric cells (metadata
"specref": {"rubric": ...}), each belonging to the last '## Task N' heading above it.

From each answer the lint takes its *distinctive literals*:

* numbers with at least three significant digits ("2.18", "0.735", "6694"; not 0, 1, 2, 0.5, 0.48, 1000,
  nor a year such as 2023);
* bracketed lists of two or more numbers ("[3, 4, 0]"), the shape of a token sequence or a vector.

A literal the question itself gives (the 'Check your understanding' questions, the task's own text) is a
given, not an answer, and is dropped. Each remaining literal is flagged when it appears verbatim (numbers with
digit boundaries) in what the learner reads before the question:

* a lecture's answers: the lecture's cells before the 'Check your understanding' heading (markdown, code and
  printed outputs), its companion exercise as handed out (exercises/exNN_*.ipynb: markdown and code; it has no
  outputs) and the README;
* an exercise's answers: the exercise's cells before the task's heading (markdown and code, as handed out),
  its companion lecture (every cell, outputs included) and the README.

A lecture and an exercise are companions when they share their number (notebook 03 and ex03): the README's
exercise table pairs them so.

Limits. The lint matches literals, not reasoning: an answer given away in words (a cell that states the
explanation a task asks for, a task whose wording spells out the algorithm, a table row that states the
condition a task asks the learner to find, a cell of code that shows the recipe of another task) passes it;
so does an answer that is a small integer ("best k = 4") or a number with fewer than three significant digits,
and a value printed with another rounding ("2.2" for 2.18). Those are for a reader to find. An exercise's
printed outputs are not read: they are the learner's own computations; nor are the outputs of a cell marked
`# NBVAL_IGNORE_OUTPUT` (timings: another machine prints other figures). A literal can also match by
coincidence, or be a figure an answer cites as evidence rather than the result it asks for: `KNOWN` lists
those, each with its reason, and a test keeps the list from going stale.

Usage: python tools/upkeep/answer_leaks.py  (exits 1 and prints one line per leak if there is any).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CYU = re.compile(r"^\s*#{1,6}\s*Check your understanding\b", re.IGNORECASE | re.MULTILINE)
_DETAILS = re.compile(r"<details>(.*?)</details>", re.DOTALL | re.IGNORECASE)
_TASK = re.compile(r"^#+\s*Task\s+(\d+)\b", re.MULTILINE)
_SOLUTION = re.compile(r"### BEGIN SOLUTION(.*?)### END SOLUTION", re.DOTALL)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w]|\.\d)")
_LIST = re.compile(r"\[\s*-?\d+(?:\.\d+)?(?:\s*,\s*-?\d+(?:\.\d+)?)+\s*\]")


@dataclass(frozen=True)
class Leak:
    answer: str  # where the answer is: "notebooks/03_...ipynb, check your understanding" or "..., Task 5"
    literal: str
    where: str  # where it appears first: "notebooks/03_...ipynb cell 12 (output)", "README.md"

    def __str__(self) -> str:
        return f"{self.answer}: {self.literal!r} already appears in {self.where}"


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def significant_digits(number: str) -> int:
    """Digits of a decimal numeral without leading zeros and, for integers and decimals alike, trailing zeros."""
    return len(number.replace(".", "").lstrip("0").rstrip("0"))


def distinctive_literals(text: str) -> set[str]:
    """The numbers with at least three significant digits (no years) and the bracketed number lists in `text`."""
    found = set(m.group(0) for m in _LIST.finditer(text))
    for m in _NUMBER.finditer(text):
        number = m.group(0)
        if significant_digits(number) < 3:
            continue
        if "." not in number and len(number) == 4 and 1900 <= int(number) <= 2099:
            continue  # a year (a citation), not a result
        found.add(number)
    return found


def appears(literal: str, text: str) -> bool:
    """`literal` verbatim in `text`; a number must not be part of a longer number."""
    if literal.startswith("["):
        return literal in text
    return re.search(r"(?<![\d.])" + re.escape(literal) + r"(?![\d]|\.\d)", text) is not None


def _outputs(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(_text(out["text"]))
        data = out.get("data", {})
        for kind in ("text/plain", "text/markdown", "text/html"):
            if kind in data:
                parts.append(_text(data[kind]))
    return "\n".join(parts)


def _machine_specific(cell: dict) -> bool:
    """A cell whose output nbval ignores (timings, plots, widgets): what it printed is this run's, not a fact the
    reader of another machine sees, so a literal in it matches only by coincidence."""
    return _text(cell["source"]).lstrip().startswith("# NBVAL_IGNORE_OUTPUT")


def cell_texts(nb: dict, stop: int | None = None, outputs: bool = True) -> Iterable[tuple[int, str, str]]:
    """(index, "markdown" / "code" / "output", text) for the cells before `stop` (all if None)."""
    for i, cell in enumerate(nb["cells"][:stop]):
        yield i, cell["cell_type"], _text(cell["source"])
        if outputs and cell["cell_type"] == "code" and not _machine_specific(cell):
            printed = _outputs(cell)
            if printed:
                yield i, "output", printed


def lecture_answers(nb: dict) -> tuple[int | None, str, str]:
    """(index of the 'Check your understanding' cell, the questions' text, the answers' text)."""
    at = next((i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"
               and _CYU.search(_text(c["source"]))), None)
    if at is None:
        return None, "", ""
    last = max((i for i, c in enumerate(nb["cells"]) if i >= at and c["cell_type"] == "markdown"
                and "</details>" in _text(c["source"])), default=at)
    questions, answers = [], []
    for cell in nb["cells"][at : last + 1]:  # the questions and their answers, not the summary after them
        if cell["cell_type"] != "markdown":
            continue
        source = _text(cell["source"])
        answers += _DETAILS.findall(source)
        questions.append(_DETAILS.sub("", source))
    return at, "\n".join(questions), "\n".join(answers)


def exercise_answers(nb: dict) -> list[tuple[int, str, str]]:
    """(index of the task's heading cell, the task's text, one expected answer) for each hand-graded answer."""
    found = []
    task_at, task_text = None, ""
    for i, cell in enumerate(nb["cells"]):
        source = _text(cell["source"])
        meta = cell.get("metadata", {}).get("specref", {})
        if cell["cell_type"] == "markdown" and _TASK.search(source) and "rubric" not in meta:
            task_at, task_text = i, _SOLUTION.sub("", source)
        elif cell["cell_type"] == "markdown" and task_at is not None and not _SOLUTION.search(source) \
                and "rubric" not in meta and not meta.get("solution_only"):
            task_text += "\n" + source  # the task's text goes on in the cells that follow its heading
        if task_at is None or cell["cell_type"] != "markdown":
            continue
        answers = _SOLUTION.findall(source) + ([source] if "rubric" in meta else [])
        found += [(task_at, task_text, a) for a in answers]
    return found


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _rel(path: Path, repo: Path) -> str:
    try:
        return str(path.relative_to(repo))
    except ValueError:
        return str(path)


def find_leaks(answer: str, literals: set[str], sources: list[tuple[str, str]]) -> list[Leak]:
    """Each literal found in one of `sources` ((where, text), in reading order): its first place."""
    leaks = []
    for literal in sorted(literals):
        where = next((w for w, text in sources if appears(literal, text)), None)
        if where is not None:
            leaks.append(Leak(answer, literal, where))
    return leaks


def _sources(path: Path, nb: dict, repo: Path, stop: int | None, outputs: bool) -> list[tuple[str, str]]:
    name = _rel(path, repo)
    return [(f"{name} cell {i} ({kind})", text) for i, kind, text in cell_texts(nb, stop, outputs)]


def companion(path: Path, repo: Path = REPO) -> Path | None:
    """notebooks/NN_*.ipynb <-> exercises/exNN_*.ipynb (a lecture's) or notebooks/NN_*.ipynb (an exercise's)."""
    number = re.match(r"(?:ex)?(\d\d)_", path.name)
    if number is None:
        return None
    pattern = f"ex{number.group(1)}_*.ipynb" if path.name[0].isdigit() else f"{number.group(1)}_*.ipynb"
    folder = repo / ("exercises" if path.name[0].isdigit() else "notebooks")
    return next(iter(sorted(folder.glob(pattern))), None)


def lint_lecture(path: Path, repo: Path = REPO, readme: str | None = None) -> list[Leak]:
    nb = _load(path)
    at, questions, answers = lecture_answers(nb)
    if at is None:
        return []
    literals = distinctive_literals(answers) - distinctive_literals(questions)
    sources = _sources(path, nb, repo, at, outputs=True)
    other = companion(path, repo)
    if other is not None:
        sources += _sources(other, _load(other), repo, None, outputs=False)
    if readme is None:
        readme = (repo / "README.md").read_text(encoding="utf-8") if (repo / "README.md").exists() else ""
    sources.append(("README.md", readme))
    return find_leaks(f"{_rel(path, repo)}, check your understanding", literals, sources)


def lint_exercise(solution: Path, repo: Path = REPO, readme: str | None = None) -> list[Leak]:
    nb = _load(solution)
    handed_out = repo / "exercises" / solution.name
    exercise = _load(handed_out) if handed_out.exists() else nb
    lecture = companion(solution, repo)
    if readme is None:
        readme = (repo / "README.md").read_text(encoding="utf-8") if (repo / "README.md").exists() else ""
    leaks = []
    for task_at, task_text, answer in exercise_answers(nb):
        literals = distinctive_literals(answer) - distinctive_literals(task_text)
        # The exercise as handed out, up to the same task's heading (its cells are the solution's, less some).
        heading = _text(nb["cells"][task_at]["source"]).splitlines()[0]
        stop = next((i for i, c in enumerate(exercise["cells"]) if _text(c["source"]).startswith(heading)), None)
        sources = _sources(handed_out if handed_out.exists() else solution, exercise, repo, stop, outputs=False)
        if lecture is not None:
            sources += _sources(lecture, _load(lecture), repo, None, outputs=True)
        sources.append(("README.md", readme))
        task = _TASK.search(_text(nb["cells"][task_at]["source"]))
        leaks += find_leaks(f"{_rel(solution, repo)}, Task {task.group(1)}", literals, sources)
    return leaks


# Literals an answer shares with an earlier cell that are not the answer given away: a coincidence, or a
# figure the answer cites as its evidence rather than the result it asks for. (answer, literal): why.
KNOWN: dict[tuple[str, str], str] = {
    **{("notebooks/01_decode_is_memory_bound.ipynb, check your understanding", ridge): "the H100's ridge point, "
       "which section 2 prints and question 1 builds on; the answer is the batch size"
       for ridge in ("118", "296")},
    ("notebooks/04_gpt2_pair.ipynb, check your understanding", "1.11"):
        "question 4's speedup 2.44 / 2.2 coincides with a bound of a timing interval in section 6",
    ("notebooks/07_when_speculation_hurts.ipynb, check your understanding", "3.36"):
        "E(0.8, 4), an input of the answer that section 1 computes; the answer is the speedup made from it",
    **{("solutions/ex05_prompt_lookup.ipynb, Task 6", tau): "the ablation's tau values, which notebook 05 prints; "
       "the task asks for the explanation (flagged to the exercise's owner)"
       for tau in ("1.35", "1.64", "3.12", "4.57")},
}


def lint_all(repo: Path = REPO, known: dict[tuple[str, str], str] | None = None) -> list[Leak]:
    """Every leak in the lectures and the exercises, less those `known` (default: KNOWN) explains."""
    known = KNOWN if known is None else known
    leaks = []
    for path in sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        leaks += lint_lecture(path, repo)
    for path in sorted((repo / "solutions").glob("ex[0-9][0-9]_*.ipynb")):
        leaks += lint_exercise(path, repo)
    return [leak for leak in leaks if (leak.answer, leak.literal) not in known]


def main() -> int:
    leaks = lint_all()
    for leak in leaks:
        print(leak)
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
