"""Kernel to answer key: the learner's kernel holds no reference for the task it asks, under any name.

Its specref is an allow-list copy made for the exercise (specref_grading/trust/kernel_tree.py): what the exercise's
kernel code imports and its import-time closure, whole modules, without a forbidden module or what needs one; the
jail binds it where specref lies; what the setup gives the learner that the copy lacks is served from the trusted
process. A reference under another name (ex08's samplers, the lectures' views for ex02) scores nothing, and the
red team's routes to the reference (module attributes, hooks on every module, weights written into the checks'
model, the course's own distribution test) gain nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specref.checks.samplers import _residual
from specref_grading.checks import accept_reject as A
from specref_grading.grade import grade as grade_path
from specref_grading.notebook import source
from specref_grading.processes import can_jail
from specref_grading.trust import kernel_tree

from .conftest import (
    REPO,
    assert_no_marks_silently,
    attacked,
    exercise,
    grade,
    grade_exercise,
    jailed,
    make_exercise,
    scores,
    toy_solution,
    with_answer,
)

SOLUTIONS = sorted((REPO / "solutions").glob("ex*.ipynb"))


def _forbidden(solution: Path) -> tuple[str, ...]:
    nb = json.loads(solution.read_text())
    return kernel_tree.forbidden_for([source(c) for c in nb["cells"] if c.get("cell_type") == "code"])


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "src" / "specref"
    (pkg / "sub").mkdir(parents=True)
    shutil.copyfile(kernel_tree.specref_dir() / "_lazy.py", pkg / "_lazy.py")  # the package's own lazy names
    (pkg / "__init__.py").write_text('from ._lazy import lazy_names\n\n'
                                     '_LAZY: dict[str, str] = {"answer": "specref.answer_key", "helper": "specref.rules"}\n'
                                     '__all__ = ["answer", "helper"]\n'
                                     '__getattr__, __dir__ = lazy_names(__name__, _LAZY)\n')
    (pkg / "answer_key.py").write_text("def answer():\n    return 42\n")
    (pkg / "rules.py").write_text("def helper():\n    return 7\n")
    (pkg / "needs.py").write_text("from specref import answer\n\nX = answer()\n")
    (pkg / "lazy_needs.py").write_text("def f():\n    from .answer_key import answer\n\n    return answer()\n")
    (pkg / "keeps.py").write_text("from .rules import helper\n")
    (pkg / "unrelated.py").write_text("SECRET = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("from ..needs import X\n")
    (pkg / "data.bin").write_bytes(b"\0" * 16)
    (pkg / "assets").mkdir()
    (pkg / "assets" / "model.bin").write_bytes(b"\1" * 8)
    return pkg


ALL = ("specref.answer_key", "specref.keeps", "specref.lazy_needs", "specref.needs", "specref.rules",
       "specref.sub.deep", "specref.unrelated")


def _write(pkg: Path, dest: Path, roots, forbidden) -> kernel_tree.Selection:
    selection = kernel_tree.select(kernel_tree.Reading(pkg), roots, forbidden)
    kernel_tree.write_tree(selection, dest)
    return selection


def _python_files(tree: Path) -> set[str]:
    return {p.relative_to(tree).as_posix() for p in tree.rglob("*.py")}


@pytest.mark.grader
def test_the_copy_holds_only_what_the_setup_imports_and_its_import_time_closure(tmp_path):
    pkg = _package(tmp_path)
    dest = tmp_path / "out" / "specref"
    _write(pkg, dest, kernel_tree.roots_for(kernel_tree.Reading(pkg), ["import specref.keeps"]), ())
    assert _python_files(dest) == {"__init__.py", "_lazy.py", "keeps.py", "rules.py", "sub/__init__.py"}
    assert (dest / "assets" / "model.bin").read_bytes() == b"\1" * 8  # a folder of data, no package, comes whole
    assert (dest / "data.bin").read_bytes() == b"\0" * 16  # what is not Python comes whole
    for rel in _python_files(dest):  # a module comes whole: the package's own file
        assert (dest / rel).read_bytes() == (pkg / rel).read_bytes(), rel


@pytest.mark.grader
def test_a_forbidden_module_is_absent_with_what_needs_it_at_import_time(tmp_path):
    pkg = _package(tmp_path)
    dest = tmp_path / "out" / "specref"
    _write(pkg, dest, ALL, ("specref.answer_key",))
    assert not (dest / "answer_key.py").exists() and not list(dest.rglob("answer_key*.pyc"))
    assert not (dest / "needs.py").exists() and not (dest / "sub" / "deep.py").exists()  # to a fixpoint
    assert (dest / "keeps.py").exists() and (dest / "lazy_needs.py").exists()  # an import in a function is not import-time
    assert (dest / "__init__.py").read_bytes() == (pkg / "__init__.py").read_bytes()  # its lazy map unchanged


PROBE_LAZY = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport specref\nfrom specref.rules import helper\n"
              "import specref.keeps\nprint(helper(), hasattr(specref, 'answer'))\ntry:\n"
              "    from specref import answer\n    print(answer())\nexcept ImportError:\n    print('gone')\n")


@pytest.mark.grader
@pytest.mark.parametrize("forbidden, seen", [(("specref.answer_key",), ["7", "False", "gone"]),
                                             ((), ["7", "True", "42"])])  # the negative control
def test_a_lazy_name_whose_module_the_copy_lacks_is_not_there(tmp_path, forbidden, seen):
    pkg = _package(tmp_path)
    dest = tmp_path / "out" / "specref"
    _write(pkg, dest, ALL, forbidden)
    out = subprocess.run([sys.executable, "-I", "-c", PROBE_LAZY, str(dest.parent)], capture_output=True, text=True,
                         check=False)
    assert out.stdout.split() == seen, out.stderr


@pytest.mark.grader
def test_a_forbidden_function_is_an_authoring_error(tmp_path):
    """FORBIDDEN names modules only: a reference answer lives in a module of its own, and nothing is cut out of a
    module."""
    pkg = _package(tmp_path)
    with pytest.raises(kernel_tree.AuthoringError, match="specref.rules.helper is not a module"):
        kernel_tree.select(kernel_tree.Reading(pkg), ALL, ("specref.rules.helper",))
    kernel_tree.select(kernel_tree.Reading(pkg), ALL, ("specref.rules", "specref_grading.checks.x"))  # modules: fine


@pytest.mark.grader
def test_a_whole_forbidden_module_is_absent(tmp_path):
    pkg = _package(tmp_path)
    dest = tmp_path / "out" / "specref"
    _write(pkg, dest, ALL, ("specref.rules",))
    assert not (dest / "rules.py").exists() and not (dest / "keeps.py").exists()
    assert not list(dest.rglob("rules*.pyc"))


@pytest.mark.grader
def test_a_build_goes_into_the_runs_folder_readable_and_compiled(tmp_path):
    pkg = _package(tmp_path)
    tree = kernel_tree.build(("specref.answer_key",), ("specref.keeps",), into=tmp_path / "run", root=pkg)
    assert tree == tmp_path / "run" / "specref" and (tree / "keeps.py").is_file()
    assert list((tree / "__pycache__").glob("keeps.*.pyc"))
    assert all(p.stat().st_mode & 0o777 in (0o644, 0o755) for p in tree.rglob("*"))


def _closure(reading: kernel_tree.Reading, roots) -> set[str]:
    """The import-time closure of `roots` and the package __init__s, read here independently of `select`."""
    wanted, seen = list(roots) + [n for n, m in reading.modules.items() if m.is_pkg], set()
    while wanted:
        name = wanted.pop()
        if name in reading.modules and name not in seen:
            seen.add(name)
            wanted += [d if isinstance(d, str) else d[0] for d in reading.dependencies(reading.modules[name])]
    return seen


def _module_files(names) -> set[str]:
    return {"/".join(n.split(".")[1:] + ["__init__.py"]) if kernel_tree.shared_reading().modules[n].is_pkg
            else "/".join(n.split(".")[1:]) + ".py" for n in names}


@pytest.mark.grader
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_the_written_copy_holds_no_module_outside_the_allow_list(solution, tmp_path):
    """The kernel's tree, as written: its modules are the exercise's roots and their import-time closure, the
    package's own files byte for byte, and none of them is, or lies under, a forbidden module."""
    plan = _plan(solution)
    roots = next(c for c in plan.cells if c["role"] == "setup")["roots"]
    reading = kernel_tree.shared_reading()
    tree = kernel_tree.build(plan.forbidden, roots, into=tmp_path)
    files = _python_files(tree)
    assert files <= _module_files(_closure(reading, roots)), files - _module_files(_closure(reading, roots))
    for rel in files:
        assert (tree / rel).read_bytes() == (reading.root / rel).read_bytes(), rel
    for name in plan.forbidden:  # each reference module is absent, its compiled file too
        if name.startswith("specref."):
            rel = "/".join(name.split(".")[1:])
            assert not (tree / f"{rel}.py").exists() and not (tree / rel).exists(), name
            assert not list((tree / rel).parent.glob(f"__pycache__/{(tree / rel).name}.*.pyc")), name
    assert "__init__.py" in files and "_lazy.py" in files


