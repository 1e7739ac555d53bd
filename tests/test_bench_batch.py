"""benchmarks/bench_batch.py runs end to end on its --quick grid and writes a results file a notebook can read.

Its figures are timings and are not checked here; what is checked is that the script
prints every table and goal line it promises and that its JSON rebuilds the cost models.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specref.perf.costmodel import CostModel, choose_k, crossover_batch

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
        for k, predicted in results["crossover"][name]["predicted"].items():  # the stored model rebuilds its figures
            assert crossover_batch(alpha, int(k), model) == predicted
        temperature = 0.0 if name == "greedy" else 1.0
        rows = [r for r in results["policy"] if r["temperature"] == temperature]
        assert rows and all(choose_k(r["alpha"], r["batch_size"], model, ks=meta["ks"]) == r["k"] for r in rows)
