"""Find development history in text a learner reads.

A notebook, an exercise and the learner's part of the README are for the learner: no dates of runs, no
issue numbers, no goal lines ("met" / "NOT met"), no "host", no "the machine the course was written on",
no "earlier run", "a day later" or "this session". `problems_in_text` finds such phrases in a piece of
text; `notebook_texts` and `readme_learner_text` pick out what a learner reads; `lint_notebook` and
`lint_readme` put the two together.

Code carries no history either: in the package, the grader, the tests, the tools and the benchmarks, every
comment and docstring of a `.py` file (`python_texts`, `lint_python`) is checked for the kinds in
`CODE_KINDS`: dates, issue numbers, runs of other days and sessions. Not the learner-only kinds: "host" is the
CPU side of a device in code, and a benchmark prints its goal verdicts live. History has one home,
benchmarks/history/ (and benchmarks/README.md, not a `.py` file); `CODE_EXEMPT` are the linter and its test,
which quote what they forbid.

What a learner reads in a notebook: every markdown cell, every comment in a code cell, and every printed
output (streams, text/plain, text/markdown, text/html). Cell metadata (execution timestamps) is not
shown by Jupyter and is not checked.

Usage: python tools/upkeep/learner_text.py [FILE ...]  (no files: the notebooks, solutions, exercises, README and
the `.py` files of `code_files`).
Exits 1 if anything was found.
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)

# (name, pattern). Month names are matched case-sensitively ("may 3" is English, "May 3" a date);
# everything else ignores case unless it says otherwise.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("a date", re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")),
    ("a date", re.compile(rf"\b(?:{_MONTHS})\.? [0-3]?\d(?:st|nd|rd|th)?\b(?!\.\d)")),
    ("a date", re.compile(rf"\b[0-3]?\d(?:st|nd|rd|th)? (?:{_MONTHS})\b")),
    ("an issue number", re.compile(r"\b(?:issue|ticket|PR|pull request)s? ?#?\d+", re.IGNORECASE)),
    ("a goal line", re.compile(r"\bNOT met\b")),
    ("a goal line", re.compile(r"\bgoals?\b[^.\n]{0,60}?\b(?:met|missed)\b", re.IGNORECASE)),
    # "met:" / "(met)" / "[met]" / "| met" as a verdict, at the start of a line or in brackets.
    ("a goal line", re.compile(r"(?:^|[(\[|]) *met *(?:$|[:)\]|])", re.IGNORECASE | re.MULTILINE)),
    ("'written on'", re.compile(r"\bwritten on\b", re.IGNORECASE)),
    ("how the course was made", re.compile(r"\bcourse was (?:written|made|built|developed|run)\b", re.IGNORECASE)),
    # "host" as English, not as an identifier in printed code (`host=''`, `self.host`, `host_name`).
    ("'host'", re.compile(r"(?<![\w.'\"])hosts?(?![\w'\"=(.])", re.IGNORECASE)),
    ("a VM", re.compile(r"\bVMs?\b")),
    ("an earlier run", re.compile(r"\b(?:earlier|previous|older|last|first|second|yesterday's) runs?\b(?! (?:of|through|over|with) (?:the|this|a|each|every) )", re.IGNORECASE)),
    # In code the first, second or last run of a loop is no history: only the runs before this one are.
    ("an earlier run in code", re.compile(r"\b(?:earlier|previous|older|yesterday's) runs?\b(?! (?:of|through|over|with) (?:the|this|a|each|every) )", re.IGNORECASE)),
    ("another day", re.compile(r"\b(?:a|one) day later\b|\bthe (?:next|same|second|other) day\b|\byesterday\b|\bsame-day\b", re.IGNORECASE)),
    ("a session", re.compile(r"\b(?:this|that|last|previous|earlier|next|another) session\b", re.IGNORECASE)),
    ("a stop", re.compile(r"\bstop \d+\b", re.IGNORECASE)),
    ("a review", re.compile(r"\breview mend\b|\bthe reviewer\b", re.IGNORECASE)),
]

# What code may not say (`problems_in_text(..., kinds=CODE_KINDS)`); "an earlier run" is the learner's kind only.
CODE_KINDS = ("a date", "an issue number", "an earlier run in code", "another day", "a session", "'written on'",
              "how the course was made", "a review")
LEARNER_KINDS = tuple(kind for kind, _ in PATTERNS if kind != "an earlier run in code")

# The code folders, and what under them is left out: history's home, and the linter and its test.
CODE_ROOTS = ("specref", "specref_grading", "tests", "tools", "benchmarks")
CODE_HISTORY = ("benchmarks/history",)
CODE_EXEMPT = ("tools/upkeep/learner_text.py", "tests/test_learner_text.py")

# The README's sections a learner or an instructor reads (the text before the first `## ` heading counts
# too). "For contributors" is for people working on the project: benchmark history and timings of the
# test suite on named machines belong there, not here.
README_LEARNER_SECTIONS = ("Quick start", "For learners", 'What "verified" means here', "For instructors")


@dataclass(frozen=True)
class Problem:
    where: str  # "cell 7 markdown", "cell 3 output", "README: For learners"
    kind: str  # the pattern's name
    text: str  # the line it was found in

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.text.strip()[:160]!r}"


def problems_in_text(text: str, where: str = "", kinds: tuple[str, ...] | None = None) -> list[Problem]:
    """Every phrase of development history in `text`, one Problem per (line, kind); `kinds` (default: what a
    learner may not read, `LEARNER_KINDS`) picks the patterns."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    wanted = LEARNER_KINDS if kinds is None else kinds
    unknown = set(wanted) - {kind for kind, _ in PATTERNS}
    if unknown:
        raise ValueError(f"kinds must be names of PATTERNS, got {sorted(unknown)}")
    found: list[Problem] = []
    for line in text.splitlines() or [text]:
        kinds = []
        for kind, pattern in PATTERNS:
            if kind in wanted and kind not in kinds and pattern.search(line):
                kinds.append(kind)
        found += [Problem(where, kind, line) for kind in kinds]
    return found


