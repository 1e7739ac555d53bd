"""Exercise 1's graders (specref_grading.checks.roofline): bytes, FLOPs, intensity, the ridge, pass time and v(k) of
a model on a machine, by value against specref.perf.

The reference answers below are the solution's. Every wrong answer is one a learner could write: notebook 01's
bf16 shortcut for the intensity (B x T), a ridge without the efficiency, memory and compute added instead of
overlapped, the KV cache or attention left out, v(k) = k + 1; each must fail on the visible check and on hidden
ones at other seeds. A constant, a call of specref.perf and an untouched stub fail too, the stub with a message
that names its task.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from specref_grading.checks import roofline as R

ROOT = Path(__file__).resolve().parents[1]


def pass_bytes(model, B, T, S):
    return model["n_params"] * model["bytes_per_param"] + model["kv_bytes_per_token"] * B * S


def pass_flops(model, B, T, S):
    return (2 * model["n_params"] + model["attention_flops_per_token"] * S) * B * T


def intensity(model, B, T, S):
    return pass_flops(model, B, T, S) / pass_bytes(model, B, T, S)


def ridge_point(machine):
    return machine["efficiency"] * machine["peak_flops"] / machine["bandwidth"]


def ridge_tokens(model, machine, S):
    return (pass_bytes(model, 1, 1, S) / machine["bandwidth"]) / (
        pass_flops(model, 1, 1, S) / (machine["efficiency"] * machine["peak_flops"]))


def pass_time(model, machine, B, T, S):
    memory = pass_bytes(model, B, T, S) / machine["bandwidth"]
    compute = pass_flops(model, B, T, S) / (machine["efficiency"] * machine["peak_flops"])
    return machine["overhead_s"] + max(memory, compute)


def v(model, machine, k, B, S):
    return pass_time(model, machine, B, k + 1, S) / pass_time(model, machine, B, 1, S)


def quiet(check, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        check(*args, **kwargs)


def learner(source: str, name: str):
    """A function as a learner's notebook defines it: the answer cell's code run in a `__main__` namespace."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)  # noqa: S102 - the tests' own cheat submissions
    return namespace[name]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_solution_passes_every_visible_and_hidden_check(seed):
    quiet(R.check_bytes_and_flops, pass_bytes, pass_flops)
    quiet(R.check_bytes_and_flops_unseen, pass_bytes, pass_flops, seed=seed)
    quiet(R.check_intensity_and_ridge, intensity, ridge_point, ridge_tokens)
    quiet(R.check_intensity_and_ridge_unseen, intensity, ridge_point, ridge_tokens, seed=seed)
    quiet(R.check_pass_time_and_v, pass_time, v)
    quiet(R.check_pass_time_and_v_unseen, pass_time, v, seed=seed)


def test_the_visible_cases_reach_both_sides_of_the_ridge():
    # Memory-bound and compute-bound passes both appear, so a sum or a wrong max cannot pass by luck.
    sides = set()
    for _mn, model, _hn, machine, B, T, S, _k in R._visible_cases():
        memory = pass_bytes(model, B, T, S) / machine["bandwidth"]
        compute = pass_flops(model, B, T, S) / (machine["efficiency"] * machine["peak_flops"])
        sides.add(memory > compute)
    assert sides == {True, False}


def test_a_different_order_of_the_same_arithmetic_passes():
    # The tolerance is for float64 rounding: the same quantities computed another way agree.
    def flops_other_order(model, B, T, S):
        return 2.0 * B * T * model["n_params"] + S * B * T * model["attention_flops_per_token"]

    quiet(R.check_bytes_and_flops_unseen, pass_bytes, flops_other_order, seed=5)


WRONG_COUNTS = {
    "no_kv_read": (lambda m, B, T, S: m["n_params"] * m["bytes_per_param"], pass_flops),
    "kv_per_new_token": (lambda m, B, T, S: pass_bytes(m, B, T, S) + m["kv_bytes_per_token"] * B * T, pass_flops),
    "no_attention": (pass_bytes, lambda m, B, T, S: 2 * m["n_params"] * B * T),
    "one_flop_per_weight": (pass_bytes, lambda m, B, T, S: pass_flops(m, B, T, S) / 2),
    "constants": (lambda *a: 1.4e10, lambda *a: 1.4e10),
}


@pytest.mark.parametrize("name", WRONG_COUNTS)
def test_wrong_counts_fail_visible_and_hidden(name):
    b, f = WRONG_COUNTS[name]
    with pytest.raises(AssertionError, match="check_bytes_and_flops: case"):
        quiet(R.check_bytes_and_flops, b, f)
    with pytest.raises(AssertionError, match="check_bytes_and_flops_unseen: case"):
        quiet(R.check_bytes_and_flops_unseen, b, f, seed=4)


WRONG_RIDGE = {
    # notebook 01's shortcut for bf16 weights and no cache: intensity = B x T
    "intensity_is_BT": (lambda m, B, T, S: float(B * T), ridge_point, ridge_tokens),
    "ridge_at_peak": (intensity, lambda h: h["peak_flops"] / h["bandwidth"], ridge_tokens),
    "ridge_tokens_is_ridge_point": (intensity, ridge_point, lambda m, h, S: ridge_point(h)),
    "constants": (lambda *a: 100.0, lambda *a: 295.0, lambda *a: 295.0),
}