# An editable install's finder maps every specref module to this checkout, whatever sys.path says: the probe
# removes it, as the jail (the copy bound at the package's own path) and a non-editable install do.
NO_EDITABLE = "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable')]\n"


NAME_PROBE = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
""" + NO_EDITABLE + """
for arg in sys.argv[2:]:
    module, name = arg.split(":")
    try:
        exec(f"from {module} import {name}")
        print(arg, "imports", hasattr(importlib.import_module(module), name))
    except ImportError:
        try:
            print(arg, "absent", hasattr(importlib.import_module(module), name))
        except ImportError:
            print(arg, "absent", False)
"""


@pytest.mark.grader
@pytest.mark.parametrize("exercise, gone, there", [
    ("ex06_trees", ["specref:verify_chain", "specref.chain_verify:verify_chain", "specref:tree_attention_mask",
                    "specref:verify_tree"], ["specref:residual", "specref.tree_shapes:Tree"]),
    ("ex01_roofline", ["specref.perf.roofline:weight_bytes", "specref:CostModel", "specref.perf:costmodel"],
     ["specref.perf.machine:MACHINES", "specref:load_pair", "specref.perf.costs:forward_time"]),
    ("ex05_prompt_lookup", ["specref.decoding.positions:acceptance_by_position", "specref:PromptLookupDraft"],
     ["specref.decoding.record:RecordedStep", "specref:generate"]),
])
def test_the_reference_is_not_a_name_of_the_kernels_specref(exercise, gone, there, tmp_path):
    """In the copy as the kernel imports it, the reference's names are not there (ImportError, hasattr False)
    and the names the exercise gives are; the real package has both (the negative control)."""
    plan = _plan(REPO / "solutions" / f"{exercise}.ipynb")
    tree = kernel_tree.build(plan.forbidden, next(c for c in plan.cells if c["role"] == "setup")["roots"],
                             into=tmp_path)
    for where, absent in ((tree.parent, gone), (kernel_tree.specref_dir().parent, [])):
        out = subprocess.run([sys.executable, "-I", "-c", NAME_PROBE, str(where), *gone, *there],
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr
        lines = set(out.stdout.splitlines())
        for arg in gone + there:
            assert (f"{arg} absent False" if arg in absent else f"{arg} imports True") in lines, (where, out.stdout)


@pytest.mark.grader
def test_a_setup_that_uses_what_the_copy_lacks_is_an_authoring_error():
    cells = [{"n": 0, "role": "setup", "source": "from specref.trees import Tree, tree_attention_mask\n"
                                                 "MASK = tree_attention_mask(Tree([-1], [0]))\n"},
             {"n": 1, "role": "checks", "source": "from specref_grading.checks.trees import check_tree_from_mask\n"}]
    with pytest.raises(kernel_tree.AuthoringError, match="cell 0: the setup uses tree_attention_mask"):
        kernel_tree.prepare(cells, {"tree_attention_mask"})
    cells[0]["source"] = "from specref.trees import Tree, tree_attention_mask\n"  # imported only: a demo may use it
    assert "specref.trees" in kernel_tree.prepare(cells, {"tree_attention_mask"})


@pytest.mark.grader
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_the_real_copy_lacks_every_forbidden_name(solution):
    forbidden = _forbidden(solution)
    reading = kernel_tree.Reading(kernel_tree.specref_dir())
    for name in forbidden:
        if name.startswith("specref."):
            assert not reading.available(forbidden, name), name


@pytest.mark.grader
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_the_real_copy_holds_what_the_exercises_kernel_code_imports_and_no_more(solution):
    plan = _plan(solution)
    setup = next(c for c in plan.cells if c["role"] == "setup")
    selection = kernel_tree.select(kernel_tree.shared_reading(), setup["roots"], plan.forbidden)
    for c in plan.cells:  # every import the kernel runs of the exercise's own cells resolves in the copy
        if c["role"] in ("setup", "other"):
            for node in kernel_tree.nodes_of([c.get("kernel_source", c["source"])]):
                if getattr(node, "module", None) and node.module.split(".")[0] == "specref":
                    for a in node.names:
                        assert selection.available(f"{node.module}.{a.name}"), (c["n"], node.module, a.name)
    reading = selection.reading
    outside = set(reading.modules) - selection.kept
    assert outside, "an allow-list copy leaves out what the exercise does not import"
    assert {"specref.drafts.prompt_lookup", "specref.perf.intervals", "specref.theory"} <= outside | {
        m for m in reading.modules if not m.startswith("specref.")}


@pytest.mark.grader
def test_another_exercises_helper_is_not_in_the_copy():
    """A reference under another name: ex08's samplers (its `_residual`) are not in ex02's copy, which imports
    only the symbolic rng; ex08's copy, whose setup imports them, has them."""
    def copy(stem):
        plan = _plan(REPO / "solutions" / f"{stem}.ipynb")
        setup = next(c for c in plan.cells if c["role"] == "setup")
        return kernel_tree.select(kernel_tree.shared_reading(), setup["roots"], plan.forbidden)
    assert not copy("ex02_accept_reject").available("specref.checks.samplers._residual")
    assert "specref.checks.samplers" not in copy("ex02_accept_reject").kept
    assert "specref.checks.samplers" in copy("ex08_lossless_or_not").kept  # the negative control