def code_comments(source: str) -> str:
    """The comments of a code cell, one per line. Lines Python cannot tokenize fall back to '#...'."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return "\n".join(
            tok.string for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
            if tok.type == tokenize.COMMENT
        )
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "\n".join(m.group(0) for line in lines for m in [re.search(r"#.*", line)] if m)


def _output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return _joined(output.get("text", ""))
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    parts = [_joined(data[kind]) for kind in ("text/plain", "text/markdown") if kind in data]
    if "text/html" in data:
        parts.append(re.sub(r"<[^>]+>", " ", _joined(data["text/html"])))
    return "\n".join(parts)


def _joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def notebook_texts(nb: dict) -> Iterator[tuple[str, str]]:
    """(where, text) for everything a learner reads in a notebook given as parsed JSON."""
    if not isinstance(nb, dict) or "cells" not in nb:
        raise ValueError("nb must be a notebook's parsed JSON (a dict with 'cells')")
    for i, cell in enumerate(nb["cells"]):
        source = _joined(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            yield f"cell {i} markdown", source
        elif cell.get("cell_type") == "code":
            yield f"cell {i} comment", code_comments(source)
            for output in cell.get("outputs", []):
                yield f"cell {i} output", _output_text(output)


def lint_notebook(path: Path | str) -> list[Problem]:
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [p for where, text in notebook_texts(nb) for p in problems_in_text(text, f"{path.name} {where}")]


def readme_learner_text(readme: str) -> list[tuple[str, str]]:
    """(section, text) for the README's learner sections: the text before the first `## ` heading and each
    section named in README_LEARNER_SECTIONS (up to the next `## `). A named section that is missing is an
    error, so renaming one cannot silently switch the check off."""
    parts = re.split(r"(?m)^## +(.+?) *$", readme)
    sections = [("introduction", parts[0])] + list(zip(parts[1::2], parts[2::2]))
    names = [name for name, _ in sections]
    missing = [s for s in README_LEARNER_SECTIONS if s not in names]
    if missing:
        raise ValueError(f"README has no section {missing}; update README_LEARNER_SECTIONS in tools/upkeep/learner_text.py")
    return [(name, text) for name, text in sections if name == "introduction" or name in README_LEARNER_SECTIONS]


def lint_readme(path: Path | str = REPO / "README.md") -> list[Problem]:
    text = Path(path).read_text(encoding="utf-8")
    return [p for name, section in readme_learner_text(text) for p in problems_in_text(section, f"README: {name}")]


def python_texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) for every comment and every docstring (a string standing as a statement) of Python source."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def lint_python(path: Path | str, repo: Path = REPO) -> list[Problem]:
    """History in a `.py` file's comments and docstrings (`CODE_KINDS`), each where = "path:line"."""
    path = Path(path)
    name = path.resolve().relative_to(repo.resolve()).as_posix() if path.resolve().is_relative_to(repo.resolve()) \
        else str(path)
    return [p for line, text in python_texts(path.read_text(encoding="utf-8"))
            for p in problems_in_text(text, f"{name}:{line}", CODE_KINDS)]


def code_files(repo: Path = REPO) -> list[Path]:
    """The `.py` files of CODE_ROOTS, less history's home (CODE_HISTORY) and the linter and its test (CODE_EXEMPT)."""
    out = []
    for root in CODE_ROOTS:
        for p in sorted((repo / root).rglob("*.py")):
            rel = p.relative_to(repo).as_posix()
            if rel in CODE_EXEMPT or any(rel.startswith(h + "/") for h in CODE_HISTORY) or "__pycache__" in rel:
                continue
            out.append(p)
    return out


def learner_files(repo: Path = REPO) -> list[Path]:
    """The notebooks a learner opens: lectures, exercises and their solutions."""
    return sorted(p for folder in ("notebooks", "exercises", "solutions") for p in (repo / folder).glob("*.ipynb"))


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or [*learner_files(), REPO / "README.md", *code_files()]
    lint = {".md": lint_readme, ".py": lint_python}
    problems = [p for f in files for p in lint.get(f.suffix, lint_notebook)(f)]
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in {len(files)} file(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
