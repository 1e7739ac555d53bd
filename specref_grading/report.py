"""What a grading found: each test's outcome and points, the notes, the status and the exit code.

A test's flags come from the trusted side only (e.g. a function that modified the objects a check passed in):
a flagged test scores 0 and the grading "needs review" (exit 3). What the scanner noticed in an answer's source
is a note (`Report.notes`), for the instructor: it never withholds a point nor changes the exit status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_FULL, EXIT_FAILED, EXIT_UNGRADABLE, EXIT_REVIEW = 0, 1, 2, 3
STATUS = {EXIT_FULL: "full marks", EXIT_FAILED: "some checks failed", EXIT_UNGRADABLE: "could not be graded",
          EXIT_REVIEW: "NEEDS REVIEW"}


def status_text(exit_code: int, pending: float = 0.0) -> str:
    """The status in words; points that await hand grading are named, and "full marks" is never said while any do."""
    if not pending or exit_code == EXIT_UNGRADABLE:
        return STATUS[exit_code]
    awaits = f"{pending:g} point{'s' if pending != 1 else ''} await{'s' if pending == 1 else ''} hand grading"
    return f"autograded checks passed, {awaits}" if exit_code == EXIT_FULL else f"{STATUS[exit_code]}; {awaits}"


def as_data(text: object, lines: bool = False) -> str:
    """A learner's string as data, the one escaping of everything written or shown (console, CSV, sheets,
    feedback): every character that is not printable is written as its Python escape (``\\x1b``, ``\\u202e``, a
    lone surrogate ``\\udcff``, ``\\r``, ``\\n`` and ``\\t`` too), so that it can neither redraw the console,
    forge a line, nor fail to encode as UTF-8. `lines` keeps newlines and tabs (a message or an answer shown as
    a block); a one-line field (a file name, a status) never keeps them."""
    keep = "\n\t" if lines else ""
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in str(text))


def printable(text: str) -> str:
    """Text for a terminal or a block of feedback: `as_data` keeping newlines and tabs."""
    return as_data(text, lines=True)


@dataclass
class TestResult:
    grade_id: str
    points: float
    outcome: str
    message: str = ""
    flags: list[str] = field(default_factory=list)  # raised by the trusted side: the points wait for review

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
    notes: list[str] = field(default_factory=list)  # ignored or changed parts of the submission, scanner notes
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
        lines = [f"{as_data(self.path)}: exercise {as_data(self.exercise or '?')}" + (f" (tests {self.version}" if self.version else "")
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


