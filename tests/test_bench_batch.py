"""benchmarks/bench_batch.py runs end to end on its --quick grid and writes a results file a notebook can read.

Its figures are timings and are not checked here; what is checked is that the script
prints every table and goal line it promises and that its JSON rebuilds the cost models.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specref.perf.costmodel import FIT_RTOL, CostModel, choose_k, crossover_batch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_bench_batch_quick_prints_every_table_and_goal_and_writes_usable_results(tmp_path):
    out = tmp_path / "batch.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")  # the CPU path, on any machine
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_batch.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    n_models = len(json.loads(out.read_text())["cost_models"])  # one per temperature
    assert text.count("crossover B*(k)") == n_models and text.count("policy choose_k") == n_models, text
    assert re.search(r"target fit \((sum|roofline)\): .* relative error median [\d.]+%, max [\d.]+%", text), text
    goals = json.loads(out.read_text())["goals"]
    assert len(re.findall(r"^goal .*: (met|NOT met)$", text, flags=re.M)) == len(goals), text

    results = json.loads(out.read_text())
    meta = results["meta"]
    n_passes = len(meta["batch_sizes"]) * len(meta["tokens"]) * len(meta["contexts"])
    assert len(results["passes"]) == n_passes
    assert len(results["runs"]) == 2 * len(meta["batch_sizes"]) * len(meta["ks"])  # greedy and temperature 1
    assert set(results["goals"].values()) <= {True, False}
    for name in ("greedy", "temperature 1"):
        model = CostModel.from_dict(results["cost_models"][name])
        alpha = results["crossover"][name]["alpha"]
        n = meta["new_tokens"]
        for k, predicted in results["crossover"][name]["predicted"].items():  # the stored model rebuilds its figures
            assert crossover_batch(alpha, int(k), model, new_tokens=n) == predicted
        temperature = 0.0 if name == "greedy" else 1.0
        rows = [r for r in results["policy"] if r["temperature"] == temperature]
        assert rows and all(choose_k(r["alpha"], r["batch_size"], model, ks=meta["ks"], margin=r["margin"],
                                     new_tokens=n) == r["k"] for r in rows)

    again = tmp_path / "again.json"  # --from-json re-analyses the file without measuring, to the same figures
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_batch.py"), "--from-json", str(out),
                           "--out", str(again)], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nothing re-measured" in done.stdout and "in-loop terms fitted" in done.stdout
    redone = json.loads(again.read_text())
    assert redone["passes"] == results["passes"] and redone["goals"] == results["goals"]
    assert redone["policy"] == results["policy"] and redone["cost_models"] == results["cost_models"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_batch", ROOT / "benchmarks" / "bench_batch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(a: object, b: object, rel: float, absolute: dict[str, float] | None = None, key: str = "") -> bool:
    """Nested dicts, lists and numbers equal up to a relative `rel` on every number (`absolute[key]` for those keys)."""
    absolute = absolute or {}
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel, absolute, k) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, rel, absolute, key) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=rel, abs_tol=absolute.get(key, 0.0)))
    return a == b


def _forms(d: object) -> list[str]:
    """Every fitted pass model's form in a cost model's dict: which form won, a decision of the analysis."""
    if isinstance(d, dict):
        return ([d["form"]] if "form" in d else []) + [f for v in d.values() for f in _forms(v)]
    return []


@pytest.mark.parametrize("name", ["batch_cpu.json", "batch_cpu_2026-12-02.json", "batch_cpu_2026-12-03.json"])
def test_the_in_loop_model_never_sees_the_held_out_runs_or_the_plain_runs(name):
    bench = _bench()
    results = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    meta = results["meta"]
    P, n = meta["prompt_tokens"], meta["new_tokens"]
    grid = CostModel.from_dict(results["grid_model"])
    runs = [r for r in results["runs"] if r["temperature"] == 0.0]
    train = bench.train_batches(meta["batch_sizes"])
    assert train and set(train) < set(meta["batch_sizes"])
    model = bench.in_loop_model(grid, runs, P, n, train)
    # The committed file is this analysis. Its numbers come from solvers whose answers another CPU's BLAS
    # moves within their own tolerance (least_squares: FIT_RTOL relative; alpha_sd: its xatol), so they are
    # compared at that tolerance; what the analysis decides is compared exactly: which form fits each
    # pass, and the policy's k at every batch size.
    committed = results["cost_models"]["greedy"]
    tolerance = dict(rel=FIT_RTOL, absolute={"alpha_sd": bench.ALPHA_SD_XATOL})
    assert _close(model.as_dict(), committed, **tolerance)
    assert _forms(model.as_dict()) == _forms(committed)
    for row in (r for r in results["policy"] if r["temperature"] == 0.0):
        assert row["k"] == choose_k(row["alpha"], row["batch_size"], model, ks=meta["ks"], margin=row["margin"],
                                    new_tokens=n), row
    # The comparison can fail: a coefficient off by ten times the tolerance, or alpha_sd by twice its xatol.
    off = replace(model, target=replace(model.target, overhead=model.target.overhead * (1 + 10 * FIT_RTOL)))
    assert not _close(off.as_dict(), committed, **tolerance)
    assert not _close(replace(model, alpha_sd=model.alpha_sd + 2 * bench.ALPHA_SD_XATOL).as_dict(), committed,
                      **tolerance)
    # Runs the fit must not read (held-out batch sizes, plain runs) change nothing, bit for bit: one process.
    scaled = [dict(r, time_target=3 * r["time_target"], time_draft=3 * r["time_draft"], seconds=3 * r["seconds"])
              if r["batch_size"] not in train or r["k"] == 0 else r for r in runs]
    assert bench.in_loop_model(grid, scaled, P, n, train) == model
    broken = [dict(r, time_draft=3 * r["time_draft"]) if r["batch_size"] in train else r for r in runs]
    assert bench.in_loop_model(grid, broken, P, n, train).draft != model.draft  # the fit does read its runs


def test_random_target_has_the_shape_the_pair_vocabulary_and_is_seeded_without_the_global_generator(monkeypatch):
    import torch

    from specref import load_pair

    bench = _bench()
    monkeypatch.setitem(bench.SHAPES, "tiny", (2, 64, 4))  # the real shapes take seconds to build
    target, _, _ = load_pair()
    state = torch.random.get_rng_state()
    a = bench.random_target("tiny", target, "cpu", torch.float32)
    b = bench.random_target("tiny", target, "cpu", torch.float32)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert (a.config.n_layer, a.config.n_embd, a.config.n_head) == (2, 64, 4)
    assert a.config.vocab_size == target.config.vocab_size and a.config.n_positions == target.config.n_positions
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert bench.SHAPES["gpt2-medium"] == (24, 1024, 16)


def test_a_grid_whose_prompt_pass_outlasts_a_runs_target_time_is_refused_with_the_reason():
    bench = _bench()
    results = json.loads((ROOT / "benchmarks" / "results" / "batch_cpu.json").read_text())
    meta = results["meta"]
    grid = CostModel.from_dict(results["grid_model"])
    slow_prompt = replace(grid, target=replace(grid.target, overhead=100.0))  # a prompt pass of 100 s
    runs = [r for r in results["runs"] if r["temperature"] == 0.0]
    with pytest.raises(ValueError, match="too noisy to take the prompt out"):
        bench.in_loop_model(slow_prompt, runs, meta["prompt_tokens"], meta["new_tokens"],
                            bench.train_batches(meta["batch_sizes"]))


def test_the_measurements_are_written_before_an_analysis_that_fails(tmp_path, monkeypatch):
    # A 25-minute gpt2-medium grid once died in the analysis and took its measurements with it.
    bench = _bench()
    committed = json.loads((ROOT / "benchmarks" / "results" / "batch_cpu.json").read_text())
    measured = {key: committed[key] for key in ("meta", "passes", "draft_passes", "runs")}

    def broken_report(results: dict) -> dict:
        raise ValueError("the analysis failed")

    monkeypatch.setattr(bench, "report", broken_report)
    out = tmp_path / "batch.json"
    with pytest.raises(ValueError, match="the analysis failed"):
        bench.save_and_report(measured, str(out))
    assert json.loads(out.read_text()) == measured  # ready for --from-json


def test_short_cells_get_more_repeats_within_the_cap_and_long_ones_the_minimum():
    bench = _bench()
    assert bench.repeats_for(0.005, 7, 0.2, 35) == 35  # 40 wanted, capped at 5 x 7
    assert bench.repeats_for(0.02, 7, 0.2, 35) == 10
    assert bench.repeats_for(0.1, 7, 0.2, 35) == 7  # 2 would do; never fewer than asked for
    assert bench.repeats_for(0.005, 7, 0.0, 35) == 7  # off
    rows = [dict(repeats=7), dict(repeats=12), dict(repeats=35)]
    assert bench._repeats(rows, "repeats", 7) == "7-35" and bench._repeats([{}], "repeats", 3) == "3"
