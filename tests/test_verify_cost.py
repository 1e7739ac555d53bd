"""measure_pass_costs: the pairing of repeats, the ratios, the conditions it records, its refusals."""

from __future__ import annotations

import pytest
import torch

from specref.models.gpt2 import GPT2, GPT2Config
from specref.perf import verify_cost
from specref.perf.verify_cost import PassCosts, measure_pass_costs


def tiny(n_layer: int = 2) -> GPT2:
    torch.manual_seed(0)
    return GPT2(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=n_layer, n_head=2)).eval()


def test_ratios_are_per_repeat_pairs_and_their_median():
    costs = PassCosts(ks=(2,), one=(1.0, 2.0, 4.0), verify={2: (1.5, 2.0, 8.0)}, draft=(0.1, 0.4, 0.4),
                      context=8, batch_size=1, threads=1, clock="cpu", kernel="torch")
    assert costs.v_repeats(2) == [1.5, 1.0, 2.0]
    assert costs.v(2) == 1.5 and costs.v_range(2) == (1.0, 2.0)
    assert costs.c_repeats() == [0.1, 0.2, 0.1] and costs.c == 0.1
    assert costs.one_pass == 2.0


def test_conditions_name_everything_a_ratio_depends_on():
    costs = PassCosts(ks=(1,), one=(1.0,), verify={1: (1.0,)}, draft=None, context=48, batch_size=3, threads=2,
                      clock="wall", kernel="compiled (few-token kernel)")
    text = costs.conditions()
    for part in ("batch 3", "48 cached tokens", "2 torch threads", "wall-clock", "1 paired repeat", "compiled"):
        assert part in text
    with pytest.raises(ValueError, match="no draft was timed"):
        _ = costs.c


def test_measure_times_every_pass_once_per_repeat_in_a_fixed_order(monkeypatch):
    order = []
    real = verify_cost.repeat_times

    def spy(fn, device, repeats, warmup, clock):
        order.append(fn)
        return real(fn, device, repeats=repeats, warmup=warmup, clock=clock)

    monkeypatch.setattr(verify_cost, "repeat_times", spy)
    target, draft = tiny(2), tiny(1)
    costs = measure_pass_costs(target, [1, 3], draft=draft, context=8, repeats=3)
    assert len(order) == 3 * 4  # per repeat: target over 1, 2 and 4 tokens, then the draft
    assert order[:4] == order[4:8] == order[8:]  # the same passes in the same order each repeat
    assert len(costs.one) == len(costs.verify[3]) == len(costs.draft) == 3
    assert costs.threads == torch.get_num_threads() and costs.clock == "cpu"
    assert costs.kernel.startswith("torch")
    assert "v(3)" in costs.table() and "c    =" in costs.table()


def test_measure_leaves_the_cache_at_the_context_for_every_pass(monkeypatch):
    """Each timed pass scores its tokens after exactly `context` cached ones, as a verifier's pass does."""
    seen = []
    target = tiny(1)
    real_forward = target.forward

    def forward(ids, cache=None, **kw):
        if cache is not None:
            seen.append((int(cache.lengths[0]), ids.shape[1]))
        return real_forward(ids, cache=cache, **kw)

    monkeypatch.setattr(target, "forward", forward)
    measure_pass_costs(target, [2], context=5, repeats=2)
    timed = [s for s in seen if s[0] != 0]  # the prefills start from an empty cache
    assert timed and all(length == 5 for length, _ in timed)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(ks=[]), ValueError, "ks must hold"),
    (dict(ks=[0]), ValueError, "ks must hold"),
    (dict(ks=[1], context=0), ValueError, "context"),
    (dict(ks=[1], repeats=0), ValueError, "repeats"),
    (dict(ks=[1], clock="sundial"), ValueError, "clock must be"),
    (dict(ks=[1], context=63), ValueError, "exceeds"),
    (dict(ks=[1.5]), TypeError, "ks"),
])
def test_measure_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        measure_pass_costs(tiny(1), **kwargs)


def test_the_record_says_where_the_few_token_kernel_stopped_serving():
    head = torch.nn.Linear(2, 2)
    model = torch.nn.Module()
    model.lm_head = head
    assert verify_cost._kernel_of(model, 5).startswith("torch")
    head.fast = object()
    assert verify_cost._kernel_of(model, 5) == "compiled (few-token kernel)"
    assert "PyTorch's own past that" in verify_cost._kernel_of(model, verify_cost.MAX_ROWS + 1)


def test_the_cpu_clock_is_refused_for_a_gpu_target(monkeypatch):
    target = tiny(1)
    monkeypatch.setattr(type(target), "device", property(lambda self: torch.device("cuda")))
    with pytest.raises(ValueError, match="clock must be"):
        measure_pass_costs(target, [1], clock="cpu")