@pytest.mark.grader
def test_a_setup_import_of_a_forbidden_name_is_never_served_and_a_moved_class_imported():
    """ex06's setup imports tree_attention_mask, the reference of its Task 6.1: the kernel's copy lacks it, and
    though the exercise's code uses it, it is not served (served, an answer could call it: the answer key)."""
    reading = kernel_tree.shared_reading()
    setup = "from specref.trees import Tree, tree_attention_mask\n"
    selection = kernel_tree.select(reading, kernel_tree.roots_for(reading, [setup]), ("specref.trees",))
    text, served = kernel_tree.kernel_setup(selection, setup, {"tree_attention_mask"})
    assert served == []
    assert "from specref.tree_shapes import Tree" in text and "specref.trees" not in text
    assert "tree_attention_mask" not in text


@pytest.mark.grader
def test_a_name_the_copy_lacks_is_served_only_when_the_exercise_allows_it():
    reading = kernel_tree.shared_reading()
    setup = "from specref.trees import tree_attention_mask\n"
    selection = kernel_tree.select(reading, kernel_tree.roots_for(reading, [setup]), ("specref.trees",))
    assert kernel_tree.kernel_setup(selection, setup, {"tree_attention_mask"},
                                    ("specref.trees.tree_attention_mask",))[1] == ["tree_attention_mask"]
    assert kernel_tree.kernel_setup(selection, setup, set(),  # allowed, but no kernel code uses it
                                    ("specref.trees.tree_attention_mask",))[1] == []


