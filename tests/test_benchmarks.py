"""The benchmark scripts run end to end on a tiny workload and print their tables.

Their figures are timings and are not checked here (see benchmarks/README.md for the
recorded ones); what is checked is that every script still runs with the package as it
is, prints every row it promises, and that its correctness column says what it should.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")  # the CPU path, on any machine
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_bench_speculative_prints_one_row_per_k_and_both_goal_lines():
    out = _run("bench_speculative.py", "--prompts", "2", "--prompt-tokens", "16", "--new-tokens", "12",
               "--k", "1", "3")
    rows = re.findall(r"^ ?(\d) +[01]\.\d{3} +\d+\.\d\d", out, flags=re.M)
    assert rows == ["1", "3", "1", "3"], out  # greedy, then temperature 1
    assert out.count("measured / refined:") == 2 and "goal >= 1.5x greedy" in out


def test_bench_tree_prints_every_configuration_and_greedy_outputs_are_identical():
    out = _run("bench_tree.py", "--prompts", "1", "--prompt-tokens", "16", "--new-tokens", "10")
    greedy, sampled = out.split("temperature 1")
    assert greedy.count("identical") == 9 and "DIFFERS" not in out, out
    assert sampled.count("x  -") == 10, out


def test_bench_montecarlo_checks_both_samplers_against_the_exact_distribution():
    out = _run("bench_montecarlo.py", "--runs", "4000", "--loop-runs", "40", "--repeats", "1")
    assert out.count("check vs exact joint: pass") == 2, out
    assert re.search(r"speedup: [\d,]+x", out), out
