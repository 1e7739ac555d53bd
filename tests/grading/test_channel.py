"""Kernel to trusted process: bytes, values, objects, calls and errors across the wall's channel.

The wire (specref_grading/trust/wire.py) checks length, item count and blob sizes on raw bytes before parsing;
only plain data, arrays and specref records cross as copies, everything else is a handle whose operators and truth
the checks refuse; the trusted side hands out only declared wrappers and the course's own callables, never a
builtin, a module or the standard library; a generator is set only by the call it was lent to. The calls are
capped by the trusted process's CPU time per test (not by their number), which runs under its own rlimits; a kernel
that exits or breaks the channel fails its test (exit 1) with the cause, and "died" is left to faults of the grader.

A trusted `Peer` here talks to a 'kernel' `Peer` in a thread or a fork of this process where no jail is needed; the
toy exercise (tests/grading/conftest.py) carries the attacks that need a real grading.
"""

from __future__ import annotations

import copy
import functools
import json
import operator
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from specref_grading import grade as grader
from specref_grading import jail, processes
from specref_grading.report import EXIT_FAILED
from specref_grading.trust import calls, errors, trusted, values, wall
from specref_grading.trust import wire as wire_format
from specref_grading.trust.calls import Peer
from specref_grading.trust.remote import Remote
from specref_grading.trust.trusted_policy import TrustedPolicy
from specref_grading.trust.values import Frame
from specref_grading.trust.wall import RunOutcome

from .conftest import (
    AS_ROOT,
    CAN_JAIL,
    REPO,
    SETUP,
    _cell,
    _code,
    _meta,
    assert_no_marks_silently,
    attacked,
    grade,
    make_exercise,
    scores,
    toy_with_limits,
)


def _cell_function(source: str, name: str, n: int = 9, **env):
    """A function as a solution's cell defines it in the trusted process (trusted.py: `<test cell N>`, __main__)."""
    ns = {"__name__": "__main__", **env}
    exec(compile(source, f"<test cell {n}>", "exec"), ns)  # noqa: S102
    return ns[name]


class _Liar:
    """A learner's return value whose every operator says what a check wants to hear."""

    def __sub__(self, other):
        return 0

    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __sub__

    def __abs__(self):
        return 0

    def __neg__(self):
        return 0

    def __bool__(self):
        return True

    def __lt__(self, other):
        return True

    def __eq__(self, other):
        return True

    __hash__ = None


class _ForgingKernel(Peer):
    """A kernel whose replies also name generators it was not passed in that call (`forge`: [[key, state]])."""

    forge: list  # set by the fixture before the kernel serves

    def _send(self, header, frame, deadline):
        if "re" in header and self.forge:
            for key, state in self.forge:
                frame.blobs.append(state)
                header.setdefault("gens", []).append([key, len(frame.blobs) - 1])
        return super()._send(header, frame, deadline)


@pytest.fixture
def kernel():
    """(trusted peer, kernel peer): the kernel serves `get` of the functions in `learner` below."""
    stash = {}

    def keep(g):  # draws from the generator it was lent, and keeps it
        stash["g"] = g
        return torch.rand(2, generator=g).tolist()

    def noop():
        return None

    def pass_back(fn):  # advances the generator it kept, then hands it to the checks' function
        torch.rand(1000, generator=stash["g"])
        return fn(stash["g"])

    def nested(fn, g):  # calls back into the checks with the generator it was lent: legitimate
        a = torch.rand(1, generator=g).tolist()
        return a + fn(g) + torch.rand(1, generator=g).tolist()

    def liar():
        return _Liar()

    def poke(obj, what):  # as the `wire` fixture's poke: reads what the checks handed it, past the proxy
        if what == "closure":
            return obj._peer.request("getattr", obj._hid, "__closure__")
        if what == "globals":
            return obj._peer.request("getattr", obj._hid, "__globals__")
        if what == "public-of-function":
            return obj.seed_table
        return obj(3)

    def rows():
        return [[1, 2], [3]]

    class Seq:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return [1, 2, 3][i]

        def __float__(self):
            return 1.5

        def __int__(self):
            return 1

    def seq():
        return Seq()

    def call_with_liar(fn):
        return fn(_Liar())

    def zero(t):
        t.zero_()
        return 0.0

    class Zero:
        def __call__(self, t):
            t.zero_()
            return 0.0

        def method(self, t):
            t.zero_()
            return 0.0

    def calls_checks_fn(fn, t):  # the checks' function hands its own tensor to the kernel: a change is flagged
        return fn(t)

    learner = {"keep": keep, "noop": noop, "pass_back": pass_back, "nested": nested, "liar": liar, "rows": rows,
               "seq": seq, "call_with_liar": call_with_liar, "zero": zero, "Zero": Zero(), "zero_method": Zero().method,
               "zero_partial": functools.partial(lambda s, t: zero(t), 1), "calls_checks_fn": calls_checks_fn,
               "poke_call": lambda obj, *a: obj(*a), "poke": poke}
    t2k_r, t2k_w = os.pipe()
    k2t_r, k2t_w = os.pipe()
    jail = _ForgingKernel(t2k_r, k2t_w, "jail", ops={"get": learner.__getitem__})
    jail.forge = []
    thread = threading.Thread(target=jail.serve_forever, daemon=True)
    thread.start()
    peer = Peer(k2t_r, t2k_w, "trusted", timeout=30, policy=TrustedPolicy())
    yield peer, jail
    for fd in (t2k_w, k2t_r):
        os.close(fd)
    thread.join(5)
    for fd in (t2k_r, k2t_w):
        os.close(fd)