@pytest.mark.grader
def test_allowed_is_read_as_the_check_modules_write_it():
    assert "specref_grading.checks.pitfalls.SAMPLERS" in kernel_tree.allowed_for(
        ["from specref_grading.checks.pitfalls import SAMPLERS"])  # tuple(f"...{n}" for n in (...))
    assert kernel_tree.allowed_for(["from specref_grading.checks.roofline import check_bytes_and_flops"]) == (
        "specref.perf.machine.MACHINES",)  # a literal tuple
    assert "specref_grading.checks.speedup.toy_reference" not in kernel_tree.allowed_for(
        ["from specref_grading.checks.speedup import toy_reference"])


@pytest.mark.grader
def test_the_check_modules_constants_are_literals_read_without_running_them(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("import os\nFORBIDDEN = ('a.x', 'a.y',\n             'b')\nALLOWED = __import__('os').getcwd()\n"
                   "MADE = tuple(f'a.{n}' for n in ('x', 'y'))\n")
    assert kernel_tree._constant(mod, "FORBIDDEN") == ("a.x", "a.y", "b")
    for name in ("ALLOWED", "MADE"):  # code, even code that makes strings, is never run: the author is told
        with pytest.raises(kernel_tree.AuthoringError, match=f"{name} must be a literal tuple of strings"):
            kernel_tree._constant(mod, name)


@pytest.mark.grader
def test_every_check_modules_forbidden_names_modules_only():
    reading = kernel_tree.shared_reading()
    for path in sorted((REPO / "specref_grading" / "checks").glob("*.py")):
        for name in kernel_tree._constant(path, "FORBIDDEN"):
            assert name in reading.modules or name.split(".")[0] == "specref_grading", (path.name, name)


def _plan(solution: Path):
    from specref_grading.plan import build_plan
    nb = json.loads(solution.read_text())
    return build_plan(nb, nb, solution.name)


def _served(plan) -> set[str]:
    return {n for c in plan.cells for n in c.get("serve", [])}


# What each exercise serves its kernel on purpose (its check modules' ALLOWED); nothing else. What ex01, ex07 and
# ex08 give lives in specref (MACHINES, server_rows, the samplers), which their kernels' copies hold; ex04's
# sampling_power needs what its kernel's copy lacks (specref.decoding), so it is served.
SERVED = {"ex04_gpt2_pair": {"sampling_power"}}


@pytest.mark.grader
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_the_plan_serves_the_kernel_only_what_the_exercise_allows(solution):
    plan = _plan(solution)
    assert _served(plan) == SERVED.get(solution.stem, set())
    sources = [c["source"] for c in plan.cells if c["role"] in ("checks", "setup")]
    allowed = kernel_tree.allowed_for(sources)
    for c in plan.cells:
        for name in c.get("serve", []):
            assert any(a.rsplit(".", 1)[-1] == name for a in allowed), (c["n"], name, allowed)
    assert plan.forbidden == kernel_tree.forbidden_for(sources)  # kept, for the wall: not read again
    assert all(tuple(c["forbidden"]) == plan.forbidden for c in plan.cells if c["role"] in ("checks", "setup"))


@pytest.mark.grader
def test_the_demos_comparing_with_the_reference_are_not_run():
    """ex06's cell 8 compares the learner's result with the reference, which the kernel no longer gets: "demo",
    never sent to it. ex03's given cells compare the learner's work with itself and with verify_chain, which the
    kernel has: none of them is a demo."""
    demos = {s.stem: {c["n"]: c["absent"] for c in _plan(s).cells if c["role"] == "demo"} for s in SOLUTIONS}
    assert demos["ex06_trees"] == {8: ["tree_attention_mask"]}
    assert not any(d for stem, d in demos.items() if stem != "ex06_trees"), demos


@pytest.mark.grader
def test_the_wall_does_not_run_a_demo_and_reuses_the_plans_selection(monkeypatch):
    from specref_grading.trust import wall
    sent: list[dict] = []
    built: list[tuple] = []
    monkeypatch.setattr(wall, "_collect", lambda proc, plan, *a, **k: sent.extend(json.loads(plan)["cells"])
                        or wall.KernelRun())
    monkeypatch.setattr(kernel_tree, "build", lambda forbidden, roots, **k: built.append((forbidden, roots)) or
                        kernel_tree.specref_dir())
    plan = _plan(REPO / "solutions" / "ex06_trees.ipynb")
    roots = tuple(next(c["roots"] for c in plan.cells if c["role"] == "setup"))
    monkeypatch.setattr(kernel_tree, "forbidden_for", lambda *a: pytest.fail("the forbidden set was read again"))
    wall.run_cells([c for c in plan.cells if c["role"] != "test"], 60, time.monotonic() + 120)
    assert sent and 8 not in {c["n"] for c in sent} and all(c["role"] != "demo" for c in sent)
    if can_jail():
        assert built == [(plan.forbidden, roots)]


@pytest.mark.grader
def test_one_reading_per_process():
    a = kernel_tree.shared_reading()
    assert kernel_tree.shared_reading() is a


def _imported(module: str) -> list[str]:
    code = f"import {module}, sys; print(sorted(m for m in sys.modules if m.startswith('specref')))"
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True)
    return eval(out.stdout)