@pytest.mark.parametrize("name", WRONG_RIDGE)
def test_wrong_intensities_and_ridges_fail_visible_and_hidden(name):
    i, rp, rt = WRONG_RIDGE[name]
    with pytest.raises(AssertionError, match="check_intensity_and_ridge: case"):
        quiet(R.check_intensity_and_ridge, i, rp, rt)
    with pytest.raises(AssertionError, match="check_intensity_and_ridge_unseen: case"):
        quiet(R.check_intensity_and_ridge_unseen, i, rp, rt, seed=4)


def summed(model, machine, B, T, S):  # memory and compute added, not overlapped
    return (machine["overhead_s"] + pass_bytes(model, B, T, S) / machine["bandwidth"]
            + pass_flops(model, B, T, S) / (machine["efficiency"] * machine["peak_flops"]))


WRONG_TIME = {
    "summed": (summed, lambda m, h, k, B, S: summed(m, h, B, k + 1, S) / summed(m, h, B, 1, S)),
    "no_overhead": (lambda m, h, B, T, S: pass_time(m, h, B, T, S) - h["overhead_s"], v),
    "v_is_k_plus_1": (pass_time, lambda m, h, k, B, S: k + 1.0),
    "v_is_1": (pass_time, lambda m, h, k, B, S: 1.0),
    "v_over_k_tokens": (pass_time, lambda m, h, k, B, S: pass_time(m, h, B, k, S) / pass_time(m, h, B, 1, S)
                        if k else 1.0),
}


@pytest.mark.parametrize("name", WRONG_TIME)
def test_wrong_pass_times_and_v_fail_visible_and_hidden(name):
    t, vv = WRONG_TIME[name]
    with pytest.raises(AssertionError, match="check_pass_time_and_v: case"):
        quiet(R.check_pass_time_and_v, t, vv)
    with pytest.raises(AssertionError, match="check_pass_time_and_v_unseen: case"):
        quiet(R.check_pass_time_and_v_unseen, t, vv, seed=4)


def test_answers_that_call_specref_perf_score_zero_and_say_why():
    cheat = learner("from specref.perf.costmodel import PassModel\n\n"
                    "def pass_time(model, machine, B, T, S):\n"
                    "    return PassModel.roofline(model['n_params'], machine['bandwidth'], machine['peak_flops'],\n"
                    "        model['bytes_per_param'], model['kv_bytes_per_token'], model['attention_flops_per_token'],\n"
                    "        machine['efficiency'], machine['overhead_s'])(B, T, S)\n", "pass_time")
    with pytest.raises(AssertionError, match=r"Task 3: your pass_time uses specref\.perf\.costmodel\.PassModel"):
        R.check_pass_time_and_v(cheat, v)
    flops = learner("import specref.perf.costs as costs\n\n"
                    "def pass_flops(model, B, T, S):\n"
                    "    return costs.forward_flops(model, B * T)\n", "pass_flops")
    with pytest.raises(AssertionError, match="Task 1: your pass_flops uses specref.perf.costs.forward_flops"):
        R.check_bytes_and_flops(pass_bytes, flops)


def test_an_untouched_stub_names_its_task():
    def ridge_point(machine):
        raise NotImplementedError("Task 2: write ridge_point (see the task above)")

    with pytest.raises(NotImplementedError, match="^Task 2 is not done yet: write ridge_point"):
        R.check_intensity_and_ridge(intensity, ridge_point, ridge_tokens)


def test_feedback_shows_input_and_output_but_not_the_expected_value():
    with pytest.raises(AssertionError) as e:
        quiet(R.check_pass_time_and_v, summed, v)
    text = str(e.value)
    _mn, model, _hn, machine, B, T, S, k = R._visible_cases()[0]
    want = R.reference(model, machine, B, T, S, k)["pass_time"]
    assert "your pass_time:" in text and "model (7B)" in text and repr(want) not in text and f"{want:.4g}" not in text


def test_the_reference_is_specref_perf_and_agrees_with_notebook_01s_h100_figures():
    # The H100 at full peak: the ridge of a bf16 model is peak / bandwidth = 296 tokens (notebook 01's 295 with
    # 989 TFLOP/s); at 40 % of it, 118: the cost model's documented numbers.
    h100 = dict(R.MACHINES["H100"], efficiency=1.0)
    bare = dict(R.MODELS["70B"], kv_bytes_per_token=0.0, attention_flops_per_token=0.0)
    assert round(ridge_tokens(bare, h100, 0)) == 296
    assert round(R.reference(bare, R.MACHINES["H100"], 1, 1, 0, 1)["ridge_tokens"]) == 118
    assert math.isclose(R.reference(bare, R.MACHINES["H100"], 8, 1, 0, 4)["v"], 1.0)


def test_the_setup_imports_nothing_that_solves_a_task():
    nb = json.loads((ROOT / "solutions" / "ex01_roofline.ipynb").read_text())
    first_answer = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    setup = "\n".join("".join(c["source"]) for c in nb["cells"][:first_answer] if c["cell_type"] == "code")
    assert "costmodel" not in setup and "forward_flops" not in setup and "arithmetic_intensity" not in setup
    assert "HIDDEN_SEED = 1" in setup  # the setup spans two cells: the checks' imports, then the rest
    measured = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "ex01_measure_answer"]
    assert len(measured) == 1 and "".join(measured[0]["source"]).startswith("# NBVAL_IGNORE_OUTPUT")