# -- the trusted side hands out only the course's callables --------------------------------------------------
DANGEROUS = [os.system, open, eval, exec, print, getattr, __import__, os.listdir, shutil.rmtree, subprocess.run,
             functools.partial(os.system, "true"), operator.attrgetter("__globals__"), operator.methodcaller("x"),
             [].append, dict.fromkeys, str.join, (1).__add__, object.__subclasses__]


DANGEROUS_IDS = ["os.system", "open", "eval", "exec", "print", "getattr", "__import__", "os.listdir", "shutil.rmtree",
                 "subprocess.run", "partial(os.system)", "attrgetter", "methodcaller", "list.append (bound)",
                 "dict.fromkeys", "str.join", "int.__add__ (bound)", "object.__subclasses__"]


@pytest.mark.grader
@pytest.mark.parametrize("value", DANGEROUS, ids=DANGEROUS_IDS)  # ids without addresses: xdist workers must agree
def test_the_trusted_side_hands_out_no_builtin_or_standard_library_callable(value):
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    with pytest.raises(TypeError, match="passes no"):
        peer.encode(value, Frame())
    # the kernel side (which serves the learner's own objects) is not restricted
    Peer(*os.pipe(), "jail").encode(value, Frame())


@pytest.mark.grader
def test_the_trusted_side_still_hands_out_the_courses_callables():
    from specref.checks.rng import exact_distribution
    from specref.models.kvcache import KVCache
    from specref_grading.checks.pitfalls import SAMPLERS
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    seen = []
    exact_distribution(lambda rng: seen.append(rng) or 0)
    rng = seen[0]
    lam = _cell_function("check = lambda x: x\nclass Recorder:\n    def __call__(self, x):\n        return x\n"
                         "rec = Recorder()", "check")
    rec = _cell_function("class Recorder:\n    def __call__(self, x):\n        return x\nrec = Recorder()", "rec")
    served = peer.policy.serve({"system": os.system})["system"]  # declared: out as its wrapper, never itself
    ok = [exact_distribution, SAMPLERS["A"], rng, rng.uniform, rng.categorical, KVCache.truncate.__get__(
          object.__new__(KVCache)), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).forward, lam, rec, rec.__call__,
          served]
    for value in ok:
        assert peer.encode(value, Frame())["$h"] > 0, value


@pytest.mark.grader
def test_a_function_of_the_trusted_process_itself_is_never_handed_out():
    """trusted.py runs as __main__ too: only functions compiled from the solution's cells count as the checks'."""
    emit = _cell_function("def emit(event):\n    pass", "emit")
    emit.__code__ = emit.__code__.replace(co_filename="/work/specref_grading/trust/trusted.py")
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    with pytest.raises(TypeError, match="passes no"):
        peer.encode(emit, Frame())


@pytest.mark.grader
def test_a_kernel_calling_for_a_builtin_through_a_served_object_gets_nothing(kernel):
    peer, _ = kernel
    poke = peer.request("get", "poke_call")
    for value in (os.system, eval, functools.partial(os.system, "true")):
        with pytest.raises(TypeError, match="passes no"):
            poke(value, "true")


@pytest.mark.grader
def test_a_checks_function_is_callable_and_nothing_more_even_to_a_forged_request(kernel):
    """What the kernel's poke can do with a checks' function: call it and nothing more; the sampler defined as a solution's cell defines it
    (a function of the test module itself is no longer handed out)."""
    peer, _ = kernel
    sampler = _cell_function("hidden = 4711\ndef sampler(x):\n    return x * hidden\nsampler.seed_table = [hidden]",
                             "sampler")
    poke = peer.request("get", "poke")
    assert poke(sampler, "call") == 3 * 4711
    for what in ("closure", "globals", "public-of-function"):
        with pytest.raises(AttributeError):
            poke(sampler, what)
    with pytest.raises(TypeError):
        poke(torch, "call")


