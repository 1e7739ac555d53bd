"""The plan of one grading: what runs comes from the solution, the learner supplies only the answers.

The solution decides the cells, their order and the tests (hidden tests included); from the submission only
the source of each answer cell is taken, found by grade_id (or cell id). Everything else in the submission is
ignored and listed in the notes. What the scanner (`scan`) notices in an answer cell is listed in the notes too,
for the instructor: it never withholds points, since the answers run in a kernel apart from the tests. Hidden
tests draw their cases from ``HIDDEN_SEED``, which the grader binds at
the top of every test cell that reads it; test cells run only in the trusted process.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from specref_grading.exercises import MarkerError, left_out, strip_regions, tests_version
from specref_grading.notebook import (
    MAX_ANSWER_CHARS,
    GradeError,
    exercise_id,
    is_answer,
    is_test,
    nbgrader,
    source,
    stamp,
)
from specref_grading.scan import helper_names, imported_specref_names, names_bound, names_used
from specref_grading.trust import kernel_tree
from specref_grading.trust.reading import read_answers

DEFAULT_HIDDEN_SEED = 1  # what the solutions' setup cells set HIDDEN_SEED to (a test keeps them equal)


@dataclass
class TestSpec:
    n: int  # the test cell's index in the solution
    grade_id: str
    points: float
    source: str
    saved_passing: bool | None = None  # what the submission's saved output of this cell showed
    depends: set[int] = field(default_factory=set)  # solution indices of the answer cells it uses


@dataclass
class Plan:
    exercise: str
    version: str
    cells: list[dict]  # {"n", "role", "grade_id", "source"} in the solution's order; tests included (with "asks": the
    # names of the exercise's answers they read, all they may ask of the kernel); role: checks,
    # setup (with "kernel_source", "serve" and "forbidden": kernel_tree.prepare), answer, other, test or demo (a given
    # cell that uses what the kernel lacks, the reference: not run in grading, kernel_tree.prepare)
    tests: list[TestSpec]
    manual: list[tuple[str, float, str]]  # (grade_id, points, the learner's text)
    notes: list[str]  # what was ignored or changed in the submission, and the scanner's notes on the answers
    syntax: dict[int, str]
    seed: int = DEFAULT_HIDDEN_SEED  # HIDDEN_SEED in the test cells
    forbidden: tuple[str, ...] = ()  # what the kernel's specref lacks (kernel_tree.prepare; also each setup cell's)


def _find_answer(sub_cells: list[dict], ref: dict, gid: str, notes: list[str]) -> dict | None:
    by_gid = [c for c in sub_cells if nbgrader(c).get("grade_id") == gid]
    if not by_gid and isinstance(ref.get("id"), str):
        by_gid = [c for c in sub_cells if c.get("id") == ref["id"]]
    if not by_gid:
        return None
    best = next((c for c in by_gid if c.get("cell_type") == ref.get("cell_type") and c.get("id") == ref.get("id")),
                next((c for c in by_gid if c.get("cell_type") == ref.get("cell_type")), by_gid[0]))
    if len(by_gid) > 1:
        notes.append(f"{len(by_gid)} cells claim grade_id {gid!r}: the one with cell id {best.get('id')!r} was "
                     "graded, the others were ignored")
    if best.get("cell_type") != ref.get("cell_type"):
        notes.append(f"answer {gid!r} was turned into a {best.get('cell_type')} cell; it was graded as "
                     f"{ref.get('cell_type')}")
    return best


def _saved_output_passing(cell: dict) -> bool | None:
    outs = cell.get("outputs")
    if not isinstance(outs, list) or not outs:
        return None if cell.get("execution_count") is None else True
    return not any(isinstance(o, dict) and o.get("output_type") == "error" for o in outs)


def checks_cell(cell: dict) -> bool:
    """A setup cell of the checks' imports (``metadata.specref.side == "checks"``): it runs in the trusted process
    only, never in the learner's kernel (the learner's own Jupyter runs it as usual)."""
    meta = cell.get("metadata", {}).get("specref")
    return cell.get("cell_type") == "code" and isinstance(meta, dict) and meta.get("side") == "checks"


def hidden_seed(value: str | int) -> int:
    """The seed of the hidden tests from --seed: an int in [1, 2**63), or "random" for a fresh one of 63 bits
    (printed in the report): too many to try offline, so what learner code sees cannot be matched to a seed."""
    if isinstance(value, str) and value.strip().lower() == "random":
        return 1 + secrets.randbelow(2**63 - 1)
    try:
        seed = int(value)
    except (TypeError, ValueError):
        raise GradeError(f"--seed must be an integer >= 1 or 'random', got {value!r}") from None
    if isinstance(value, bool) or not 1 <= seed < 2**63:
        raise GradeError(f"--seed must be in [1, 2**63) (0 is the visible cases' seed), got {value!r}")
    return seed


def with_seed(source: str, seed: int) -> str:
    """A test cell's source as the grader runs it: HIDDEN_SEED bound on the line before, if the cell reads it."""
    return f"HIDDEN_SEED = {seed}\n{source}" if "HIDDEN_SEED" in names_used(source) else source


