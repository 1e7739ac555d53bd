"""What the trusted side hands the learner's code: declared wrappers (specref_grading/trust/exports.py), never the real
objects.

Threat: the learner's code reaches, through an object a check passed it (a model, a cache, a sampler, a bound
method, a generator), what the check did not mean to give: the checks' globals, a model's hooks or weights, the
counters a check reads, the object behind a wrapper. Each declared kind is used here as the honest solutions use it
(from a real kernel program, ``python -I``, as the jail runs it); undeclared objects are refused; the attacks fail;
and the same attacks succeed once the policy is monkeypatched to export the real objects (the negative control).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from specref.checks.rng import exact_distribution
from specref.models.gpt2 import GPT2, GPT2Config
from specref_grading.checks.gpt2_pair import _Memo
from specref_grading.checks.pitfalls import SAMPLERS, reference_cases
from specref_grading.checks.speedup import VerifyCost
from specref_grading.trust import exports
from specref_grading.trust.calls import Peer
from specref_grading.trust.trusted_policy import TrustedPolicy
from specref_grading.trust.values import Frame

from .conftest import kernel_peer

pytestmark = pytest.mark.grader

LEARNER = '''
import torch

def pass_bytes(model, S):
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(2 * model.config.n_embd * b.attn.c_attn.weight.element_size() for b in model.transformer.h)
    return weights + kv * S

def flops_weights(model):
    ws = [model.lm_head.weight] + [w for b in model.transformer.h for w in (
        b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
    return sum(w.numel() for w in ws), len(model.transformer.h), model.transformer.h[0].attn.c_attn.weight.shape[0]

def listings(model):
    return (type(model.parameters()).__name__, [n for n, _ in model.named_parameters()][:2],
            len(model.modules()), model.dtype, model.num_parameters())

def decode(model, ids):
    cache = model.new_cache(1)
    logits = model(torch.tensor([ids]), cache=cache)
    before = int(cache.lengths[0])
    cache.truncate(2)
    return logits[0, -1], before, int(cache.lengths[0]), cache.max_len

def coin(rng):
    u = rng.uniform()
    return 0 if u < 0.25 else 1 + rng.categorical(torch.tensor([0.5, 0.5]))

def affine(rng):
    return int(2 * rng.uniform() - 0.5 > 0.5)

def call(fn, *args):
    return fn(*args)

def probe(obj, path):
    x = obj
    for name in path.split("."):
        x = getattr(x, name)
    return x

def forged(obj, name):
    return obj._peer.request("getattr", obj._hid, name)  # past the proxy's own refusal of private names
'''


@pytest.fixture
def kernel():
    """A trusted peer talking to the kernel's program in a fresh ``python -I`` (the jail's command, unjailed)."""
    with kernel_peer(timeout=120) as peer:
        assert peer.request("exec", LEARNER, "<answer cell 1>") is None
        yield peer, lambda name: peer.request("get", name)


def _small(dtype=torch.float32) -> GPT2:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=2, n_head=2, n_inner=24)
    return GPT2(cfg).to(dtype).eval()


# -- each declared kind, as the honest solutions use it ------------------------------------------------------------
def test_a_model_is_read_as_the_roofline_exercise_reads_it(kernel):
    _, get = kernel
    model = _small(torch.bfloat16)
    want = sum(p.numel() * p.element_size() for p in model.parameters()) + 2 * 16 * 2 * 2 * 7
    assert get("pass_bytes")(model, 7) == want
    blocks = sum(b.attn.c_attn.weight.numel() + b.attn.c_proj.weight.numel() + b.mlp.c_fc.weight.numel()
                 + b.mlp.c_proj.weight.numel() for b in model.transformer.h)
    assert get("flops_weights")(model) == (blocks + model.lm_head.weight.numel(), 2, 16)
    kind, names, n_modules, dtype, n_params = get("listings")(model)
    assert kind == "list" and names == [n for n, _ in model.named_parameters()][:2]  # a list, never a generator
    assert (n_modules, dtype, n_params) == (len(list(model.modules())), torch.bfloat16, model.num_parameters())


def test_a_model_is_called_with_its_cache_as_the_pair_exercise_calls_it(kernel):
    _, get = kernel
    model = _small()
    ids = [1, 5, 7, 3, 9]
    with torch.no_grad():
        want = model(torch.tensor([ids]), cache=model.new_cache(1))[0, -1]
    for served in (model, _Memo(model)):  # the bare model and the pair check's counting wrapper
        logits, before, after, max_len = get("decode")(served, ids)
        assert torch.equal(logits, want) and (before, after, max_len) == (5, 2, 32)
    memo = _Memo(model)
    get("decode")(memo, ids)
    assert memo.calls == 1  # the pass went through the wrapper, counted


def test_the_symbolic_rng_and_its_uniforms_enumerate_exactly(kernel):
    _, get = kernel
    coin, affine = get("coin"), get("affine")
    assert exact_distribution(lambda rng: coin(rng)) == pytest.approx({0: 0.25, 1: 0.375, 2: 0.375}, abs=1e-12)
    assert exact_distribution(lambda rng: affine(rng)) == pytest.approx({0: 0.5, 1: 0.5}, abs=1e-12)


def test_course_callables_are_calls(kernel):
    peer, get = kernel
    call = get("call")
    assert call(VerifyCost("linear", g=0.5), 2) == 2.0
    target, draft, start = reference_cases(1)[0]
    sampler = SAMPLERS["A"]  # a course function, called with the checks' own rng coming back as itself
    want = exact_distribution(lambda rng: tuple(sampler(target, draft, start, 2, rng)))
    assert exact_distribution(lambda rng: tuple(call(sampler, target, draft, start, 2, rng))) == want
    assert call(peer.policy.serve({"sq": lambda: 7 * 7})["sq"]) == 49


# -- undeclared objects --------------------------------------------------------------------------------------------
UNDECLARED = [object(), functools.partial(len, [1]), (x for x in range(3)), iter([1]), os.system, os, int, {1: 2}.keys(),
              torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)]


@pytest.mark.parametrize("value", UNDECLARED, ids=["object", "partial", "generator", "list_iterator", "os.system",
                                                    "module", "class", "dict_keys", "optimizer"])
def test_an_undeclared_object_is_refused_naming_its_type(value):
    with pytest.raises(TypeError, match=f"passes no .*{type(value).__qualname__}.*not a declared kind"):
        Peer(*os.pipe(), "trusted", policy=TrustedPolicy()).encode(value, Frame())


def _cell_class(source: str, name: str):
    ns = {"__name__": "__main__"}
    exec(compile(source, "<setup cell 1>", "exec"), ns)  # noqa: S102  as trusted.py compiles a solution's cell
    return ns[name]


def test_only_course_code_leaves_as_a_call_not_the_graders_machinery_or_plain_torch_functions():
    from specref.sampling import sample
    from specref_grading import processes
    from specref_grading.checks.speedup import check_accepted_counts

    for fn in (sample, check_accepted_counts, torch.nn.Linear(2, 2).forward, _cell_class(
            "def f(x):\n    return x\n", "f")):
        assert isinstance(exports.declare(fn), exports.Call), fn
    for fn in (torch.load, torch.save, processes.unjailed_uid, processes.make_undumpable):
        with pytest.raises(TypeError, match="not a declared kind"):
            exports.declare(fn)


def test_a_cells_callable_is_a_call_only_if_every_class_and_function_behind_it_is_the_cells():
    ok = _cell_class("class Step:\n    def __call__(self, x):\n        return x\n", "Step")()
    assert isinstance(exports.declare(ok), exports.Call)
    inherited = _cell_class("import functools\nclass P(functools.partial):\n    pass\n", "P")(len, [1])
    static = _cell_class("class S:\n    __call__ = staticmethod(eval)\n", "S")()
    for x in (inherited, static):
        with pytest.raises(TypeError, match="not a declared kind"):
            exports.declare(x)


def test_a_cache_is_truncated_as_a_learner_truncates_it_never_with_the_caches_own_keywords():
    model = GPT2(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=32))
    cache = model.new_cache(1, max_len=32)
    model(torch.tensor([[1, 2, 3, 4]]), cache=cache)
    wrapped = exports.declare(cache)
    wrapped.truncate(2)
    assert int(cache.lengths[0]) == 2 and wrapped.capacity(1) == cache.capacity(1)
    with pytest.raises(TypeError):
        wrapped.truncate(4, check=False)  # growing past the rows' tokens, as the cache's callers may not either
    with pytest.raises(TypeError):
        wrapped.truncate(1, bound=-9)
    assert int(cache.lengths[0]) == 2


def test_the_real_object_never_leaves_and_comes_back_as_itself():
    peer = Peer(*os.pipe(), "trusted", policy=TrustedPolicy())
    model = _small()
    handle = peer.encode(model, Frame())
    assert type(peer.exports[handle["$h"]]) is exports.Model and peer.exports[handle["$h"]] is not model
    assert peer.encode(model, Frame())["$h"] == handle["$h"]  # one handle per object
    assert peer.decode({"$h": handle["$h"], "own": False}, Frame()) is model  # the checks get their own object back
    assert not hasattr(exports.Model(model), "__dict__")


# -- attacks -------------------------------------------------------------------------------------------------------
def _objects():
    model = _small()
    cache = model.new_cache(1)
    return {"model": model, "memo": _Memo(model), "cache": cache, "cost": VerifyCost("linear", g=0.5),
            "sampler": SAMPLERS["A"]}


# Public names: what a real object's attributes gave before the wrappers (the negative control shows they do).
PUBLIC = [("model", "register_forward_hook"), ("model", "load_state_dict"), ("model", "state_dict"),
          ("model", "eval"), ("model", "apply"), ("model", "forward"), ("model", "transformer.h.append"),
          ("memo", "fed"), ("memo", "calls"), ("memo", "get_submodule"), ("cache", "k"), ("cache", "compact"),
          ("cost", "shape"), ("cost", "costs")]
# Private names: refused by the proxy and by the owner, whatever the policy (a forged request past the proxy).
PRIVATE = [("model", "_modules"), ("model", "__dict__"), ("memo", "_inner"), ("cache", "_grader_tokens"),
           ("sampler", "__globals__"), ("model", "_target")]


def _probe(get, objects, which, path):
    return get("probe")(objects[which], path)


@pytest.mark.parametrize("which,path", PUBLIC, ids=[f"{w}.{p}" for w, p in PUBLIC])
def test_an_attribute_the_kind_does_not_declare_is_refused(kernel, which, path):
    _, get = kernel
    with pytest.raises(AttributeError):
        _probe(get, _objects(), which, path)


@pytest.mark.parametrize("which,name", PRIVATE, ids=[f"{w}.{n}" for w, n in PRIVATE])
def test_a_forged_request_for_a_private_name_is_refused(kernel, which, name):
    _, get = kernel
    with pytest.raises(AttributeError):
        get("forged")(_objects()[which], name)


def test_a_method_handed_out_is_a_call_and_nothing_else(kernel):
    _, get = kernel
    model = _small()
    for path in ("parameters.__self__", "new_cache.__func__", "parameters.im_self"):
        with pytest.raises(AttributeError):
            _probe(get, {"model": model}, "model", path)
    seen = []
    exact_distribution(lambda rng: seen.append(rng) or 0)
    for path in ("uniform.__func__", "uniform.__self__", "_engine"):
        with pytest.raises(AttributeError):
            _probe(get, {"rng": seen[0]}, "rng", path)


# -- the negative control: the same attacks against real objects ----------------------------------------------------
CONTROL = [("model", "register_forward_hook"), ("model", "load_state_dict"), ("memo", "fed"), ("cache", "k"),
           ("cost", "shape"), ("model", "transformer.h.append")]


@pytest.mark.parametrize("which,path", CONTROL, ids=[f"{w}.{p}" for w, p in CONTROL])
def test_control_the_same_attack_on_an_unwrapped_export_succeeds(kernel, monkeypatch, which, path):
    """With a policy that lets the real object out and every public attribute be read, the probe gets through:
    the refusals above come from the declared wrappers, not from the probe."""
    peer, get = kernel
    monkeypatch.setattr(TrustedPolicy, "check_export", lambda self, x: None)
    monkeypatch.setattr(TrustedPolicy, "check_getattr", lambda self, obj, name: None)
    objects = _objects()
    got = _probe(get, objects, which, path)  # no AttributeError: the kernel read it
    assert got is not None
    if which == "model" and path != "transformer.h.append":  # a handle the kernel held on the real model's method
        assert got.__self__ is objects["model"]
