"""What the kernel can do with the handles the checks hand it, the names a test asks of it, and what it serves.

Threats: a handle the kernel kept from one test reused in a later one; a handle id guessed rather than given; a
hidden test reading a name the kernel defines (not an answer) and trusting the kernel's value; a served name run in
the trusted process on arguments the kernel chooses. Each attack runs from the kernel's real program (a fresh
``python -I``, the jail's command without the jail) against trusted.run_test or the trusted policy, next to a
negative control: the same attack with the defence patched off succeeds.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import json

import pytest

from specref_grading.plan import build_plan
from specref_grading.scan import names_bound, names_used
from specref_grading.trust import exports, trusted
from specref_grading.trust.calls import Peer
from specref_grading.trust.trusted_policy import TrustedPolicy
from specref_grading.trust.values import Codec

from .conftest import REPO, kernel_peer, toy_solution

pytestmark = pytest.mark.grader


@pytest.fixture
def kernel():
    """A trusted peer talking to the kernel's program in a fresh ``python -I`` (conftest.kernel_peer)."""
    with kernel_peer() as peer:
        yield peer


def _checks_ns(source: str) -> dict:
    """The trusted side's namespace after a checks cell (its functions leave as calls: exports.course_code)."""
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(source, "<checks cell 1>", "exec", dont_inherit=True), ns)  # noqa: S102 - the test's own checks
    return ns


def _run(peer: Peer, ns: dict, source: str, asks: list[str], monkeypatch, n: int = 9) -> dict:
    """One test cell through trusted.run_test; its result event."""
    events: list[dict] = []
    monkeypatch.setattr(trusted, "emit", events.append)
    assert trusted.run_test({"n": n, "grade_id": f"t{n}", "source": source, "asks": asks}, ns, peer, [], 60.0)
    return events[-1]


CHECKS = "def secret():\n    return 'the answer key'\n\ndef other():\n    return 'another key'\n"
STASH = """stash = []
def grab(f):
    stash.append(f)
    return len(stash)
def use():
    return stash[0]()
"""


# -- handles live as long as the test that gave them out -----------------------------------------------------------
def _stale_handle(peer: Peer, monkeypatch) -> dict:
    """Test 1 hands the kernel a checks function, which the kernel stashes; test 2 asks the kernel to call it."""
    ns = _checks_ns(CHECKS)
    assert peer.request("exec", STASH, "<answer cell 2>") is None
    assert _run(peer, ns, "assert grab(secret) == 1", ["grab"], monkeypatch, n=3)["outcome"] == "passed"
    return _run(peer, ns, "got = use()\nassert got == 'the answer key', got", ["use"], monkeypatch, n=4)


def test_a_handle_kept_from_an_earlier_test_is_refused_in_a_later_one(kernel, monkeypatch):
    result = _stale_handle(kernel, monkeypatch)
    assert result["outcome"] == "error" and "gave out in a test that has ended" in result["message"], result
    assert kernel.exports == {}  # nothing of test 1 is held any more


def test_control_without_revocation_the_stale_handle_works(kernel, monkeypatch):
    monkeypatch.setattr(Codec, "revoke", lambda self, keep: None)
    assert _stale_handle(kernel, monkeypatch)["outcome"] == "passed"


def test_what_the_setup_served_outlives_the_tests(kernel, monkeypatch):
    kernel.request("bind", kernel.policy.serve({"power": lambda: 4.0}))
    for n in (3, 4):  # the served name stays callable in every test
        assert kernel.request("exec", f"r{n} = power()\n", "<answer cell 2>") is None
        assert _run(kernel, {"__builtins__": builtins}, f"assert r{n} == 4.0", [f"r{n}"], monkeypatch, n=n)[
            "outcome"] == "passed"


# -- handle ids cannot be guessed ---------------------------------------------------------------------------------
GUESS = """def keep(f):
    global kept
    kept = f
def guess(h):
    hid, out = h._hid, []
    for forged in [f for f in range(hid - 4, hid + 5) if f != hid] + [1, 2, 3, 2**62]:
        try:
            out.append(h._peer.request("call", forged, (), {}))
        except ValueError:
            out.append("refused")
    return out
"""


def test_a_guessed_handle_id_is_refused(kernel, monkeypatch):
    ns = _checks_ns(CHECKS + "seen = []\n")
    assert kernel.request("exec", GUESS, "<answer cell 2>") is None
    result = _run(kernel, ns, "keep(other)\nseen.extend(guess(secret))", ["guess", "keep"], monkeypatch)
    assert result["outcome"] == "passed", result
    assert ns["seen"] == ["refused"] * 12, ns["seen"]


def test_control_with_sequential_ids_the_next_integer_reaches_another_export(kernel, monkeypatch):
    counter = itertools.count(1)
    monkeypatch.setattr(Codec, "new_id", lambda self: next(counter))
    ns = _checks_ns(CHECKS + "seen = []\n")
    assert kernel.request("exec", GUESS, "<answer cell 2>") is None
    _run(kernel, ns, "keep(other)\nseen.extend(guess(secret))", ["guess", "keep"], monkeypatch)
    assert "another key" in ns["seen"], ns["seen"]