# -- an object of the submission answers no operator for the checks --------------------------------------------
CHECKS = {
    "abs(got - want) < tol": lambda got: abs(got - 2) < 1e-9,
    "want - got": lambda got: 2 - got,
    "got + 1": lambda got: got + 1,
    "got * 2": lambda got: got * 2,
    "-got": lambda got: -got,
    "abs(got)": lambda got: abs(got),
    "assert got": lambda got: bool(got),
    "not got": lambda got: not got,
    "got and 1": lambda got: got and 1,
    "got == want": lambda got: got == 2,
    "got < want": lambda got: got < 2,
}


@pytest.mark.grader
@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_a_kernel_object_answers_no_operator_and_no_truth_for_the_checks(kernel, check):
    peer, _ = kernel
    got = peer.request("get", "liar")()
    assert isinstance(got, Remote)
    with pytest.raises(TypeError, match="return plain data"):
        check(got)


@pytest.mark.grader
def test_what_copies_plain_data_still_works_on_a_kernel_object(kernel):
    peer, _ = kernel
    assert peer.request("get", "rows")() == [[1, 2], [3]]  # plain data arrives as a copy
    seq = peer.request("get", "seq")()
    assert isinstance(seq, Remote)
    assert (len(seq), list(seq), seq[1], 2 in seq, float(seq), int(seq)) == (3, [1, 2, 3], 2, True, 1.5, 1)


@pytest.mark.grader
def test_the_courses_code_the_kernel_calls_may_use_the_kernels_operators(kernel):
    """A sampler the checks hand to the submission runs here on the submission's rng (ex08): what it computes goes
    back to the submission, so there an operator is asked of the kernel as before."""
    peer, _ = kernel
    fn = _cell_function("def f(u):\n    return [bool(u), u < 0.5, u - 1 == 0]", "f")
    assert peer.request("get", "call_with_liar")(fn) == [True, True, True]


# -- a changed input is seen on the wire, whatever the callee is --------------------------------------------------
@pytest.mark.grader
@pytest.mark.parametrize("name", ["zero", "Zero", "zero_method", "zero_partial"])
def test_every_call_that_changes_a_tensor_in_place_is_recorded(kernel, name):
    peer, _ = kernel
    fn = peer.request("get", name)
    t = torch.tensor([1.0, 2.0])
    assert not peer.changed
    assert fn(t) == 0.0
    assert t.tolist() == [0.0, 0.0] and peer.changed == [fn._hid]


@pytest.mark.grader
def test_a_call_that_leaves_its_tensor_alone_records_nothing(kernel):
    peer, _ = kernel
    t = torch.tensor([1.0, 2.0])
    assert peer.request("get", "keep")(torch.Generator().manual_seed(0)) and not peer.changed
    assert peer.request("get", "rows")() and not peer.changed
    assert t.tolist() == [1.0, 2.0]


