"""CapturedPasses' bookkeeping, on the CPU with a fake graph (tests/test_cuda.py runs the real one).

Every test here patches `graphs.CudaGraph` with the fake and `graphs.capturable` to take the CPU,
except those that check the unpatched default.

The fake records like a CUDA graph: capture runs nothing of ``fn`` that a replay would see
(it calls ``fn`` on the static inputs once, with side effects switched off), and ``replay``
writes fresh results into the *same* static output tensors, as a replay of real kernels does.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import pytest
import torch

import specref.models.graphs as graphs
from specref.models.graphs import CapturedPasses


class FakeGraph:
    made: ClassVar[list[FakeGraph]] = []

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0
        self.pool_seen: Any = "unset"
        FakeGraph.made.append(self)

    def capture(self, fn, inputs, pool):
        self.captures += 1
        self.pool_seen = pool
        self.fn, self.inputs = fn, inputs
        with capturing():
            self.outputs = fn(*inputs)
        return self.outputs

    def replay(self) -> None:
        self.replays += 1
        fresh = self.fn(*self.inputs)
        outs = self.outputs if isinstance(self.outputs, tuple) else (self.outputs,)
        news = fresh if isinstance(fresh, tuple) else (fresh,)
        for static, new in zip(outs, news):
            static.copy_(new)  # in place, as kernels replayed on the captured addresses do

    def pool(self) -> str:
        return f"pool-of-{id(self)}"


_CAPTURING = [False]


class capturing:
    """While a fake capture runs: real capture executes no kernel, so ``fn``'s side effects must not happen."""

    def __enter__(self):
        _CAPTURING[0] = True

    def __exit__(self, *exc):
        _CAPTURING[0] = False


class Pair(NamedTuple):
    logits: torch.Tensor
    hidden: torch.Tensor


class Counter:
    """A pass with a persistent side effect (like a KV cache's lengths) and a count of real executions."""

    def __init__(self) -> None:
        self.length = torch.zeros((), dtype=torch.long)
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> Pair:
        if not _CAPTURING[0]:
            self.calls += 1
            self.length.add_(x.shape[-1])
        return Pair(2 * x + 1, x.sum(-1, keepdim=True))


@pytest.fixture(autouse=True)
def _fake_graphs_on_the_cpu(monkeypatch):
    FakeGraph.made.clear()
    monkeypatch.setattr(graphs, "CudaGraph", FakeGraph)
    monkeypatch.setattr(graphs, "capturable", lambda device: device.type == "cpu")


def fake(enabled: bool = True) -> CapturedPasses:
    return CapturedPasses(enabled)


def test_one_capture_per_key_and_the_first_call_is_the_eager_warm_up():
    passes, fn = fake(), Counter()
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
    first = passes.run("T=3", fn, a)
    assert len(FakeGraph.made) == 1 and FakeGraph.made[0].captures == 1 and FakeGraph.made[0].replays == 0
    torch.testing.assert_close(first.logits, 2 * a + 1)
    assert fn.calls == 1 and int(fn.length) == 3  # the side effect happened once, not again at capture
    for _ in range(3):
        passes.run("T=3", fn, b)
    assert len(FakeGraph.made) == 1 and FakeGraph.made[0].replays == 3 and fn.calls == 4
    passes.run("T=1", fn, torch.ones(2, 1))
    assert len(FakeGraph.made) == 2 and len(passes) == 2 and "T=1" in passes


def test_graphs_share_the_first_graphs_pool():
    passes, fn = fake(), Counter()
    passes.run(1, fn, torch.ones(1, 1))
    passes.run(2, fn, torch.ones(1, 2))
    first, second = FakeGraph.made
    assert first.pool_seen is None and second.pool_seen == first.pool()


def test_static_buffers_receive_new_inputs_and_replays_compute_on_them():
    passes, fn = fake(), Counter()
    passes.run("k", fn, torch.zeros(2, 3))
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    out = passes.run("k", fn, x)
    assert torch.equal(FakeGraph.made[0].inputs[0], x)
    torch.testing.assert_close(out.logits, 2 * x + 1)
    torch.testing.assert_close(out.hidden, x.sum(-1, keepdim=True))
    assert isinstance(out, Pair)  # a NamedTuple keeps its type


def test_returned_outputs_are_copies_that_later_replays_do_not_change():
    passes, fn = fake(), Counter()
    passes.run("k", fn, torch.zeros(2, 3))
    one = passes.run("k", fn, torch.ones(2, 3))
    kept = one.logits.clone()
    two = passes.run("k", fn, torch.full((2, 3), 5.0))
    assert torch.equal(one.logits, kept) and not torch.equal(two.logits, kept)
    static = FakeGraph.made[0].outputs
    assert one.logits.data_ptr() != static.logits.data_ptr() and two.logits.data_ptr() != static.logits.data_ptr()


