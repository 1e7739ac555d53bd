"""The trusted core (specref_grading/trust/) as a unit: its shape, the kernel's program made of it, each side's policy.

Threat: the grader's own security code is too tangled to audit, or the kernel runs another protocol than the
trusted side. These tests hold the core's layout (one concept a module, the kernel's program built from the
kernel-side modules only, nothing of the grader outside the core imported) and run that program as the jail
would, without the jail.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from specref_grading import jail
from specref_grading.trust import program
from specref_grading.trust.errors import RemoteError
from specref_grading.trust.kernel_policy import KernelPolicy
from specref_grading.trust.remote import Remote
from specref_grading.trust.trusted_policy import Served, TrustedPolicy

from .conftest import kernel_peer

pytestmark = pytest.mark.grader


TRUST = Path(program.__file__).resolve().parent


MODULES = sorted(p.stem for p in TRUST.glob("*.py") if p.stem != "__init__")


def _tree(name: str) -> ast.Module:
    return ast.parse((TRUST / f"{name}.py").read_text(encoding="utf-8"))


# The core's ways out: kernel_tree and reading read the learner's and the exercise's code with the scanner's walker,
# reading checks a notebook as notebook.py does and drops root as processes.py does; the wall starts the jail and the
# processes. Nothing else of the
# grader (the plan, the report, the checks) is imported by the core.
WAYS_OUT = {("kernel_tree", "specref_grading.scan"), ("reading", "specref_grading.scan"),
            ("reading", "specref_grading.notebook"), ("reading", "specref_grading.processes"),
            ("wall", "specref_grading.jail"),
            ("wall", "specref_grading.processes"), ("wall", "specref_grading")}


def test_the_core_imports_nothing_of_the_grader_outside_it():
    for name in MODULES:
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specref_grading"):
                assert node.module.startswith("specref_grading.trust") or (name, node.module) in WAYS_OUT, (
                    name, node.module)
                if (name, node.module) == ("wall", "specref_grading"):
                    assert [a.name for a in node.names] == ["jail"], (name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("specref_grading") for a in node.names), name


def test_every_module_of_the_core_states_its_rule():
    for name in MODULES:
        doc = ast.get_docstring(_tree(name)) if name != "__init__" else ""
        assert doc and len(doc) > 80, name


def test_no_module_of_the_core_cites_dates_or_benchmark_runs():
    for path in TRUST.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "benchmarks/history" not in text and "2026-" not in text, path.name


def test_the_kernels_program_is_the_kernel_side_modules_and_compiles():
    source = program.kernel_program(jail.KERNEL)
    compile(source, "<kernel>", "exec")
    assert "class TrustedPolicy" not in source and "course_callable" not in source  # the trusted side's policy
    assert "class Peer(Codec)" in source and "class KernelPolicy" in source
    assert source.count("from __future__ import annotations") == 1
    assert "specref_grading" not in "".join(line for line in source.splitlines(keepends=True)
                                           if line.lstrip().startswith(("import ", "from ")))


def test_the_kernel_side_modules_share_one_namespace_without_clashes():
    seen: dict[str, str] = {}
    for name in program.KERNEL_MODULES:
        for stmt in _tree(name).body:
            if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith(program.PACKAGE):
                assert all(a.asname is None for a in stmt.names), (name, "an import under another name")
                assert stmt.module.rpartition(".")[2] in program.KERNEL_MODULES[:program.KERNEL_MODULES.index(name)], (
                    name, stmt.module, "a module the program holds before this one")
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
                names = [stmt.name] if hasattr(stmt, "name") else [
                    t.id for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                    if isinstance(t, ast.Name)]
                for n in names:
                    assert n not in seen, (n, seen.get(n), name)
                    seen[n] = name


@pytest.fixture
def kernel():
    """A trusted peer talking to the kernel's program in a fresh ``python -I`` (conftest.kernel_peer)."""
    with kernel_peer() as peer:
        yield peer


def test_the_kernels_program_serves_the_trusted_side(kernel):
    assert kernel.request("exec", "class Big(int):\n    def __eq__(self, o):\n        return True\n"
                          "def f(x):\n    return [x * 2, Big(5)]\n", "<answer cell 1>") is None
    f = kernel.request("get", "f")
    assert isinstance(f, Remote)
    got = f(21)
    assert got == [42, 5] and type(got[1]) is int  # a learner's int subclass arrives as a plain int
    error = kernel.request("exec", "raise KeyError('no')\n", "<answer cell 2>")
    assert error.startswith("KeyError (line 1)"), error
    kernel.request("exec", "class Mine(Exception):\n    pass\ndef g():\n    raise Mine('x')\n", "<answer cell 3>")
    with pytest.raises(RemoteError, match="Mine: x"):  # a type of the kernel's is never built here
        kernel.request("get", "g")()


def test_a_served_name_reaches_the_kernel_as_a_call_and_nothing_else(kernel):
    """What the exercise serves by name crosses as its declared wrapper: the kernel can call it, never read the
    object behind it (its attributes, its globals)."""
    def power(x=2):
        return {"p": float(x) ** 2}
    power.secret = "the answer key"
    kernel.request("bind", kernel.policy.serve({"power": power}))
    assert kernel.request("exec", "got = power()\n", "<answer cell 1>") is None
    assert kernel.request("get", "got") == {"p": 4.0}
    for probe in ("power.secret", "power.__globals__", "power._target", "power.__call__.__self__._target"):
        error = kernel.request("exec", f"x = {probe}\n", "<answer cell 2>")
        assert error and "AttributeError" in error, (probe, error)


def test_the_kernels_program_cannot_import_the_grader(kernel):
    error = kernel.request("exec", "import specref_grading.trust\n", "<answer cell 1>")
    assert error and ("ModuleNotFoundError" in error or "ImportError" in error), error


def test_the_kernels_policy_lets_everything_out_and_flattens_plain_subclasses():
    policy = KernelPolicy()
    policy.check_export(os.system)
    policy.check_getattr(os, "system")
    assert type(policy.plain_copy(type("Mine", (int,), {})(3))) is int
    assert policy.plain_copy(object()) is None


def test_the_trusted_policy_lets_out_only_what_is_declared_or_the_courses_own():
    policy = TrustedPolicy()
    for refused in (os, int, os.system, print, eval):
        with pytest.raises(TypeError):
            policy.check_export(refused)
    served = policy.serve({"int": int})["int"]  # declared: the exercise serves it on purpose, as a wrapper
    policy.check_export(served)
    with pytest.raises(TypeError):
        policy.check_export(int)  # the real object behind a declared wrapper still never leaves
    assert served() == 0 and type(served) is Served
    with pytest.raises(AttributeError):
        policy.check_getattr(served, "real")  # a wrapper is a call and nothing else
    with pytest.raises(AttributeError):
        policy.check_getattr(lambda: 0, "x")
    assert policy.plain_copy(type("Mine", (int,), {})(3)) is None


def test_the_trusted_policy_refuses_operators_of_the_submissions_objects_while_the_checks_run():
    class FakePeer:
        answering = 0

    policy, remote = TrustedPolicy(), Remote(None, 1, "Liar")
    with pytest.raises(TypeError, match="Liar"):
        policy.check_operator(FakePeer(), remote, "an operator (-)")
    FakePeer.answering = 1  # answering a call of the kernel: the course's code computes for the submission
    policy.check_operator(FakePeer(), remote, "an operator (-)")
