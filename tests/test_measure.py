"""specref.perf.measure and specref.perf.costs: the bookkeeping behind the speedup tables."""

from __future__ import annotations

import pytest
import torch
from model_factory import noisy_copy, small_gpt2

from specref.decoding.chain import speculative_generate
from specref.perf.costs import forward_time
from specref.perf.measure import SpeculativeRun, plain_time, speculative_run
from specref.perf.roofline import arithmetic_intensity, weight_bytes
from specref.theory import expected_tokens_per_step


@pytest.fixture(scope="module")
def pair():
    target = small_gpt2(vocab=64, n_embd=32, n_layer=2, seed=0, dtype=torch.float32)
    return target, noisy_copy(target, 0.3, seed=1)


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (1, 8), generator=g) for _ in range(2)]


def test_speculative_run_decomposes_the_time(pair):
    target, draft = pair
    prompts = _prompts()
    base = plain_time(target, prompts, 24)
    r = speculative_run(target, draft, prompts, 3, 24, base)
    # Greedy counts are deterministic: rerun to get the passes the run made.
    stats = [speculative_generate(target, draft, x, k=3, max_new_tokens=24, temperature=0)[1] for x in prompts]
    t_step = base / (len(prompts) * 24)  # plain decoding's time per token, the unit of c and v
    assert r.c == pytest.approx(r.time_draft / sum(s.draft_passes for s in stats) / t_step)
    # v is a whole verification: the target's pass and the acceptance rule.
    assert r.v == pytest.approx((r.time_target + r.time_verify) / sum(s.target_passes for s in stats) / t_step)
    assert r.time_verify > 0
    assert r.tokens_per_step == pytest.approx(sum(s.emitted for s in stats) / sum(s.steps for s in stats))
    assert r.time_speculative >= r.time_draft + r.time_target + r.time_verify > 0 and 0 <= r.loop_share < 1
    # Loop and rule split what the passes leave (less the argument checks before the loop starts).
    assert 0 < r.loop_share + r.verify_share <= 1 - (r.time_draft + r.time_target) / r.time_speculative
    E = float(expected_tokens_per_step(r.alpha, 3))
    assert r.refined == pytest.approx(E / (r.v + 3 * r.c))
    assert r.speedup == pytest.approx(base / r.time_speculative)
    assert set(r.as_dict()) >= {"speedup", "predicted", "refined", "loop_share", "c", "v"}


def test_speedup_and_predictions_follow_their_formulas():
    r = SpeculativeRun(k=4, alpha=0.8, tokens_per_step=3.3, mean_accepted=2.3, c=0.1, v=1.2, time_plain=10.0,
                       time_speculative=4.0, time_target=2.0, time_draft=1.0, time_verify=0.5,
                       time_overhead=0.5)
    E = (1 - 0.8**5) / 0.2
    assert r.speedup == pytest.approx(2.5)
    assert r.predicted == pytest.approx(E / 1.4)
    assert r.refined == pytest.approx(E / 1.6)
    assert r.loop_share == pytest.approx(0.125) and r.verify_share == pytest.approx(0.125)


@pytest.mark.parametrize("prompts,n,match", [([], 4, "non-empty"), ([torch.zeros(3, dtype=torch.long)], 4, r"\[1, T\]"),
                                             ("x", 4, "non-empty"), (None, 4, "non-empty")])
def test_bad_prompts_are_rejected(pair, prompts, n, match):
    with pytest.raises(ValueError, match=match):
        plain_time(pair[0], prompts, n)


def test_bad_time_plain_and_budget_are_rejected(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="time_plain"):
        speculative_run(target, draft, _prompts(), 2, 4, 0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_run(target, draft, _prompts(), 2, 0, 1.0)


def test_forward_time_and_roofline_arithmetic(pair):
    target = pair[0]
    assert forward_time(target, 2, context_len=4, repeats=2) > 0
    with pytest.raises(ValueError, match="n_new"):
        forward_time(target, 0)
    with pytest.raises(ValueError, match="exceeds"):
        forward_time(target, 10, context_len=target.config.n_positions)
    n = sum(p.numel() for p in target.parameters())
    assert weight_bytes(target) == 4 * n
    # 2 FLOPs per weight per token over 4 bytes per weight: intensity B * T / 2 in float32.
    assert arithmetic_intensity(target, 3, 5) == pytest.approx(7.5)


def test_machine_name_reads_the_cpu_model_and_falls_back_without_lscpu(monkeypatch):
    import platform
    import subprocess

    from specref.perf import machine

    listing = "Architecture:  x86_64\n  Model name:    Some CPU 9000 @ 3.0GHz\nThread(s) per core:  1\n"
    monkeypatch.setattr(machine.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr=""))
    assert machine.machine_name("cpu") == "Some CPU 9000 @ 3.0GHz"

    def missing(*a, **k):
        raise FileNotFoundError("lscpu")

    monkeypatch.setattr(machine.subprocess, "run", missing)
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert machine.machine_name(torch.device("cpu")) == platform.machine()
    monkeypatch.setattr(machine.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "no model", ""))
    assert machine.machine_name() == platform.machine()