def test_the_caller_s_input_is_not_the_static_buffer():
    passes, fn = fake(), Counter()
    x = torch.zeros(2, 3)
    passes.run("k", fn, x)
    x.fill_(7.0)  # the caller reuses its tensor: the graph holds its own copy
    assert torch.equal(FakeGraph.made[0].inputs[0], torch.zeros(2, 3))


def test_a_single_tensor_output_comes_back_cloned():
    passes = fake()
    passes.run("k", lambda x: x * 3, torch.ones(4))
    out = passes.run("k", lambda x: x * 3, torch.full((4,), 2.0))
    assert torch.equal(out, torch.full((4,), 6.0)) and out.data_ptr() != FakeGraph.made[0].outputs.data_ptr()


@pytest.mark.parametrize("bad, what", [
    (torch.ones(2, 4), "shape"),
    (torch.ones(2, 3, dtype=torch.float64), "dtype"),
])
def test_inputs_that_do_not_match_the_key_s_buffers_are_refused(bad, what):
    passes, fn = fake(), Counter()
    passes.run("k", fn, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"input 0 of key 'k' must match the captured buffer"):
        passes.run("k", fn, bad)
    with pytest.raises(ValueError, match="captured with 1 inputs, got 2"):
        passes.run("k", lambda x, y: x + y, torch.ones(2, 3), torch.ones(2, 3))
    assert FakeGraph.made[0].replays == 0


def test_non_tensor_inputs_and_outputs_are_refused():
    passes = fake()
    with pytest.raises(TypeError, match="input 1 of key 'k' is a int"):
        passes.run("k", lambda x, n: x, torch.ones(1), 3)
    with pytest.raises(TypeError, match="returned a float"):
        passes.run("j", lambda x: (x, 1.5), torch.ones(1))
    assert len(passes) == 0


def test_disabled_calls_fn_directly_every_time():
    passes, fn = fake(enabled=False), Counter()
    for n in (1, 2, 3):
        out = passes.run("k", fn, torch.ones(1, n))
        assert out.logits.shape == (1, n)  # another shape under the same key: no capture, no check
    assert FakeGraph.made == [] and fn.calls == 3 and int(fn.length) == 6


def test_the_switch_turns_replay_off_and_on():
    passes, fn = fake(), Counter()
    passes.run("k", fn, torch.ones(1, 2))
    passes.enabled = False
    passes.run("k", fn, torch.ones(1, 2))
    assert FakeGraph.made[0].replays == 0
    passes.enabled = True
    passes.run("k", fn, torch.ones(1, 2))
    assert FakeGraph.made[0].replays == 1


def test_inputs_off_the_graph_device_run_eagerly(monkeypatch):
    monkeypatch.setattr(graphs, "capturable", lambda device: device.type == "cuda")  # the default rule
    passes = CapturedPasses()  # graphs only for CUDA inputs: these are on the CPU
    fn = Counter()
    for _ in range(3):
        passes.run("k", fn, torch.ones(1, 2))
    assert FakeGraph.made == [] and fn.calls == 3 and len(passes) == 0


def test_the_default_on_the_cpu_is_plain_eager(monkeypatch):
    monkeypatch.undo()  # the real `capturable` and `CudaGraph`
    assert not graphs.capturable(torch.device("cpu")) and graphs.capturable(torch.device("cuda"))
    passes, fn = CapturedPasses(), Counter()
    out = passes.run("k", fn, torch.ones(1, 2))
    out2 = passes.run("k", fn, torch.ones(1, 5))
    assert fn.calls == 2 and len(passes) == 0 and out2.logits.shape == (1, 5) and out.logits.shape == (1, 2)


def test_clear_forgets_graphs_and_captures_again():
    passes, fn = fake(), Counter()
    passes.run("k", fn, torch.ones(1, 2))
    passes.clear()
    assert len(passes) == 0
    passes.run("k", fn, torch.ones(1, 3))  # a new shape is fine after clear
    assert len(FakeGraph.made) == 2 and FakeGraph.made[1].pool_seen is None


def test_a_capture_failure_warns_names_the_key_keeps_the_eager_result_and_stays_eager(monkeypatch):
    made = []

    class Failing(FakeGraph):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

        def capture(self, fn, inputs, pool):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "CudaGraph", Failing)
    passes = CapturedPasses()
    with pytest.warns(RuntimeWarning, match="key 'k' could not be captured"):
        assert torch.equal(passes.run("k", lambda x: x + 1, torch.ones(1)), torch.full((1,), 2.0))
    assert len(passes) == 0 and "k" not in passes
    assert torch.equal(passes.run("k", lambda x: x + 2, torch.ones(1)), torch.full((1,), 3.0))  # eager, no retry
    assert len(made) == 1
    passes.clear()  # clear forgets the failure too: the next call tries to capture again
    with pytest.warns(RuntimeWarning):
        passes.run("k", lambda x: x + 1, torch.ones(1))
    assert len(made) == 2


def test_enabled_must_be_a_bool():
    with pytest.raises(TypeError, match="enabled must be a bool"):
        CapturedPasses(1)  # type: ignore[arg-type]
