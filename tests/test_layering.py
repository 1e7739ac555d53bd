"""specref is a house with floors: a module imports only from its own floor or below, and nothing imports in a circle.

The import graph is read from the source with `ast` (`tools/upkeep/house.py`: imports inside
functions count; relative imports are resolved), so a lazy import cannot hide a cycle or a reach upwards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specref"
sys.path.insert(0, str(PACKAGE.parent / "tools" / "upkeep"))
from house import cycles_in, import_graph, wing_graph  # noqa: E402 - the one reader of the import graph

# The floor order, written down once: lowest first. A module's floor is the first entry whose
# prefix names it. checks and perf share a floor; the package's own __init__ gathers the public
# names from every floor but the course; `python -m specref` (__main__) belongs to the course.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("rules", ("specref._validate", "specref._lazy", "specref.sampling", "specref.rejection", "specref.chain_verify",
               "specref.trees", "specref.theory", "specref.typical", "specref.timing", "specref.tree_shapes")),
    ("models", ("specref.models",)),
    ("drafts", ("specref.drafts",)),
    ("decoding", ("specref.decoding",)),
    ("checks, perf", ("specref.checks", "specref.perf")),
    ("package", ("specref",)),
    ("course", ("specref.course", "specref.__main__")),
]
# Who may import the course: the course itself (and `python -m specref`). The package __init__ may not.
COURSE = "course"


def floor_of(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            # The package root names only itself: every other module must be placed on a floor.
            if module == prefix or (prefix != "specref" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS")
    return best[0]


GRAPH = import_graph(PACKAGE)


def test_the_graph_sees_lazy_and_relative_imports():
    assert "specref.sampling" in GRAPH["specref.trees"]  # a relative import at the top
    assert "specref.rejection" in GRAPH["specref.course.doctor"]  # `from .. import rejection` inside a function


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_every_module_is_on_a_floor(module):
    floor_of(module)


def test_no_module_imports_from_a_higher_floor():
    upward = [
        f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})"
        for m, targets in GRAPH.items()
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
        # a package's __init__ gathers its own modules
        and not t.startswith(m + ".")
    ]
    assert not upward, "imports reach up a floor:\n" + "\n".join(upward)


def test_only_the_course_imports_the_course():
    course = [i for i, (name, _) in enumerate(FLOORS) if name == COURSE][0]
    outside = [f"{m} imports {t}" for m, targets in GRAPH.items() for t in targets
               if floor_of(t) == course and floor_of(m) != course]
    assert not outside, "\n".join(outside)


def test_there_is_no_import_cycle():
    # A package's __init__ importing its own modules, which import a sibling through the package, is
    # still a cycle: import the sibling module directly.
    cycles = cycles_in(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_wings_import_in_no_circle():
    # Read a level up, as a newcomer reads the house: one wing per top-level entry (a subpackage or a
    # module). A module kept at an old path that imports its new home on a higher floor would show here.
    wings = wing_graph(GRAPH)
    assert len(wings) >= 14
    cycles = cycles_in(wings)
    assert not cycles, "wings that import each other:\n" + "\n".join(cycles)


def test_the_circle_check_sees_a_circle():
    assert cycles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert cycles_in({"a": {"b"}, "b": set()}) == []


def _walk():
    import walk  # tools/upkeep, on the path above

    return walk


@pytest.mark.parametrize("draft", ["model", "eagle", "medusa"])
def test_a_tree_step_never_calls_back_up_into_the_draft(draft):
    # The draft drives its tree's growth (a TreeGrower) and calls down only: no rule on a lower floor
    # calls the draft's code back, as a grow_trees callback once did every depth.
    walk = _walk()
    floors, circles = walk.wing_floors(PACKAGE)
    assert circles == []
    wings, _, climbs = walk.count(walk.walk_step(draft), floors)
    assert "drafts" in wings and "tree_shapes" in wings
    assert climbs == 0, " > ".join(wings)


def test_the_walk_counts_a_callback_as_a_climb_and_a_second_visit_as_a_return():
    walk = _walk()
    floors = {"drafts": 5, "tree_shapes": 4, "trees": 3}
    events = [("drafts", "call"), ("tree_shapes", "call"), ("drafts", "call"), ("tree_shapes", "return"),
              ("trees", "call"), ("tree_shapes", "return")]
    wings, returns, climbs = walk.count(events, floors)
    assert wings == ["drafts", "tree_shapes", "drafts", "tree_shapes", "trees", "tree_shapes"]
    assert (returns, climbs) == (3, 1)


# -- the grading package: outside specref, in no circle --------------------------------------------------------
GRADING = PACKAGE.parent / "specref_grading"
GRADING_GRAPH = import_graph(GRADING)


def test_specref_never_imports_the_grader():
    # The learner's jailed kernel sees specref and never the grading package: nothing in specref may need it.
    import ast

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.relative_to(PACKAGE.parent)}: {n}" for n in names if n.split(".")[0] == "specref_grading"]
    assert not found, "\n".join(found)


def test_the_grading_package_imports_in_no_circle():
    assert "specref_grading.trust.wall" in GRADING_GRAPH["specref_grading.grade"]  # the reader sees the package
    cycles = cycles_in(GRADING_GRAPH)
    assert not cycles, "import cycles in specref_grading:\n" + "\n".join(cycles)
    wings = cycles_in(wing_graph(GRADING_GRAPH))
    assert not wings, "wings of specref_grading that import each other:\n" + "\n".join(wings)
