"""The benchmark scripts run end to end on a tiny workload and print their tables.

Their figures are timings and are not checked here (see benchmarks/README.md for the
recorded ones); what is checked is that every script still runs with the package as it
is, prints every row it promises, and that its correctness column says what it should.
benchmarks/README.md is checked as a report: short, a run command and a dated latest result
per benchmark, every results file and history date named, every figure quoted from history/.
"""

from __future__ import annotations

import json
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
    assert len(re.findall(r"^steps that propose nothing \(NoDraft\): \d+\.\d{3}x plain decoding's time per token, "
                          r"interleaved \(goal <= 1\.10x: (met|NOT met)\)$", out, flags=re.M)) == 2, out


def test_bench_hf_counts_passes_on_both_sides_and_prints_its_goal_line():
    pytest.importorskip("transformers")
    out = _run("bench_hf.py", "--prompts", "1", "--new-tokens", "12", "--repeats", "1")
    rows = {m.group(1).strip(): m.groups()[1:] for m in re.finditer(
        r"^(specref|HF, threshold default|HF, threshold off)\s+(\d+)\s+(\d+)\s.*?(\d+) of (\d+)$", out, flags=re.M)}
    assert set(rows) == {"specref", "HF, threshold default", "HF, threshold off"}, out
    ours, off = rows["specref"], rows["HF, threshold off"]
    if off[2] == off[3]:  # the same greedy text (float32: a near-tie may flip a choice on some CPU)
        assert ours[1] == off[1] and int(ours[0]) == int(off[0]) + 1  # same steps; specref's prefill is its own pass
    assert re.search(r"^goal: greedy speculative >= 2x .* -> (met|NOT met)$", out, flags=re.M), out


def test_bench_tree_prints_every_configuration_and_greedy_outputs_are_identical():
    out = _run("bench_tree.py", "--prompts", "1", "--prompt-tokens", "16", "--new-tokens", "10")
    greedy, sampled = out.split("temperature 1")
    assert greedy.count("identical") == 9 and "DIFFERS" not in out, out
    assert sampled.count("x  -") == 10, out


def test_bench_montecarlo_checks_both_samplers_against_the_exact_distribution():
    out = _run("bench_montecarlo.py", "--runs", "4000", "--loop-runs", "40", "--repeats", "1")
    assert out.count("check vs exact joint: pass") == 2, out
    assert re.search(r"speedup: [\d,]+x", out), out


def test_bench_drafts_quick_runs_two_drafts_checks_greedy_and_writes_its_results(tmp_path):
    out_file = tmp_path / "drafts.json"
    out = _run("bench_drafts.py", "--quick", "--drafts", "model", "prompt_lookup", "--no-trees",
               "--out", str(out_file))
    # Per workload and temperature, one table per draft with one row per k (quick: k = 1, 2).
    rows = re.findall(r"^ chain +([12]) ", out, flags=re.M)
    assert rows == ["1", "2"] * 8, out  # 2 workloads x 2 temperatures x 2 drafts
    assert out.count("identical") == 8 and "DIFFERS" not in out, out
    assert "[NOT met] prompt lookup >= 2x on the copy workload (greedy)" in out or \
        "[met] prompt lookup >= 2x on the copy workload (greedy)" in out, out
    assert "[not measured] EAGLE-1 beats the small model" in out, out  # eagle was not asked for
    import json
    result = json.loads(out_file.read_text())
    assert {"machine", "torch", "threads", "date", "runs", "goals", "drafts"} <= set(result)
    run = result["runs"][0]
    assert len(run["acceptance_by_position"]) == run["k"] and len(run["accepted_hist"]) == run["k"] + 1
    assert len(run["proposed_hist"]) == run["k"] + 1 and sum(run["proposed_hist"][1:]) > 0
    assert all(1 <= r["tokens_per_pass"] <= r["k"] + 1 for r in result["runs"])