@pytest.mark.grader
def test_importing_one_module_imports_only_what_it_needs():
    assert _imported("specref.checks.rng") == ["specref", "specref._lazy", "specref._validate", "specref.checks",
                                               "specref.checks.rng", "specref.sampling"]
    assert "specref.drafts.prompt_lookup" not in _imported("specref.drafts.load")  # ex05's answer key


PROBE = '''
import importlib, os
def answer_probe():
    found = []
    for name in NAMES:
        module, _, attr = name.rpartition(".")
        try:
            m = importlib.import_module(name)
            found.append(name)
        except ImportError:
            try:
                if module and hasattr(importlib.import_module(module), attr):
                    found.append(name)
            except ImportError:
                pass
    for top in ("/work", "/root", "/home", "/tmp", "/var", "/opt", "/srv", "/mnt", "/"):
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            if dirpath == "/":
                dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "usr", "dev")]
            if "site-packages" in dirpath.split(os.sep) or "/.venv" in dirpath and "specref" not in dirpath:
                dirnames[:] = []
            for f in dirnames + filenames:
                path = os.path.join(dirpath, f)
                if "specref_grading" in f or f == "solutions" or f.startswith("ex0") and f.endswith(".ipynb"):
                    found.append(path)
            for f in filenames:
                path = os.path.join(dirpath, f)
                if "/specref" in path and f.endswith((".py", ".pyc")):
                    try:
                        data = open(path, "rb").read()
                    except OSError:
                        continue
                    for mark in MARKS:
                        if mark.encode() in data:
                            found.append(path + ": " + mark)
    return found
'''


def _probe_submission(solution: Path, tmp_path: Path, names: list[str], marks: list[str]) -> Path:
    """The solution with its first code answer replaced by the probe, and the probe's findings printed."""
    nb = json.loads(solution.read_text())
    gid = next(c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
               if c.get("metadata", {}).get("nbgrader", {}).get("solution") and c["cell_type"] == "code")
    source = f"NAMES = {names!r}\nMARKS = {marks!r}\n" + PROBE + "\nraise AssertionError(repr(answer_probe()))\n"
    return _with_answer(solution, tmp_path, gid, source)