def test_ids_are_random_63_bit_numbers():
    ids = [Codec("trusted", TrustedPolicy()).new_id() for _ in range(200)]
    assert len(set(ids)) == 200 and all(0 <= i < 2**63 for i in ids)
    assert max(ids) > 2**60  # 200 draws below 2**60 happen with probability 2**-600


# -- a hidden test asks the kernel only for the answers' names ------------------------------------------------------
# The attack: the test falls back to its own tolerance when no `scale` is bound, and the learner binds one.
SCALE_TEST = "try:\n    scale\nexcept NameError:\n    scale = 2\nassert double(3) == 3 * scale, double(3)"
SCALE_ANSWER = "scale = 1\ndef double(x):\n    return x"


def _scale_plan_cell() -> dict:
    sol = toy_solution()
    test = next(c for c in sol["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "double_check")
    test["source"] = SCALE_TEST
    plan = build_plan(sol, sol, "ex_toy.ipynb")
    return next(c for c in plan.cells if c.get("grade_id") == "double_check")


def test_the_plan_lets_a_test_ask_only_for_the_answers_names():
    cell = _scale_plan_cell()
    assert cell["asks"] == ["double"], cell
    for path in sorted((REPO / "solutions").glob("*.ipynb")):  # every exercise: asks are answer names only
        nb = json.loads(path.read_text(encoding="utf-8"))
        plan = build_plan(nb, nb, path.name)
        answers = {n for c in plan.cells if c["role"] == "answer" for n in names_bound(c["source"])}
        for c in plan.cells:
            if c["role"] == "test":
                assert set(c["asks"]) <= answers, (path.name, c["grade_id"], c["asks"])


def test_a_hidden_test_never_reads_a_helper_the_kernel_defines(kernel, monkeypatch):
    cell = _scale_plan_cell()
    assert kernel.request("exec", SCALE_ANSWER, "<answer cell 2>") is None
    result = _run(kernel, {"__builtins__": builtins}, cell["source"], cell["asks"], monkeypatch)
    assert result["outcome"] == "failed", result


def test_control_asking_for_every_name_a_test_reads_lets_the_kernel_answer_the_check(kernel, monkeypatch):
    cell = _scale_plan_cell()
    assert kernel.request("exec", SCALE_ANSWER, "<answer cell 2>") is None
    every = sorted(names_used(cell["source"]))  # the old rule: every free name the test reads
    assert _run(kernel, {"__builtins__": builtins}, cell["source"], every, monkeypatch)["outcome"] == "passed"


def test_a_test_cell_built_without_asks_asks_nothing(kernel, monkeypatch):
    assert kernel.request("exec", "def double(x):\n    return 2 * x\n", "<answer cell 2>") is None
    result = _run(kernel, {"__builtins__": builtins}, "double(1)", [], monkeypatch)
    assert result["outcome"] == "error" and "NameError" in result["message"], result


# -- a served name computes on the exercise's own setting, once --------------------------------------------------
def _counting_power():
    seen: list = []

    def power(setting=None):
        seen.append(setting)
        return {"n": 2000 if setting is None else setting}
    return power, seen


def test_a_served_name_refuses_the_kernels_arguments_and_computes_once(kernel):
    power, seen = _counting_power()
    kernel.request("bind", kernel.policy.serve({"power": power}))
    error = kernel.request("exec", "power({'n': 10**9})\n", "<answer cell 2>")
    assert error and "TypeError" in error and "takes no arguments" in error, error
    assert kernel.request("exec", "rs = [power() for _ in range(50)]\n", "<answer cell 3>") is None
    assert kernel.request("get", "rs") == [{"n": 2000}] * 50
    assert seen == [None]  # the kernel's argument never reached it; fifty calls, one computation


def test_control_a_plain_call_runs_on_the_kernels_arguments(kernel):
    power, seen = _counting_power()
    kernel.request("bind", {"power": exports.Call(power, "power")})  # the old rule: a call, nothing else
    assert kernel.request("exec", "power({'n': 10**9})\nfor _ in range(3):\n    power()\n", "<answer cell 2>") is None
    assert seen == [{"n": 10**9}, None, None, None]


def test_every_served_name_is_called_without_arguments_by_its_exercise():
    """The rule holds the course: the exercise's kernel code calls each name it is served with no argument."""
    served_any = False
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        plan = build_plan(nb, nb, path.name)
        served = {n for c in plan.cells for n in c.get("serve", [])}
        served_any |= bool(served)
        for c in plan.cells:
            if c["role"] in ("setup", "other", "answer") and served:
                for node in ast.walk(ast.parse(c.get("kernel_source", c["source"]))):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in served:
                        assert not node.args and not node.keywords, (path.name, c["n"], ast.unparse(node))
    assert served_any  # ex04 serves sampling_power

