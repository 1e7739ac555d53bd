"""specref is a house with floors: a module imports only from its own floor or below, and nothing imports in a circle.

The import graph is read from the source with `ast` (imports inside functions count;
relative imports are resolved), so a lazy import cannot hide a cycle or a reach upwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specref"

# The floor order, written down once: lowest first. A module's floor is the first entry whose
# prefix names it. checks and perf share a floor; the package's own __init__ gathers the public
# names from every floor but the course; `python -m specref` (__main__) belongs to the course.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("rules", ("specref._validate", "specref.sampling", "specref.rejection", "specref.trees", "specref.theory",
               "specref.typical", "specref.timing", "specref.tree_shapes")),
    ("models", ("specref.models",)),
    ("drafts", ("specref.drafts",)),
    ("decoding", ("specref.decoding",)),
    ("checks, perf", ("specref.checks", "specref.perf")),
    ("package", ("specref",)),
    ("course", ("specref.course", "specref.__main__")),
]
# Who may import the course: the course itself (and `python -m specref`). The package __init__ may not.
COURSE = "course"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """{module: the specref modules it imports}, from every import statement anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                # `import specref.trees.x` or a name inside a module: the longest known module prefix.
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


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


GRAPH = import_graph()


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


def cycles_in(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk of `graph` meets, as 'a -> b -> a'."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_there_is_no_import_cycle():
    # A package's __init__ importing its own modules, which import a sibling through the package, is
    # still a cycle: import the sibling module directly.
    cycles = cycles_in(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def room(module: str) -> str:
    """The top-level entry of specref a module is in: specref.drafts.model -> drafts, specref.trees -> trees."""
    return (module.split(".") + ["__init__"])[1]


def test_the_rooms_import_in_no_circle():
    # Read a level up, as a newcomer reads the house: one room per top-level entry (a subpackage or a
    # module). A module kept at an old path that imports its new home on a higher floor would show here.
    rooms: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        rooms.setdefault(room(m), set()).update(room(t) for t in targets if room(t) != room(m))
    assert len(rooms) >= 14
    cycles = cycles_in(rooms)
    assert not cycles, "rooms that import each other:\n" + "\n".join(cycles)


def test_the_circle_check_sees_a_circle():
    assert cycles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert cycles_in({"a": {"b"}, "b": set()}) == []


def _walk():
    import sys

    sys.path.insert(0, str(PACKAGE.parent / "tools" / "upkeep"))
    import walk

    return walk


@pytest.mark.parametrize("draft", ["model", "eagle", "medusa"])
def test_a_tree_step_never_calls_back_up_into_the_draft(draft):
    # The draft drives its tree's growth (a TreeGrower) and calls down only: no rule on a lower floor
    # calls the draft's code back, as a grow_trees callback once did every depth.
    walk = _walk()
    floors, circles = walk.room_floors(PACKAGE)
    assert circles == []
    rooms, _, climbs = walk.count(walk.walk_step(draft), floors)
    assert "drafts" in rooms and "tree_shapes" in rooms
    assert climbs == 0, " > ".join(rooms)


def test_the_walk_counts_a_callback_as_a_climb_and_a_second_visit_as_a_return():
    walk = _walk()
    floors = {"drafts": 5, "tree_shapes": 4, "trees": 3}
    events = [("drafts", "call"), ("tree_shapes", "call"), ("drafts", "call"), ("tree_shapes", "return"),
              ("trees", "call"), ("tree_shapes", "return")]
    rooms, returns, climbs = walk.count(events, floors)
    assert rooms == ["drafts", "tree_shapes", "drafts", "tree_shapes", "trees", "tree_shapes"]
    assert (returns, climbs) == (3, 1)