@pytest.mark.grader
@pytest.mark.slow
def test_the_probe_finds_the_answer_key_where_it_is_reachable():
    # The negative control of the jailed probe below: run here, outside any jail, it finds the grader's modules,
    # a forbidden function and the checks' source, so its empty findings in the jail mean something.
    code = ("NAMES = ['specref_grading.checks.rules', 'specref.chain_verify.verify_chain', 'specref.nothing_such']\n"
            "MARKS = ['def check_']\n" + PROBE + "\nprint(repr(answer_probe()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd="/")
    found = eval(out.stdout.strip().splitlines()[-1])
    assert "specref_grading.checks.rules" in found and "specref.chain_verify.verify_chain" in found, found
    assert "specref.nothing_such" not in found
    assert any(f.endswith(": def check_") and "/specref_grading/checks/" in f for f in found), found


@pytest.mark.grader
@pytest.mark.slow
@pytest.mark.grader
@jailed
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_the_jailed_kernel_has_no_answer_key(solution, tmp_path):
    forbidden = [f for f in _forbidden(solution) if f.startswith("specref.")]
    grading = ["specref_grading"] + [f"specref_grading.{p.stem}" for p in (REPO / "specref_grading").glob("*.py")]
    grading += [f"specref_grading.checks.{p.stem}" for p in (REPO / "specref_grading" / "checks").glob("*.py")]
    seed = 7_394_105_288_117
    checks = sorted({f"def {line.split('(')[0][4:]}(" for p in (REPO / "specref_grading" / "checks").glob("*.py")
                     for line in p.read_text().splitlines() if line.startswith("def check_")})
    marks = checks + [str(seed), "### BEGIN SOLUTION", "BEGIN HIDDEN TESTS"]
    sub = _probe_submission(solution, tmp_path, forbidden + grading, marks)
    report = grade_path(sub, solution=solution, seed=seed)
    assert not report.error, report.error
    text = report.text()
    # The probe's findings travel in its answer cell's error: an empty list, nothing found.
    found = [line for line in text.splitlines() if "AssertionError (line" in line]
    assert found and all(line.rstrip().endswith(": [])") for line in found), text


def _with_answer(solution: Path, tmp_path: Path, gid: str, code: str) -> Path:
    nb = json.loads(solution.read_text())
    for c in nb["cells"]:
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            c["source"] = code
    path = tmp_path / solution.name
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.grader
@pytest.mark.slow
@pytest.mark.grader
@jailed
@pytest.mark.parametrize("exercise, gid, test_gid, code", [
    ("ex02_accept_reject", "ex02_step_answer", "ex02_step_check",
     "from specref.rejection import verify_chain\n\ndef speculative_step(*a, **k):\n    return verify_chain(*a, **k)\n"),
    ("ex02_accept_reject", "ex02_step_answer", "ex02_step_check",
     "import importlib\nspeculative_step = importlib.import_module('specref.rejection').verify_chain\n"),
    ("ex02_accept_reject", "ex02_step_answer", "ex02_step_check",  # the rule's own module
     "from specref.chain_verify import verify_chain\n\ndef speculative_step(*a, **k):\n    return verify_chain(*a, **k)\n"),
    ("ex02_accept_reject", "ex02_step_answer", "ex02_step_check",  # through any module's namespace
     "import torch.overrides as o\nspeculative_step = o.sys.modules['specref'].verify_chain\n"),
    ("ex02_accept_reject", "ex02_residual_answer", "ex02_residual_check",  # another exercise's helper
     "import torch\nfrom specref.checks.samplers import _residual\n\ndef replacement(p, q, a):\n"
     "    return torch.tensor(_residual(p.tolist(), (q * a).tolist()), dtype=p.dtype)\n"),
    ("ex03_speedup", "ex03_bestk_answer", "ex03_bestk_check",
     "from specref.theory import optimal_k\n\ndef best_k(alpha, c, v):\n    return optimal_k(alpha, c, 10**4)\n"),
    ("ex03_speedup", "ex03_bestk_answer", "ex03_bestk_check",
     "import specref\n\ndef best_k(alpha, c, v):\n    return specref.optimal_k(alpha, c, 10**4)\n"),
    ("ex03_speedup", "ex03_measure_answer", "ex03_measure_check",  # the simulation Task 4 asks the learner to write
     "from specref.checks.montecarlo import simulate\n\ndef measure_toy(target, draft, k, runs, n, generator):\n"
     "    s = simulate(target, draft, 0, k, n, runs, generator)\n"
     "    a = s.n_accepted[s.active].double()\n"
     "    return (a + 1).mean().item(), (a.sum() / (a + 1).clamp(max=k).sum()).item(), (a >= 1).double().mean().item()\n"),
])
def test_fetching_the_reference_through_a_module_scores_zero(exercise, gid, test_gid, code, tmp_path):
    solution = REPO / "solutions" / f"{exercise}.ipynb"
    nb = json.loads(solution.read_text())
    gids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb["cells"]}
    if gid not in gids or test_gid not in gids:
        pytest.skip(f"{exercise} has no cell {gid} / {test_gid}")
    report = grade_path(_with_answer(solution, tmp_path, gid, code), solution=solution, seed=1)
    result = next(t for t in report.tests if t.grade_id == test_gid)
    assert result.outcome != "passed", report.text()
    assert any(e in report.text() for e in ("ModuleNotFoundError", "ImportError", "AttributeError")), report.text()


def _first_code_answer(plan):
    return next(c for c in plan.cells if c["role"] == "answer" and any(c["n"] in t.depends for t in plan.tests))


def _touch_served(served: set[str]) -> str:
    """An answer cell that uses every name served to the kernel (and defines nothing the tests want)."""
    return "".join(f"print({n!r}, type({n}).__name__)\n" for n in sorted(served)) or "pass\n"