def _bench(name: str):
    """A benchmark script loaded as a module, to test its functions."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[name] = bench  # bench_drafts' dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[name]
    return bench


def _bench_drafts():
    return _bench("bench_drafts")


def test_bench_drafts_acceptance_by_position_is_the_conditional_rate():
    bench = _bench_drafts()
    # 2 steps accepted 0, 3 accepted 1, 5 accepted all 2: position 1 passed 8 of 10, position 2 passed 5 of 8.
    assert bench.by_position([2, 3, 5]) == [0.8, 0.625]
    assert bench.by_position([4, 0, 0]) == [0.0, None]  # no step reached position 2
    assert bench.tried([2, 3, 5]) == [10, 8] and bench.tried([4, 0, 0]) == [4, 0]


def test_bench_drafts_refined_chain_averages_the_steps_proposal_lengths():
    bench = _bench_drafts()
    from specref import expected_tokens_per_step as E
    # Every step drafted k = 4: notebook 04's E(alpha, k) / (v + c k), with d = c k.
    assert bench.refined_chain(0.7, [0, 0, 0, 0, 10], 1.3, 4 * 0.1) == pytest.approx(E(0.7, 4) / (1.3 + 0.4))
    # Half the steps drafted nothing: each yields one token, and d (per step) already counts them as free.
    assert bench.refined_chain(0.7, [5, 0, 0, 0, 5], 1.2, 0.2) == pytest.approx((1 + E(0.7, 4)) / 2 / 1.4)
    assert bench.refined_chain(0.7, [5, 0, 0, 0, 5], 1.2, 0.2) < bench.refined_chain(0.7, [0, 0, 0, 0, 10], 1.2, 0.2)


DRAFT_RESULTS = sorted((ROOT / "benchmarks" / "results").glob("drafts_cpu*.json"))


@pytest.mark.parametrize("path", DRAFT_RESULTS, ids=[p.name for p in DRAFT_RESULTS])
def test_stored_draft_results_hold_the_goals_their_runs_give(path):
    """Every committed bench_drafts file's goal verdicts are what the script's `goals` says of its own runs."""
    import json
    bench, result = _bench_drafts(), json.loads(path.read_text())
    assert result["goals"] == bench.goals(result["runs"], result["target_params"])
    for r in result["runs"]:
        assert r["acceptance_by_position"] == bench.by_position(r["accepted_hist"])
        if r["mode"] == "chain" and "proposed_hist" in r:  # files written before it was recorded assume k per step
            assert r["refined"] == pytest.approx(bench.refined_chain(r["alpha"], r["proposed_hist"], r["v"], r["d"]),
                                                 rel=1e-12)


def test_acceptance_at_step_starts_finds_live_position_1_equal_to_teacher_forcing_at_the_step_starts():
    out = _run("acceptance_at_step_starts.py", "--prompts", "2", "--prompt-tokens", "24", "--new-tokens", "24",
               "--k", "4")
    rows = re.findall(r"^(model|eagle) +live position 1 [01]\.\d{3} over \d+ steps; teacher forced at the same step "
                      r"starts [01]\.\d{3} \((equal|NOT equal)\)", out, flags=re.M)
    assert [r[0] for r in rows] == ["model", "eagle"] and all(r[1] == "equal" for r in rows), out


def test_target_copies_reports_both_settings_as_counts():
    out = _run("target_copies.py", "--cases", "2")
    rows = re.findall(r"^(exact repeat|edit prompt) +2 snippets: teacher forced, the target's argmax is the copy's "
                      r"next token at ([01]\.\d{3}) of (\d+) positions; greedy, it follows the copy for \[(\d+), (\d+)\] "
                      r"tokens of \[(\d+), (\d+)\]$", out, flags=re.M)
    assert [r[0] for r in rows] == ["exact repeat", "edit prompt"], out
    for _, forced, positions, f1, f2, n1, n2 in rows:
        assert 0 <= float(forced) <= 1 and int(positions) == int(n1) + int(n2)
        assert int(f1) <= int(n1) and int(f2) <= int(n2)


def test_bench_gpu_smoke_runs_every_section_and_prints_every_goal(tmp_path):
    import json
    out_file = tmp_path / "gpu.json"
    out = _run("bench_gpu.py", "--smoke", "--out", str(out_file))
    grid = re.findall(r"^ +([12]) +([125]) +\d+\.\d{3} +\d+\.\d{3} +\d+\.\d\d +\d+\.\d{3} +\d+\.\d{3}$", out, flags=re.M)
    assert grid == [(b, t) for b in "12" for t in "125"], out  # B x T, eager and graphed beside the models
    assert re.search(r"^fitted PassModel \((sum|roofline)\): largest error", out, flags=re.M), out
    assert len(re.findall(r"^ +[12]  +\d+\.\d\d \(", out, flags=re.M)) == 2, out  # v(k) per batch size
    assert re.findall(r"^ ?([12])  [01]\.\d{3} +\d+\.\d\d  (identical|DIFFERS)$", out, flags=re.M) == \
        [("1", "identical"), ("2", "identical")], out  # greedy speculative output equals plain decoding's
    goals = re.findall(r"^\[(met|NOT met|not measured)\] ", out, flags=re.M)
    assert len(goals) == 6 and goals[-2:] == ["not measured"] * 2, out
    record = json.loads(out_file.read_text())
    assert {"machine", "bandwidth", "peak_flops", "grid", "v", "pair", "goals"} <= set(record)
    assert len(record["grid"]) == 6 and record["mode"] == "smoke"


def test_bench_gpu_without_cuda_says_so_and_exits_2():
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--quick"], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stdout, done.stdout + done.stderr


def test_bench_gpu_roofline_reads_the_weights_and_the_kv_cache_at_the_bandwidth():
    import torch

    from specref.models import GPT2Config
    from specref.models.pretrained import random_gpt2
    from specref.perf.roofline import weight_bytes

    model = random_gpt2(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2), "cpu",
                        torch.bfloat16)
    roof = _bench("bench_gpu").roofline_of(model, bandwidth=1e9, peak=1e12)
    assert roof(1, 1, 0) == pytest.approx(weight_bytes(model) / 1e9)  # memory-bound: the weights once
    kv = 2 * 2 * 32 * 2  # K and V, 2 layers, 32 wide, 2 bytes each, per row and cached token
    assert roof(4, 1, 10) == pytest.approx((weight_bytes(model) + 4 * 10 * kv) / 1e9)


def _notebook(path: Path, *sources: str) -> Path:
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbformat.write(nb, path)
    return path


def test_bench_notebooks_times_each_notebook_and_judges_errors_and_the_limit(tmp_path):
    import json
    quick = _notebook(tmp_path / "quick.ipynb", "x = 1", "import time\ntime.sleep(1.5)", "print(x)")
    broken = _notebook(tmp_path / "broken.ipynb", "x = 1", "raise ValueError('a student bug')", "print(x)")
    out_file = tmp_path / "nb.json"
    out = _run("bench_notebooks.py", str(quick), str(broken), "--limit", "60", "--out", str(out_file))
    result = json.loads(out_file.read_text())
    rows = {Path(r["notebook"]).name: r for r in result["notebooks"]}
    assert rows["quick.ipynb"]["met"] and rows["quick.ipynb"]["error"] is None, out
    assert rows["quick.ipynb"]["slowest_cell"] == 1 and rows["quick.ipynb"]["slowest_cell_seconds"] >= 1.5, out
    assert rows["quick.ipynb"]["seconds"] >= rows["quick.ipynb"]["slowest_cell_seconds"], out
    assert not rows["broken.ipynb"]["met"] and "a student bug" in rows["broken.ipynb"]["error"], out
    assert not result["all_met"] and "goal: every notebook under 60 s: NOT met" in out, out
    assert all(ms > 0 for ms in result["host_ms_per_token"]), out
    assert re.search(r"quick\.ipynb +\d+\.\d +1: +\d+\.\d s  met$", out, flags=re.M), out


def test_bench_notebooks_verdict_needs_no_error_and_a_time_under_the_limit():
    bench = _bench("bench_notebooks")
    assert bench.verdict({"seconds": 59.9, "error": None}, 60)
    assert not bench.verdict({"seconds": 60.0, "error": None}, 60)
    assert not bench.verdict({"seconds": 1.0, "error": "ValueError: a student bug"}, 60)


# -- benchmarks/README.md: a short report whose every figure is quoted from a dated record -----------------------

BENCHMARKS = ROOT / "benchmarks"
README = BENCHMARKS / "README.md"
HISTORY = BENCHMARKS / "history"
_FIGURE = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")  # 1.53 in "1.53x", 1107 in "1,107 s"; not 200 in "H200"


def _figures(text: str) -> set[str]:
    return {m.group().replace(",", "") for m in _FIGURE.finditer(text)}


def _unrecorded_figures(report: str, records: str) -> list[str]:
    """The figures of `report` that appear nowhere in `records`."""
    return sorted(_figures(report) - _figures(records), key=float)


def _history_text() -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(HISTORY.glob("*.md")))


def test_benchmarks_readme_reads_in_ten_minutes():
    assert len(README.read_bytes()) < 16_000, "benchmarks/README.md is a summary; full write-ups go to history/"


def test_benchmarks_readme_quotes_every_figure_from_the_dated_history():
    history = _history_text()
    missing = _unrecorded_figures(README.read_text(encoding="utf-8"), history)
    assert not missing, (f"figures in benchmarks/README.md that no history/<date>.md records: {missing}; "
                         "write the run's full text into history/<date>.md and quote it")
    # Negative control: a figure that no run recorded is caught, a recorded one is not.
    assert _unrecorded_figures("best 1.53x greedy, 123.456x at k = 5", history) == ["123.456"]


def test_benchmarks_readme_gives_each_benchmark_a_run_command_and_a_dated_latest_result():
    readme = README.read_text(encoding="utf-8")
    commands = "".join(re.findall(r"^```\n(.*?)^```$", readme, flags=re.M | re.S))
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    assert scripts and [s for s in scripts if f"benchmarks/{s}" not in commands] == []
    for section in re.split(r"^## ", readme, flags=re.M)[1:]:
        title = section.splitlines()[0]
        assert re.search(r"^latest\b", section, flags=re.M | re.I), f"{title}: no 'Latest' line"
        assert re.search(r"\[history/\d{4}-\d{2}-\d{2}\.md\]\(history/\d{4}-\d{2}-\d{2}\.md\)", section), title


def test_benchmarks_readme_names_every_results_file_and_history_date_and_only_real_ones():
    readme = README.read_text(encoding="utf-8")
    named_results = set(re.findall(r"results/([\w.-]+\.json)", readme))
    named_history = set(re.findall(r"history/([\w.-]+\.md)", readme))
    assert named_results == {p.name for p in (BENCHMARKS / "results").glob("*.json")}
    assert named_history == {p.name for p in HISTORY.glob("*.md")}
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}\.md", name) for name in named_history), named_history


def test_bench_cpu_quick_runs_every_section_and_prints_every_goal_line(tmp_path):
    out = _run("bench_cpu.py", "--quick", "--json", str(tmp_path / "cpu.json"))
    for section in ("== 1. kernel paths", "== 2. v(k) and c", "== 3. live decoding", "== 4. the batch crossover"):
        assert section in out, out
    goals = re.findall(r"goal .*: .*\b(met|NOT met)\b", out)
    assert len(goals) == 5, out  # v(4); greedy, sampled, EAGLE; the crossover
    assert "kernel path: " in out and "torch addmm, W [in, out] (default)" in out
    record = json.loads((tmp_path / "cpu.json").read_text())
    assert {"kernels", "costs", "decoding", "crossover"} <= set(record)
