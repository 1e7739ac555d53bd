"""The grading wall's wire (specref_grading/trust/) against a hostile kernel: what the trusted side hands out,
what a kernel's object may answer for the checks, and whose generators the kernel may set.

A trusted `Peer` here talks to a 'kernel' `Peer` in a thread of this process (no jail, no torch import beyond the
test's own): each kernel function below is what a learner's answer could be, or a kernel that forges messages.
"""

from __future__ import annotations

import functools
import operator
import os
import shutil
import subprocess
import threading

import pytest
import torch

from specref_grading.trust.calls import Peer
from specref_grading.trust.remote import Remote
from specref_grading.trust.trusted_policy import TrustedPolicy
from specref_grading.trust.values import Frame


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

    def poke(obj, what):  # tests/test_grade_wall.py's poke: reads what the checks handed it, past the proxy
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


# -- 1. the trusted side hands out only the course's callables --------------------------------------------------
DANGEROUS = [os.system, open, eval, exec, print, getattr, __import__, os.listdir, shutil.rmtree, subprocess.run,
             functools.partial(os.system, "true"), operator.attrgetter("__globals__"), operator.methodcaller("x"),
             [].append, dict.fromkeys, str.join, (1).__add__, object.__subclasses__]


DANGEROUS_IDS = ["os.system", "open", "eval", "exec", "print", "getattr", "__import__", "os.listdir", "shutil.rmtree",
                 "subprocess.run", "partial(os.system)", "attrgetter", "methodcaller", "list.append (bound)",
                 "dict.fromkeys", "str.join", "int.__add__ (bound)", "object.__subclasses__"]


@pytest.mark.parametrize("value", DANGEROUS, ids=DANGEROUS_IDS)  # ids without addresses: xdist workers must agree
def test_the_trusted_side_hands_out_no_builtin_or_standard_library_callable(value):
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    with pytest.raises(TypeError, match="passes no"):
        peer.encode(value, Frame())
    # the kernel side (which serves the learner's own objects) is not restricted
    Peer(*os.pipe(), "jail").encode(value, Frame())


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


def test_a_function_of_the_trusted_process_itself_is_never_handed_out():
    """trusted.py runs as __main__ too: only functions compiled from the solution's cells count as the checks'."""
    emit = _cell_function("def emit(event):\n    pass", "emit")
    emit.__code__ = emit.__code__.replace(co_filename="/work/specref_grading/trust/trusted.py")
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    with pytest.raises(TypeError, match="passes no"):
        peer.encode(emit, Frame())


def test_a_kernel_calling_for_a_builtin_through_a_served_object_gets_nothing(kernel):
    peer, _ = kernel
    poke = peer.request("get", "poke_call")
    for value in (os.system, eval, functools.partial(os.system, "true")):
        with pytest.raises(TypeError, match="passes no"):
            poke(value, "true")


def test_a_checks_function_is_callable_and_nothing_more_even_to_a_forged_request(kernel):
    """tests/test_grade_wall.py's test of the same name, with the sampler defined as a solution's cell defines it
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


# -- 2. an object of the submission answers no operator for the checks --------------------------------------------
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


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_a_kernel_object_answers_no_operator_and_no_truth_for_the_checks(kernel, check):
    peer, _ = kernel
    got = peer.request("get", "liar")()
    assert isinstance(got, Remote)
    with pytest.raises(TypeError, match="return plain data"):
        check(got)


def test_what_copies_plain_data_still_works_on_a_kernel_object(kernel):
    peer, _ = kernel
    assert peer.request("get", "rows")() == [[1, 2], [3]]  # plain data arrives as a copy
    seq = peer.request("get", "seq")()
    assert isinstance(seq, Remote)
    assert (len(seq), list(seq), seq[1], 2 in seq, float(seq), int(seq)) == (3, [1, 2, 3], 2, True, 1.5, 1)


def test_the_courses_code_the_kernel_calls_may_use_the_kernels_operators(kernel):
    """A sampler the checks hand to the submission runs here on the submission's rng (ex08): what it computes goes
    back to the submission, so there an operator is asked of the kernel as before."""
    peer, _ = kernel
    fn = _cell_function("def f(u):\n    return [bool(u), u < 0.5, u - 1 == 0]", "f")
    assert peer.request("get", "call_with_liar")(fn) == [True, True, True]


# -- 3. a changed input is seen on the wire, whatever the callee is --------------------------------------------------
@pytest.mark.parametrize("name", ["zero", "Zero", "zero_method", "zero_partial"])
def test_every_call_that_changes_a_tensor_in_place_is_recorded(kernel, name):
    peer, _ = kernel
    fn = peer.request("get", name)
    t = torch.tensor([1.0, 2.0])
    assert not peer.changed
    assert fn(t) == 0.0
    assert t.tolist() == [0.0, 0.0] and peer.changed == [fn._hid]


def test_a_call_that_leaves_its_tensor_alone_records_nothing(kernel):
    peer, _ = kernel
    t = torch.tensor([1.0, 2.0])
    assert peer.request("get", "keep")(torch.Generator().manual_seed(0)) and not peer.changed
    assert peer.request("get", "rows")() and not peer.changed
    assert t.tolist() == [1.0, 2.0]


# -- 4. the kernel sets a trusted generator's state only while it is lent ---------------------------------------------
def _state_of(seed: int, draws: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    torch.rand(draws, generator=g)
    return bytes(g.get_state().tolist())


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


def test_a_generator_handed_back_after_its_call_returned_does_not_set_ours(kernel):
    peer, _ = kernel
    g = torch.Generator().manual_seed(4321)
    peer.request("get", "keep")(g)
    before = g.get_state().clone()
    fn = _cell_function("def f(h):\n    return [h is G, torch.rand(1, generator=h).item()]", "f", G=g, torch=torch)
    same, _ = peer.request("get", "pass_back")(fn)
    assert same is False and torch.equal(g.get_state(), before)


def test_a_generator_lent_to_a_call_stays_in_step_through_nested_calls(kernel):
    peer, _ = kernel
    g, twin = torch.Generator().manual_seed(918273), torch.Generator().manual_seed(918273)
    fn = _cell_function("def f(h):\n    return [h is G] + torch.rand(1, generator=h).tolist()", "f", G=g,
                        torch=torch)
    a, same, b, c = peer.request("get", "nested")(fn, g)
    assert same is True and [a, b, c] == torch.rand(3, generator=twin).tolist()
    assert torch.rand(2, generator=g).tolist() == torch.rand(2, generator=twin).tolist()


# About the grader, not numerics of ours: tools/upkeep/portable.py leaves these out.
pytestmark = pytest.mark.grader