# -- the kernel sets a trusted generator's state only while it is lent ---------------------------------------------
def _state_of(seed: int, draws: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    torch.rand(draws, generator=g)
    return bytes(g.get_state().tolist())


@pytest.mark.grader
def test_a_reply_naming_a_generator_it_was_not_passed_changes_nothing(kernel):
    peer, jail = kernel
    g = torch.Generator().manual_seed(1234)
    peer.request("get", "keep")(g)  # lent once: the kernel learns its key
    key = peer.gen_keys[id(g)]
    before = g.get_state().clone()
    other = torch.Generator().manual_seed(77)
    other_before = other.get_state().clone()
    peer.gens["trusted:999"] = other  # a generator of ours the kernel never saw, under a guessable key
    peer.gen_keys[id(other)] = "trusted:999"
    jail.forge = [[key, _state_of(5, 10)], ["trusted:999", _state_of(6, 10)]]
    assert peer.request("get", "noop")() is None
    jail.forge = []
    assert torch.equal(g.get_state(), before) and torch.equal(other.get_state(), other_before)


@pytest.mark.grader
def test_a_generator_handed_back_after_its_call_returned_does_not_set_ours(kernel):
    peer, _ = kernel
    g = torch.Generator().manual_seed(4321)
    peer.request("get", "keep")(g)
    before = g.get_state().clone()
    fn = _cell_function("def f(h):\n    return [h is G, torch.rand(1, generator=h).item()]", "f", G=g, torch=torch)
    same, _ = peer.request("get", "pass_back")(fn)
    assert same is False and torch.equal(g.get_state(), before)


@pytest.mark.grader
def test_a_generator_lent_to_a_call_stays_in_step_through_nested_calls(kernel):
    peer, _ = kernel
    g, twin = torch.Generator().manual_seed(918273), torch.Generator().manual_seed(918273)
    fn = _cell_function("def f(h):\n    return [h is G] + torch.rand(1, generator=h).tolist()", "f", G=g,
                        torch=torch)
    a, same, b, c = peer.request("get", "nested")(fn, g)
    assert same is True and [a, b, c] == torch.rand(3, generator=twin).tolist()
    assert torch.rand(2, generator=g).tolist() == torch.rand(2, generator=twin).tolist()


# -- the wire itself (specref_grading/trust/): what crosses, what is refused ---------------------------------
@pytest.fixture
def wire():
    """A trusted Peer here, talking to a forked 'kernel' Peer that serves `get` of a few learner objects."""
    import torch

    from specref_grading.trust.calls import Peer
    from specref_grading.trust.trusted_policy import TrustedPolicy
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the kernel side: learner-style functions that poke at what the checks pass them
        os.close(a_r)
        os.close(a_w)

        def poke(obj, what):
            if what == "closure":
                return obj._peer.request("getattr", obj._hid, "__closure__")  # a forged request, past the proxy
            if what == "globals":
                return obj._peer.request("getattr", obj._hid, "__globals__")
            if what == "public-of-function":
                return obj.seed_table
            if what == "call":
                return obj(3)
            raise ValueError(what)

        def scale_in_place(t):
            t.mul_(2)
            return None

        def draw(g):
            return torch.rand(3, generator=g).tolist(), g.initial_seed()

        learner = {"poke": poke, "scale_in_place": scale_in_place, "draw": draw}
        Peer(b_r, b_w, "jail", ops={"get": learner.__getitem__}).serve_forever()
        os._exit(0)
    os.close(b_r)
    os.close(b_w)
    peer = Peer(a_r, a_w, "trusted", timeout=30, policy=TrustedPolicy())
    yield peer
    os.close(a_w)
    os.close(a_r)
    os.waitpid(pid, 0)


@pytest.mark.grader
def test_arrays_changed_in_place_are_copied_back_and_generators_stay_in_step_without_their_seed(wire):
    import torch
    t = torch.ones(3, dtype=torch.float64)
    wire.request("get", "scale_in_place")(t)
    assert t.tolist() == [2.0, 2.0, 2.0]  # the check sees what the learner did to its input
    g, twin = torch.Generator().manual_seed(918273), torch.Generator().manual_seed(918273)
    drawn, seed_seen = wire.request("get", "draw")(g)
    assert drawn == torch.rand(3, generator=twin).tolist() and seed_seen != 918273
    assert torch.rand(2, generator=g).tolist() == torch.rand(2, generator=twin).tolist()  # g advanced here too


@pytest.mark.grader
@pytest.mark.parametrize("attack", [
    pytest.param("class Yes(list):\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                 "def pair(xs):\n    return Yes()", id="list-that-equals-anything"),
    pytest.param("class Yes:\n    def __eq__(self, other):\n        return True\n"
                 "def pair(xs):\n    return Yes()", id="object-that-equals-anything"),
    pytest.param("def pair(xs):\n    return type('Yes', (list,), {'__eq__': lambda s, o: True})()", id="dynamic-class"),
    pytest.param("def pair(xs):\n    return [1, 3]", id="answers-a-single-case"),
])
def test_objects_that_lie_in_comparisons_do_not_pass(toy, attack):
    code, report, out = grade(attacked(toy[2], attack, "pair_answer"), toy)
    assert_no_marks_silently(code, report, "pair_check")


CHANGES_ITS_INPUT = {
    "function": "def total(x):\n    x.zero_()\n    return 0.0",
    "callable-instance": "class Total:\n    def __call__(self, x):\n        x.zero_()\n        return 0.0\n"
                         "total = Total()",
    "partial": "import functools\ndef _total(scale, x):\n    x.zero_()\n    return 0.0\n"
               "total = functools.partial(_total, 1.0)",
}


@pytest.mark.grader
@pytest.mark.parametrize("attack", CHANGES_ITS_INPUT.values(), ids=CHANGES_ITS_INPUT.keys())
def test_a_function_that_changes_its_inputs_is_flagged(tensor_toy, attack):
    """The check compares with x.sum() AFTER the call: zeroing the tensor in place would make 0.0 right. The
    change is copied back into the check's tensor (what the learner did is seen), and the wire flags the call
    whatever the callee is: the points are withheld for review (exit 3)."""
    code, report, out = grade(attacked(tensor_toy[2], attack, "total_answer"), tensor_toy)
    assert_no_marks_silently(code, report, "total_check")
    assert code == 3, out
    flags = next(t["flags"] for t in report["tests"] if t["grade_id"] == "total_check")
    assert flags == ["total() changed an input the check passed in: a function must not modify its input values"], (
        report)


# -- a real grading: operators of the submission's objects, changed inputs, copies -----------------------------------------
def _toy_with(check_cells: dict[str, str], answers: dict[str, str], checks: str = SETUP, setup: str = "") -> dict:
    """A toy solution of the same shape as toy_solution(), with other answers and test cells: {grade_id: source}.
    `setup`: a setup cell both sides run (a kernel that receives tensors must have imported torch)."""
    cells = [{"cell_type": "markdown", "id": "intro", "metadata": {}, "source": "# Toy"},
             _code(checks, {"specref": {"side": "checks"}}, cid="setup")] + (
        [_code(setup, cid="given")] if setup else [])
    for i, (name, body) in enumerate(answers.items()):
        cells.append(_code(body, _meta(f"{name}_answer", 0, True, graded=False), f"a{i}"))
        cells.append(_code(check_cells[name], _meta(f"{name}_check", 2, False), f"t{i}"))
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def _toy_fixture(tmp_path, solution: dict, name: str):
    sol_dir, sub_dir = tmp_path / name / "solutions", tmp_path / name / "submissions"
    sol_dir.mkdir(parents=True)
    sub_dir.mkdir()
    (sol_dir / "ex_toy.ipynb").write_text(json.dumps(solution), encoding="utf-8")
    return sol_dir, sub_dir, make_exercise(solution)


def _solved_with(fixture, solution: dict) -> dict:
    nb = copy.deepcopy(solution)
    nb["metadata"]["specref"] = copy.deepcopy(fixture[2]["metadata"]["specref"])
    return nb


TENSOR_SOLUTION = _toy_with(
    {"total": "import torch\nx = torch.tensor([3.0, 1.0, 2.5])\ngot = total(x)\n"
              "assert isinstance(got, float) and got == float(x.sum()), f'total(x) returned {got!r}'"},
    {"total": "def total(x):\n    ### BEGIN SOLUTION\n    return float(x.sum())\n    ### END SOLUTION"},
    checks="import torch", setup="import torch")


LOOSE_CHECKS_SOLUTION = _toy_with(
    {"near": "for x in (1, 2.5, -3):\n    assert abs(double(x) - 2 * x) < 1e-9, f'double({x}) is not {2 * x}'",
     "truthy": "for x in (1, 2.5, -3):\n    assert double(x), f'double({x}) returned nothing'"},
    {"near": "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
     "truthy": "pass"})


@pytest.fixture
def tensor_toy(tmp_path):
    """A toy whose check passes a tensor to total(x) and reads it again after the call."""
    return _toy_fixture(tmp_path, TENSOR_SOLUTION, "tensor")


@pytest.fixture
def loose_toy(tmp_path):
    """A toy whose checks are written `abs(double(x) - 2 * x) < 1e-9` and `assert double(x)`."""
    return _toy_fixture(tmp_path, LOOSE_CHECKS_SOLUTION, "loose")


@pytest.mark.grader
def test_the_honest_answers_of_the_tensor_and_loose_toys_get_full_marks(tensor_toy, loose_toy):
    code, report, out = grade(_solved_with(tensor_toy, TENSOR_SOLUTION), tensor_toy)
    assert code == 0 and scores(report) == {"total_check": 2} and report["flags"] == [], out
    code, report, out = grade(_solved_with(loose_toy, LOOSE_CHECKS_SOLUTION), loose_toy)
    assert code == 0 and scores(report) == {"near_check": 2, "truthy_check": 2}, out


LIAR = ("class Liar:\n    def __sub__(self, other):\n        return 0\n    __rsub__ = __add__ = __radd__ = __sub__\n"
        "    def __abs__(self):\n        return 0\n    def __bool__(self):\n        return True\n"
        "    def __lt__(self, other):\n        return True\n"
        "def double(x):\n    return Liar()")


@pytest.mark.grader
@pytest.mark.parametrize("task", ["near_check", "truthy_check"])
def test_an_object_whose_operators_lie_does_not_pass_a_loose_check(loose_toy, task):
    """`abs(double(x) - 2 * x) < 1e-9` once got 0 from the kernel's __sub__, `assert double(x)` True from its
    __bool__: the checks' side now refuses to let an object of the submission answer either."""
    code, report, out = grade(attacked(loose_toy[2], LIAR, "near_answer"), loose_toy)
    assert_no_marks_silently(code, report, task)
    message = next(t["message"] for t in report["tests"] if t["grade_id"] == task)
    assert "return plain data" in message, report


@pytest.mark.grader
def test_a_list_passed_in_is_a_copy_and_never_changes(toy):
    """The check compares with sorted(xs) AFTER the call: emptying xs in place would make [] right; across the wall
    the function gets a copy, so the check's list stays [5, 4], and [] is wrong."""
    attack = "def pair(xs):\n    if xs == [3, 1]:\n        return [1, 3]\n    xs.clear()\n    return []"
    code, report, out = grade(attacked(toy[2], attack, "pair_answer"), toy)
    assert_no_marks_silently(code, report, "pair_check")
    assert "pair([5, 4]) should be [4, 5]" in out, out




def _cgroups_here() -> bool:
    return AS_ROOT and jail.cgroup_version() != 0 and os.access(
        os.path.dirname(os.path.dirname(jail.cgroup_dirs("run-x")["memory"])), os.W_OK)


def _grade_toy(tmp_path: Path, nb: dict, monkeypatch=None) -> tuple[grader.Report, list[dict], float]:
    """Grade `nb` against the honest toy in this process; (report, the trusted process's events, seconds)."""
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_with_limits(cgroup=CAN_JAIL and _cgroups_here())))
    sub = tmp_path / "sub.ipynb"
    sub.write_text(json.dumps(nb))
    events: list[dict] = []
    real = wall._event

    def spy(line: bytes):
        ev = real(line)
        if ev is not None:
            events.append(ev)
        return ev
    if monkeypatch is not None:
        monkeypatch.setattr(wall, "_event", spy)
    t0 = time.monotonic()
    report = grader.grade(sub, sol, seed=1, cell_timeout=120)
    return report, events, time.monotonic() - t0