@pytest.mark.grader
@pytest.mark.slow
@pytest.mark.grader
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_an_answer_calling_every_served_name_scores_zero_on_its_tasks(solution, tmp_path):
    plan = _plan(solution)
    served = _served(plan)
    target = _first_code_answer(plan)
    report = grade_path(_with_answer(solution, tmp_path, target["grade_id"], _touch_served(served)), solution=solution,
                   seed=1)
    assert not report.error, report.error
    # the tests that read what the replaced answer defined (t.depends also counts answers reached through names
    # that other answers define, which this attack leaves in place)
    from specref_grading.scan import names_bound, names_used
    defined = names_bound(target["source"])
    attacked = {t.grade_id for t in plan.tests if names_used(t.source) & defined}
    assert attacked, (target["grade_id"], defined)
    for t in report.tests:
        if t.grade_id in attacked:
            assert t.outcome != "passed" and not t.score, report.text()
    text = report.text()
    assert "NameError" not in text or not any(f"name '{n}' is not defined" in text for n in served), text


ATTACKS = [  # the reference, as the exercise's setup or checks cell would have served it
    ("ex06_trees", "ex06_mask_answer", "ex06_mask_check",
     "def tree_from_mask(m):\n    n = m.shape[0]\n"
     "    p = [max([j for j in range(i) if m[i, j]], default=-1) for i in range(n)]\n"
     "    if not torch.equal(tree_attention_mask(Tree(p, range(n))), m):\n        raise ValueError('no tree')\n"
     "    return p\n"),
    ("ex03_speedup", "ex03_measure_answer", "ex03_measure_check",
     "def measure_toy(target, draft, k, runs, n, generator):\n"
     "    r = toy_reference(target, draft, k, n, runs, generator)\n"
     "    return r['tokens_per_step'], r['accepted_per_examined'], r['first_accepted']\n"),
]


@pytest.mark.grader
@pytest.mark.slow
@pytest.mark.grader
@pytest.mark.parametrize("exercise, gid, test_gid, code", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_the_reference_the_setup_imports_is_not_served(exercise, gid, test_gid, code, tmp_path):
    solution = REPO / "solutions" / f"{exercise}.ipynb"
    report = grade_path(_with_answer(solution, tmp_path, gid, code), solution=solution, seed=1)
    assert not report.error, report.error
    result = next(t for t in report.tests if t.grade_id == test_gid)
    assert result.outcome != "passed" and not result.score, report.text()
    assert "NameError" in result.message or "NameError" in report.text(), report.text()


def _ex02_forbidden() -> tuple[str, ...]:
    nb = json.loads((REPO / "solutions" / "ex02_accept_reject.ipynb").read_text(encoding="utf-8"))
    return kernel_tree.forbidden_for([source(c) for c in nb["cells"] if c.get("cell_type") == "code"])


def test_ex08s_residual_handed_in_or_wrapped_scores_nothing_for_ex02():
    def residual(p, q):  # the wrapped form: a learner's own function that calls the helper
        return torch.tensor(_residual(p.tolist(), q.tolist()), dtype=torch.float64)

    for answer in (_residual, residual):
        with pytest.raises(AssertionError, match="uses specref.checks.samplers._residual"):
            A.check_residual(answer)


def test_the_lectures_view_of_a_pair_scores_nothing_for_ex02():
    from specref.course.plots import accept_reject_view

    def residual(p, q):
        return accept_reject_view(p, q)["residual"]

    with pytest.raises(AssertionError, match="uses specref.course.plots.accept_reject_view"):
        A.check_residual(residual)


@pytest.mark.parametrize("name", ["specref.checks.samplers._residual", "specref.checks.samplers.make_sampler",
                                  "specref.course.plots.accept_reject_view",
                                  "specref.course.widgets.accept_reject_widget"])
def test_ex02s_kernel_copy_cannot_hold_another_modules_copy_of_its_rule(name):
    forbidden = _ex02_forbidden()
    assert not kernel_tree.shared_reading().available(forbidden, name), name


def test_ex02s_setup_still_has_what_it_imports():
    assert kernel_tree.shared_reading().available(_ex02_forbidden(), "specref.checks.rng.exact_distribution")


# -- ex04: the models a check hands the learner ---------------------------------------------------
def _plain_decode_through_the_wrapped_model(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None,
                                            generator=None):
    """Plain greedy decoding, no speculation, on a model the pass counter does not see (the notebook's own pair)."""
    from specref.models.pair import load_pair

    return _plain_greedy(load_pair()[0].double(), prompt, max_new_tokens)


def _plain_decode_on_the_graders_pair(target, draft, prompt, k, max_new_tokens, temperature=0.0, top_k=None,
                                      generator=None):
    """The same on the grader's own float64 pair."""
    from specref_grading.checks import gpt2_pair as G

    return _plain_greedy(G._pair64()[0], prompt, max_new_tokens)


def _plain_greedy(model, prompt, max_new_tokens):
    cache, out = model.new_cache(1), []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache)[0, -1]
        for _ in range(max_new_tokens):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache=cache)[0, -1]
    return out