def _answer_text(sub_cells: list[dict], ref: dict, gid: str, i: int, solution_name: str,
                 notes: list[str]) -> tuple[dict | None, str]:
    """(the submission's cell answering `ref`, or None; the text graded: its source, or the solution's stub), the
    text refused above MAX_ANSWER_CHARS before anything parses it (GradeError: the notebook could not be graded)."""
    got = _find_answer(sub_cells, ref, gid, notes)
    try:
        stub = strip_regions(source(ref), ref.get("cell_type", "code"), f"{solution_name}: cell {i}")
    except MarkerError as e:
        raise GradeError(f"the solution is broken: {e}") from e
    text = source(got) if got is not None else stub
    if len(text) > MAX_ANSWER_CHARS:  # before any parse: the parser takes ~200 bytes per byte of source
        raise GradeError(f"answer cell {gid!r} is {len(text)} characters long, more than the "
                         f"{MAX_ANSWER_CHARS} an answer may be: it was not read")
    return got, text


def build_plan(solution: dict, submission: dict, solution_name: str = "solution",
               seed: int = DEFAULT_HIDDEN_SEED) -> Plan:
    """What runs, from the solution; from the submission only its answers' text, each refused above
    MAX_ANSWER_CHARS before it is parsed, and parsed only in a limited process (`trust.reading.read_answers`);
    GradeError: the notebook could not be graded."""
    sol_cells, sub_cells = solution["cells"], submission["cells"]
    notes: list[str] = []
    eid, ver = stamp(submission)
    version = tests_version(solution)
    if ver is not None and ver != version:
        notes.append(f"this notebook was made for an older version of the exercise ({ver}); it was graded with "
                     f"today's tests ({version})")
    first_answer = next((i for i, c in enumerate(sol_cells) if is_answer(c)), len(sol_cells))
    setup_sources = [source(c) for i, c in enumerate(sol_cells) if i < first_answer and c.get("cell_type") == "code"]
    # The exercise's own code (setup and the given cells, not answers or tests): what it takes from specref, and
    # what it uses before each answer, which that answer may use too (ex07's server_rows(), ex08's SAMPLERS). Given
    # cells after an answer are not counted: they compare the learner's result with the reference (ex06).
    given = [(i, source(c)) for i, c in enumerate(sol_cells)
             if c.get("cell_type") == "code" and not is_answer(c) and not is_test(c)]
    specref_names = imported_specref_names([src for _, src in given])
    helpers = helper_names(setup_sources) & specref_names  # TorchRNG, exact_distribution, distribution_test, ...
    cells: list[dict] = []
    tests: list[TestSpec] = []
    manual: list[tuple[str, float, str]] = []
    syntax: dict[int, str] = {}
    used_ids: set[int] = set()
    bound: dict[int, set[str]] = {}
    unknown: set[int] = set()  # answers that may bind any name (exec, globals(), ...): see binds_unknown
    uses: dict[int, set[str]] = {}
    # The answers' code, read in one limited process: each with the specref names it may use without a note (its
    # solution's, the exercise's helpers and what the given cells before it show).
    texts: dict[str, str] = {}
    allowed: dict[str, set[str]] = {}
    for i, ref in enumerate(sol_cells):
        if is_answer(ref) and ref.get("cell_type") == "code":
            _, texts[str(i)] = _answer_text(sub_cells, ref, nbgrader(ref).get("grade_id", f"cell-{i}"), i,
                                            solution_name, [])
            shown = set().union(*(names_used(src) for j, src in given if j < i)) & specref_names
            allowed[str(i)] = (names_used(source(ref)) & specref_names) | helpers | shown
    facts = read_answers(texts, specref_names, allowed)
    for i, ref in enumerate(sol_cells):
        meta = nbgrader(ref)
        gid = meta.get("grade_id", f"cell-{i}")
        if is_answer(ref):
            got, text = _answer_text(sub_cells, ref, gid, i, solution_name, notes)
            if got is not None:
                used_ids.add(id(got))
            if got is None:
                notes.append(f"answer cell {gid!r} is missing from the notebook: it was graded as unanswered")
            if ref.get("cell_type") != "code" or meta.get("grade"):
                # A graded answer cell (markdown, or code carrying its own points) is the learner's
                # text through and through: nothing in it can be trusted to grade itself.
                if meta.get("grade"):
                    manual.append((gid, float(meta.get("points", 0) or 0), text))
                if ref.get("cell_type") != "code":
                    continue
            fact = facts[str(i)]
            if fact["syntax"] is not None:
                line, msg = fact["syntax"]
                syntax[i] = (f"syntax error in answer cell {gid!r}, line {line}: {msg}" if line is not None else
                             f"answer cell {gid!r} cannot be read as Python: {msg}")
            # Notes only: across the wall an answer changes nothing but its own kernel (module docstring).
            notes.extend(f"answer cell {gid!r}, line {line}: {note}" for line, note in fact["findings"])
            bound[i], uses[i] = set(fact["bound"]), set(fact["used"])
            if fact["unknown"]:
                unknown.add(i)
            cells.append({"n": i, "role": "answer", "grade_id": gid, "source": text})
        elif is_test(ref):
            spec = TestSpec(i, gid, float(meta.get("points", 0) or 0), source(ref))
            mine = [c for c in sub_cells if nbgrader(c).get("grade_id") == gid]
            if len(mine) > 1:
                notes.append(f"{len(mine)} cells claim test grade_id {gid!r}: the exercise's test ran once, the "
                             "copies were ignored")
            if mine:
                used_ids.update(id(c) for c in mine)
                spec.saved_passing = _saved_output_passing(mine[0])
                if source(mine[0]).strip() and source(mine[0]).strip() not in source(ref):
                    notes.append(f"your copy of test cell {gid!r} differs from the exercise's; the exercise's "
                                 "tests were run")
            tests.append(spec)
            cells.append({"n": i, "role": "test", "grade_id": gid, "source": with_seed(spec.source, seed)})
        elif ref.get("cell_type") == "code" and not left_out(ref):  # a solution_only cell is not the exercise's
            try:
                text = strip_regions(source(ref), "code", f"{solution_name}: cell {i}")
            except MarkerError as e:
                raise GradeError(f"the solution is broken: {e}") from e
            role = "other" if i >= first_answer else "checks" if checks_cell(ref) else "setup"
            cells.append({"n": i, "role": role, "grade_id": None, "source": text})
    # What the submission has that the exercise does not.
    sol_gids = {nbgrader(c).get("grade_id") for c in sol_cells if nbgrader(c)}
    for j, c in enumerate(sub_cells):
        m = nbgrader(c)
        if id(c) in used_ids:
            ref = next((r for r in sol_cells if nbgrader(r).get("grade_id") == m.get("grade_id")), None)
            if ref is not None and any(m.get(k) != nbgrader(ref).get(k) for k in ("grade", "points", "solution")):
                notes.append(f"cell {j} ({m.get('grade_id')!r}): edited grading metadata was ignored")
            continue
        if m.get("grade") and m.get("grade_id") not in sol_gids:
            notes.append(f"cell {j}: graded cell {m.get('grade_id')!r} is not part of the exercise; ignored")
        elif c.get("cell_type") == "code" and source(c).strip() and not m:
            if not any(source(c).strip() == source(r).strip() for r in sol_cells):
                notes.append(f"cell {j}: code outside the answer cells is not run by the grader "
                             "(put what your answers need into the answer cells)")
    if any(c.get("cell_type") == "code" and c.get("outputs") for c in sub_cells):
        notes.append("the outputs saved in the notebook were ignored: every cell was run again from scratch")
    # Which answers each test uses: names, followed through the answers that define them.
    for t in tests:
        want, seen = set(names_used(t.source)), set()
        while True:
            new = {i for i in bound if (bound[i] & want or i in unknown) and i < t.n} - seen
            if not new:
                break
            seen |= new
            for i in new:
                want |= uses[i]
        t.depends = seen
    if not tests and not manual:
        raise GradeError(f"{solution_name} has no graded cells (metadata.nbgrader.grade)")
    # What the kernel runs of the setup, and what the trusted process serves it (kernel_tree.prepare): the names
    # the exercise's own kernel code uses (setup, given cells, the solution's answers), never the learner's choice.
    kernel_uses = set().union(*(names_used(src) for _, src in given), *(
        names_used(source(c)) for c in sol_cells if is_answer(c) and c.get("cell_type") == "code"))
    # What the kernel lacks and is not served is the answer key: given cells that use it are not run (role "demo").
    defined = set().union(*(names_bound(source(c)) for c in sol_cells if is_answer(c) and c.get("cell_type") == "code"))
    for c in cells:  # what a test may ask of the kernel: the names the exercise's answers bind (trust/trusted.py)
        if c["role"] == "test":
            c["asks"] = sorted(names_used(c["source"]) & defined)
    forbidden = kernel_tree.prepare(cells, kernel_uses, defined=defined)
    return Plan(eid or exercise_id(Path(solution_name)), version, cells, tests, manual, notes, syntax, seed,
                forbidden)