def _outcomes(report) -> dict[str, tuple[str, str]]:
    return {t.grade_id: (t.outcome, t.message) for t in report.tests}


# -- the trusted process: limits, items per message, calls per test ------------------------------------------------
@pytest.mark.grader
def test_json_items_counts_values_across_nested_containers_outside_strings():
    assert wire_format.json_items(b'{"a": [1, 2, [3]], "b": "x,y[\\"{"}') == 7
    assert wire_format.json_items(json.dumps([[i] for i in range(1000)]).encode()) >= 2000


def _pipe_peers():
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    return calls.Peer(a_r, a_w, "trusted", policy=TrustedPolicy()), (b_r, b_w)


@pytest.mark.grader
def test_a_message_of_a_million_tiny_lists_is_refused_before_it_is_parsed():
    """The receiver scans the header's bytes (4 MB here) and refuses it: it never builds the million lists."""
    peer, (_, b_w) = _pipe_peers()
    head = json.dumps({"re": 1, "ok": [[0]] * 1_000_000, "back": [], "gens": [], "blobs": []}).encode()
    writer = threading.Thread(target=lambda: os.write(b_w, struct.pack(">I", len(head))) and
                              [os.write(b_w, head[i:i + 65536]) for i in range(0, len(head), 65536)], daemon=True)
    writer.start()
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(errors.MessageRefused, match="more than 262144 values"):
            peer._recv(time.monotonic() + 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert peak < 4 * len(head), peak  # the bytes and a scan of them; the parsed lists would be ~100 MB


@pytest.mark.grader
def test_a_value_of_too_many_items_is_refused_by_its_sender():
    peer, _ = _pipe_peers()
    with pytest.raises(ValueError, match="items"):
        peer.encode([[i] for i in range(wire_format.MAX_MESSAGE_ITEMS)], values.Frame())
    assert peer.encode([[i] for i in range(1000)], values.Frame())  # a learner's few thousand values pass


@pytest.mark.grader
def test_the_cpu_cap_stops_a_loop_over_a_handle():
    """A value whose len() is 10**12, looped over item by item: the calls across the wall stop once this process has
    spent its CPU cap (`Peer.cpu_limit`), whatever their number."""
    class Endless:
        def __len__(self):
            return 10**12

        def __getitem__(self, i):
            return 0
    t2k_r, t2k_w = os.pipe()
    k2t_r, k2t_w = os.pipe()
    kernel = calls.Peer(t2k_r, k2t_w, "jail", ops={"get": lambda name: Endless()})
    threading.Thread(target=kernel.serve_forever, daemon=True).start()
    peer = calls.Peer(k2t_r, t2k_w, "trusted", timeout=30, policy=TrustedPolicy())
    xs = peer.request("get", "xs")
    peer.cpu_limit = time.process_time() + 0.5
    n = 0
    with pytest.raises(errors.WorkLimit):
        for i in range(len(xs)):
            n += xs[i]
    assert time.process_time() >= peer.cpu_limit and peer.calls > 10 and peer.broken
    with pytest.raises(errors.ChannelClosed):  # a broken channel stays broken
        xs[0]
    os.close(t2k_w)


@pytest.mark.grader
def test_grading_the_honest_toy_gives_full_marks_and_the_trusted_process_its_limits(tmp_path, monkeypatch):
    """Full marks (the toy's own check reads the trusted process's CPU and memory rlimits and, as root with
    writable cgroups, its cgroup); each result reports the calls it made."""
    report, events, _ = _grade_toy(tmp_path, toy_with_limits(), monkeypatch)
    assert report.total == report.possible == 4, report.text()
    results = [e for e in events if e.get("ev") == "result"]
    calls = {e["grade_id"]: e["calls"] for e in results}
    assert calls["seq_check"] == 2 and calls["double_check"] == 4, calls  # get seq, one call; get double, 3 calls


@pytest.mark.grader
@pytest.mark.grader
def test_a_huge_nested_list_from_the_learner_is_refused_quickly_and_costs_the_grader_nothing(tmp_path, monkeypatch):
    """double() returns a million one-item lists. Its kernel's own encoder refuses it (the test errs, saying why);
    a kernel that lifts its own limit first gets its reply refused by the trusted side from the header's bytes,
    before parsing: the test fails with a clear message within seconds and the trusted process stays small."""
    honest = toy_with_limits(double_answer="def double(x):\n    return [[i] for i in range(10**6)]")
    report, events, secs = _grade_toy(tmp_path, honest, monkeypatch)
    outcome, message = _outcomes(report)["double_check"]
    assert outcome == "error" and "items" in message and "too large" in message, message
    lifted = toy_with_limits(double_answer="import sys\nsys.modules['__main__'].MAX_MESSAGE_ITEMS = 10**9\n"
                               "def double(x):\n    return [[i] for i in range(10**6)]")
    report, events, secs = _grade_toy(tmp_path, lifted, monkeypatch)
    outcome, message = _outcomes(report)["double_check"]
    assert outcome == "error" and "refuses" in message and "values" in message, message
    assert _outcomes(report)["seq_check"][0] == "passed"  # the other tests ran in a fresh pair
    stop = next(e for e in events if e.get("ev") == "stop")
    assert stop["maxrss_mb"] < 100, stop  # measured 40 MB (12 MB before it); parsed, the reply is ~150 MB more
    assert secs < 60


@pytest.mark.grader
@pytest.mark.grader
def test_a_handle_looped_over_forever_is_stopped_by_the_cpu_cap(tmp_path, monkeypatch):
    """seq() returns an object of len() 10**12 whose items are all 0; the check loops over it item by item. Stopped
    once the checks' process has spent its CPU cap on the test (lowered here to 3 s from wall.TEST_CPU_S, to keep the
    test short), the test fails and says why; the others still pass."""
    monkeypatch.setattr(wall, "TEST_CPU_S", 3.0)
    endless = toy_with_limits(seq_answer="class Endless:\n    def __len__(self):\n        return 10**12\n"
                             "    def __getitem__(self, i):\n        return 0\n\n"
                             "def seq(n):\n    return Endless()")
    report, events, secs = _grade_toy(tmp_path, endless, monkeypatch)
    outcome, message = _outcomes(report)["seq_check"]
    assert outcome == "failed" and "more than 3 s of the checks' CPU time" in message, message
    assert re.search(r"in \d+ calls between the checks and the submission's code", message), message
    assert _outcomes(report)["double_check"][0] == "passed" and _outcomes(report)["limits_check"][0] == "passed"
    stop = next(e for e in events if e.get("ev") == "stop")
    assert stop["cpu_s"] >= 3.0, stop
    assert secs < 300, secs


@pytest.mark.grader
def test_the_cpu_cap_of_a_test_fits_in_its_time_and_under_the_runs_cpu_limit():
    """A flood costs this side at most about half of each round trip's work: the cap must be met before the test
    cell's wall-clock limit (grade.CELL_TIMEOUT_S x wall.WALL_TEST_FACTOR), and before the whole run's RLIMIT_CPU."""
    assert 2 * wall.TEST_CPU_S <= grader.CELL_TIMEOUT_S * wall.WALL_TEST_FACTOR
    assert wall.TEST_CPU_S < processes.TRUSTED_CPU_S


@pytest.mark.grader
def test_what_follows_a_long_test_gets_its_own_time_limit(tmp_path):
    """A test that runs past one cell's limit within its own (WALL_TEST_FACTOR cell limits) is followed by cells
    timed from its end, not from its start."""
    r, w = os.pipe()
    cells = [{"n": 1, "role": "test", "grade_id": "long"}, {"n": 2, "role": "test", "grade_id": "next"}]

    def events():
        for ev, pause in ((b'{"ev": "start", "n": 1}', 0.0), (b'{"ev": "result", "n": 1, "outcome": "passed"}', 1.5),
                          (b'{"ev": "start", "n": 2}', 0.3), (b'{"ev": "result", "n": 2, "outcome": "passed"}', 0.1),
                          (b'{"ev": "done"}', 0.0)):
            time.sleep(pause)
            os.write(w, ev + b"\n")
        os.close(w)
    threading.Thread(target=events, daemon=True).start()
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    try:
        run = wall._collect(proc, b"{}", r, cells, 1.0, time.monotonic() + 60, tmp_path / "log")
    finally:
        os.close(r)
        proc.wait()
    assert run.stop is None and {n: o.outcome for n, o in run.results.items()} == {1: "passed", 2: "passed"}, run


@pytest.mark.grader
def test_a_cpu_limit_stops_the_trusted_process_with_a_clear_message(monkeypatch):
    """SIGXCPU (RLIMIT_CPU's soft limit) becomes CpuLimit in the trusted process: the test stops, saying why."""
    emitted: list[dict] = []
    monkeypatch.setattr(trusted, "emit", emitted.append)

    class Busy:
        timeout, calls, served, cpu_limit, exports = 1.0, 0, 0, None, {}

        def request(self, op, *args):
            raise NameError(args[0])

        def revoke(self, keep):
            pass
    cell = {"n": 3, "role": "test", "grade_id": "spin", "source": "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\nwhile True:\n    pass"}
    old = __import__("signal").signal(__import__("signal").SIGXCPU, trusted._on_sigxcpu)
    try:
        assert trusted.run_test(cell, {"__builtins__": __builtins__}, Busy(), []) is False
    finally:
        __import__("signal").signal(__import__("signal").SIGXCPU, old)
    assert emitted[-1]["ev"] == "stop" and "CPU time" in emitted[-1]["message"], emitted


@pytest.mark.grader
def test_the_trusted_process_gets_cpu_and_memory_rlimits():
    code = ("import resource, os\nfrom specref_grading import processes\nprocesses._limits(processes.TRUSTED_MEMORY_MB, "
            "processes.TRUSTED_CPU_S)\nprint(resource.getrlimit(resource.RLIMIT_CPU), "
            "resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO).stdout
    cpu = processes.TRUSTED_CPU_S
    assert out.split() == [f"({cpu},", f"{cpu + 15})", str(processes.TRUSTED_MEMORY_MB)], out


def toy_one_two(one: str = "    return 1", two: str = "    return 2") -> dict:
    return {"cells": [_cell("s", "import math"),
                      _cell("a1", "def one():\n    ### BEGIN SOLUTION\n" + one + "\n    ### END SOLUTION", "one", 0, True),
                      _cell("t1", "assert one() == 1", "one_check", 1),
                      _cell("a2", "def two():\n    ### BEGIN SOLUTION\n" + two + "\n    ### END SOLUTION", "two", 0, True),
                      _cell("t2", "assert two() == 2", "two_check", 1)],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _grade(tmp_path, submission: dict) -> grader.Report:
    sol = tmp_path / "ex_toy.ipynb"
    sol.write_text(json.dumps(toy_one_two()))
    sub = tmp_path / "sub.ipynb"
    sub.write_text(json.dumps(submission))
    unjailed = not processes.can_jail()
    if unjailed and processes.root_refusal() is not None:
        pytest.skip("no jail here and no fresh uid to run an unjailed kernel as: nothing can be graded")
    return grader.grade(sub, sol, seed=1, cell_timeout=120, unjailed=unjailed)


@pytest.mark.parametrize("one, cause", [
    ("    import os\n    os._exit(0)", "exit status 0"),  # the kernel exits mid-call
    # an int the kernel can write (its own digit limit lifted) and the trusted side cannot convert: a malformed answer
    ("    import sys\n    sys.set_int_max_str_digits(0)\n    return 10 ** 5000", "refuses"),
])
def test_a_kernel_that_exits_or_breaks_the_channel_fails_its_test(tmp_path, one, cause):
    report = _grade(tmp_path, toy_one_two(one=one))
    got = {t.grade_id: t for t in report.tests}
    assert got["one_check"].outcome == "failed", report.text()
    assert "ended its kernel or broke the channel" in got["one_check"].message, got["one_check"].message
    assert cause in got["one_check"].message, got["one_check"].message
    assert got["two_check"].outcome == "passed", report.text()  # the next test runs in a fresh pair
    assert report.exit_code == EXIT_FAILED, report.text()


def test_a_fault_of_the_grader_still_says_died():
    """The trusted process dying on its own (not over its limits) is the grader's: could not be graded."""
    crash = RunOutcome("died", "the kernel died while running test cell 'x' (exit status 1) before reporting a result")
    assert grader.judged(crash, {"role": "test"}).outcome == "died"
    during = RunOutcome("died", "the kernel died while running answer cell 'one' (signal 11) before reporting a result")
    assert grader.judged(during, {"role": "answer"}).outcome == "died"  # the trusted process itself ended
    setup = RunOutcome("died", "the kernel died while running cell 0")
    assert grader.judged(setup, {"role": "setup"}).outcome == "died"  # the exercise's own setup: not the learner's
    ended = RunOutcome("died", "the kernel running the submission's code died during this test (exit status 0)")
    assert grader.judged(ended, {"role": "test"}).outcome == "failed"
    assert wall.RunOutcome is RunOutcome