@pytest.mark.grader
def test_plain_decoding_on_a_model_the_check_does_not_count_is_not_speculation():
    """Passes the wrapper does not see (its `.model`, or the notebook's own pair) gave plain decoding 3/3."""
    from specref_grading.checks import gpt2_pair as G

    with pytest.raises(AssertionError, match="called the target 0 times"):
        G.check_speculative_decode(_plain_decode_through_the_wrapped_model, n_prompts=1, ks=(1,))
    # Reaching for the grader's own pair is refused before anything runs: the import names the grader.
    with pytest.raises(AssertionError, match="uses specref_grading.checks.gpt2_pair"):
        G.check_speculative_decode(_plain_decode_on_the_graders_pair, n_prompts=1, ks=(1,))


@pytest.mark.grader
def test_weights_the_learner_writes_never_reach_the_reference_of_later_checks():
    """A step that zeroes the models it is handed through .data (no version bump) must leave the graders'
    reference intact: it poisoned the expected answers of check_speculative_decode, which [c] * n then passed."""
    from specref_grading.checks import gpt2_pair as G

    reference = [p for m in G._pair64() for p in m.parameters()]
    saved = [p.detach().clone() for p in reference]

    def poison(target, draft, seq, target_cache, draft_cache, k, temperature, top_k, generator):
        for model in (target, draft):
            for p in model.parameters():
                p.data.zero_()
        return [0]

    try:
        with pytest.raises(AssertionError, match="called the target 0 times"):
            G.check_step_caches(poison)
        assert all(torch.equal(p, s) for p, s in zip(reference, saved)), "the learner's step changed the reference"
        with pytest.raises(AssertionError, match="first difference"):
            G.check_speculative_decode(lambda target, draft, prompt, k, n, *a: [0] * n, n_prompts=1, ks=(1,))
    finally:
        with torch.no_grad():
            for p, s in zip(reference, saved):
                p.copy_(s)


@pytest.mark.grader
def test_ex08s_threshold_cannot_be_taken_from_the_courses_distribution_test(tmp_path):
    """Task 2 asks for a threshold below the union bound that specref.checks.montecarlo.distribution_test computes
    (tv_bound); nine tenths of it passes the check. In the jail that module is absent, so an answer that asks it for
    the bound scores 0."""
    answer = ("import math\n\n\ndef tv_threshold(n_cells, n, level):\n"
              "    from specref.checks.montecarlo import distribution_test\n"
              "    import torch\n"
              "    p = torch.full((n_cells,), 1.0 / n_cells, dtype=torch.float64)\n"
              "    return distribution_test(p, samples=torch.zeros(n, dtype=torch.long), alpha=level).tv_bound * 0.9\n\n\n"
              "def samples_needed(tv, n_cells, level):\n"
              "    return math.ceil((2 * tv_threshold(n_cells, 1, level) / tv) ** 2)\n")
    from specref_grading.checks import pitfalls

    outside: dict = {}
    exec(answer, outside)  # outside the jail the module is there, and its bound passes the check: the attack is real
    pitfalls.check_resolution.__wrapped__(outside["tv_threshold"], outside["samples_needed"])
    nb = with_answer(exercise("ex08_lossless_or_not"), "ex08_resolution_answer", answer)
    code, report, out = grade_exercise(nb, tmp_path)
    assert scores(report)["ex08_resolution_check"] == 0 and code in (1, 3), out


# The check computes its expected answers with a torch module, as the course's checks do with their models.
MODEL_CHECKS = '''import torch


def check_double(fn, xs=(1.0, 2.5, -3.0)):
    """The exercise's grader for double(): the reference is a torch module."""
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(2.0)
    for x in xs:
        want = float(lin(torch.tensor([[float(x)]]))[0, 0])
        got = fn(x)
        assert isinstance(got, (int, float)) and abs(got - want) < 1e-9, f"double({x}) returned {got!r}, expected {want}"
    print("check_double: passed")'''


@pytest.mark.grader
@pytest.mark.parametrize("source", [
    "import torch\ntorch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 0)",
    "from torch.nn.modules.module import register_module_forward_pre_hook\n"
    "register_module_forward_pre_hook(lambda m, i: tuple(t * 0 for t in i))",
], ids=["forward-hook", "from-import-pre-hook"])
def test_hooks_on_every_module_at_once_cannot_rewrite_the_reference(toy, source):
    """A global module hook rewrote every model's outputs, the reference's included: with the hook zeroing them,
    double = 0 matched. Registered in the kernel, it never reaches the checks' modules."""

    sol = toy_solution()
    sol["cells"][1]["source"] = MODEL_CHECKS
    (toy[0] / "ex_toy.ipynb").write_text(json.dumps(sol), encoding="utf-8")
    exercise_nb = make_exercise(sol)
    code, report, out = grade(attacked(exercise_nb, source + "\ndouble = lambda x: 0.0"), toy)
    assert_no_marks_silently(code, report)
    assert "double(1.0) returned 0.0, expected 2.0" in out, out
    honest = attacked(exercise_nb, "double = lambda x: 2.0 * x")  # the control: the torch reference grades
    code, report, out = grade(honest, toy)
    assert scores(report)["double_check"] == 2, out
