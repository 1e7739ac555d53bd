"""Exercise 1's graders (specref_grading.checks.roofline): a pass's bytes and FLOPs counted from the model object,
and the largest batch at which a verification pass is memory-bound.

The reference answers below are the solution's. Every wrong answer is one a learner could write: notebook 01's
"2 FLOPs per parameter" (the position embedding and biases counted as matrices), a tied matrix counted twice, the
KV cache always in float32 or left out, attention to the cached tokens only, a memory-bound batch that ignores the
KV cache or never answers None; each must fail on the visible check and on hidden ones at other seeds. A constant,
a call of specref.perf and an untouched stub fail too, the stub with a message that names its task.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from specref_grading.checks import roofline as R

ROOT = Path(__file__).resolve().parents[2]


def pass_bytes(model, B, T, S):
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(2 * model.config.n_embd * b.attn.c_attn.weight.element_size() for b in model.transformer.h)
    return weights + kv * B * S


def pass_flops(model, B, T, S):
    mats = [model.lm_head.weight] + [w for b in model.transformer.h for w in (
        b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
    attended = T * S + T * (T + 1) // 2
    return B * (2 * sum(w.numel() for w in mats) * T + 4 * model.config.n_embd * model.config.n_layer * attended)


def memory_bound_batch(model, machine, k, S, counts=(pass_bytes, pass_flops)):
    b, f = counts
    T = k + 1
    weights_s = b(model, 1, T, 0) / machine["bandwidth"]
    kv_row_s = (b(model, 1, T, S) - b(model, 1, T, 0)) / machine["bandwidth"]
    flops_row_s = f(model, 1, T, S) / (machine["efficiency"] * machine["peak_flops"])
    return None if flops_row_s <= kv_row_s else int(weights_s // (flops_row_s - kv_row_s))


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
    quiet(R.check_memory_bound_batch, memory_bound_batch)
    quiet(R.check_memory_bound_batch_unseen, memory_bound_batch, seed=seed)


def test_a_loop_over_batch_sizes_passes_too():
    # Another honest way to Task 2: grow B until the pass turns compute-bound (None detected from the per-row rates).
    def by_loop(model, machine, k, S):
        flops_s = machine["efficiency"] * machine["peak_flops"]
        def bound(B):
            return pass_flops(model, B, k + 1, S) / flops_s <= pass_bytes(model, B, k + 1, S) / machine["bandwidth"]
        per_row = (pass_flops(model, 1, k + 1, S) / flops_s
                   - (pass_bytes(model, 2, k + 1, S) - pass_bytes(model, 1, k + 1, S)) / machine["bandwidth"])
        if per_row <= 0:
            return None
        B = 0
        while bound(B + 1):
            B += 1
        return B

    quiet(R.check_memory_bound_batch_unseen, by_loop, seed=7)


def test_the_cases_cover_every_kind_of_model_and_answer():
    models = R._unseen_models(1, 8)
    dtypes = {p.dtype for m in models for p in m.parameters()}
    assert len(dtypes) >= 4
    assert any(m.lm_head.weight is not m.transformer.wte.weight for m in models)
    assert any(len({p.dtype for p in m.parameters()}) > 1 for m in models)  # mixed formats
    answers = [R.reference_batch(m, h, k, S) for m, _hn, h, k, S in R._unseen_batch_cases(1)]
    assert None in answers and any(a == 0 for a in answers) and any(a is not None and a > 1 for a in answers)
    visible = [R.reference_batch(m, h, k, S) for m, _hn, h, k, S in R._visible_batch_cases()]
    assert None in visible and any(a is not None for a in visible)


WRONG_COUNTS = {
    "no_kv_read": (lambda m, B, T, S: pass_bytes(m, B, T, 0), pass_flops),
    "kv_in_float32": (lambda m, B, T, S: pass_bytes(m, B, T, 0) + 2 * 4 * m.config.n_embd * m.config.n_layer * B * S,
                      pass_flops),
    "tied_counted_twice": (lambda m, B, T, S: pass_bytes(m, B, T, S) + (
        m.lm_head.weight.numel() * m.lm_head.weight.element_size() if m.lm_head.weight is m.transformer.wte.weight
        else 0), pass_flops),
    "kv_per_new_token": (lambda m, B, T, S: pass_bytes(m, B, T, S + T), pass_flops),
    "two_flops_per_parameter": (pass_bytes, lambda m, B, T, S: 2 * sum(p.numel() for p in m.parameters()) * B * T
                                + (pass_flops(m, B, T, S) - pass_flops(m, B, T, 0))),
    "attention_to_cache_only": (pass_bytes, lambda m, B, T, S: pass_flops(m, B, T, S)
                                - B * 4 * m.config.n_embd * m.config.n_layer * T * (T + 1) // 2),
    "no_attention": (pass_bytes, lambda m, B, T, S: pass_flops(m, B, T, 0)
                     - B * 4 * m.config.n_embd * m.config.n_layer * T * (T + 1) // 2),
    "constants": (lambda *a: 10**7, lambda *a: 10**7),
}


@pytest.mark.parametrize("name", WRONG_COUNTS)
def test_wrong_counts_fail_visible_and_hidden(name):
    b, f = WRONG_COUNTS[name]
    with pytest.raises(AssertionError, match="check_bytes_and_flops: case"):
        quiet(R.check_bytes_and_flops, b, f)
    with pytest.raises(AssertionError, match="check_bytes_and_flops_unseen: case"):
        quiet(R.check_bytes_and_flops_unseen, b, f, seed=4)


def _no_kv(model, machine, k, S):  # the ridge of the weights alone: notebook 01's B x T against the ridge
    return memory_bound_batch(model, machine, k, 0)


def _never_none(model, machine, k, S):
    b = memory_bound_batch(model, machine, k, S)
    return 10**6 if b is None else b


def _ceil(model, machine, k, S):
    b = memory_bound_batch(model, machine, k, S)
    return None if b is None else b + 1


def _tokens_not_rows(model, machine, k, S):  # the boundary in tokens per pass, not in rows
    b = memory_bound_batch(model, machine, k, S)
    return None if b is None else b * (k + 1)


WRONG_BATCH = {"no_kv": _no_kv, "never_none": _never_none, "one_too_many": _ceil, "tokens": _tokens_not_rows,
               "constant": lambda *a: 59}


@pytest.mark.parametrize("name", WRONG_BATCH)
def test_wrong_memory_bound_batches_fail_visible_and_hidden(name):
    with pytest.raises(AssertionError, match="check_memory_bound_batch: case"):
        quiet(R.check_memory_bound_batch, WRONG_BATCH[name])
    with pytest.raises(AssertionError, match="check_memory_bound_batch_unseen: case"):
        quiet(R.check_memory_bound_batch_unseen, WRONG_BATCH[name], seed=4)


def test_answers_that_call_specref_perf_score_zero_and_say_why():
    cheat = learner("from specref.perf.roofline import weight_bytes\n\n"
                    "def pass_bytes(model, B, T, S):\n"
                    "    return weight_bytes(model) + 2 * model.config.n_embd * model.config.n_layer * 4 * B * S\n",
                    "pass_bytes")
    with pytest.raises(AssertionError, match=r"Task 1: your pass_bytes uses specref\.perf\.roofline\.weight_bytes"):
        R.check_bytes_and_flops(cheat, pass_flops)
    cheat2 = learner("import specref.perf.costmodel as cm\n\n"
                     "def memory_bound_batch(model, machine, k, S):\n"
                     "    return cm.crossover_batch(0.8, k, None)\n", "memory_bound_batch")
    with pytest.raises(AssertionError, match=r"Task 2: your memory_bound_batch uses specref\.perf"):
        R.check_memory_bound_batch(cheat2)


def test_an_untouched_stub_names_its_task():
    def pass_flops(model, B, T, S):
        raise NotImplementedError("Task 1: write pass_flops (see the task above)")

    with pytest.raises(NotImplementedError, match="^Task 1 is not done yet: write pass_flops"):
        R.check_bytes_and_flops(pass_bytes, pass_flops)


def test_feedback_shows_input_and_output_but_not_the_expected_value():
    b, f = WRONG_COUNTS["kv_in_float32"]
    with pytest.raises(AssertionError) as e:
        quiet(R.check_bytes_and_flops, b, f)
    text = str(e.value)
    for model, B, T, S in R._visible_count_cases():
        if b(model, B, T, S) != R.reference_bytes(model, B, T, S):
            want = R.reference_bytes(model, B, T, S)
            break
    assert "your pass_bytes:" in text and "n_layer = " in text and str(want) not in text and f"{want:,d}" not in text


def test_the_reference_counts_agree_with_the_model_and_notebook_01():
    # With no cache and one token, the bytes are specref.perf's weight_bytes; the FLOPs differ from its
    # 2 x parameters by exactly the weights that multiply nothing (position embedding, biases, norms) and the
    # attention of a token to itself.
    from specref.perf.roofline import forward_flops, weight_bytes
    for model in R._visible_models() + R._unseen_models(2, 4):
        assert R.reference_bytes(model, 3, 2, 0) == weight_bytes(model)
        not_matrices = sum(p.numel() for n, p in model.named_parameters()
                           if n.endswith(("bias", "wpe.weight")) or ".ln_" in n or "ln_f" in n
                           or (n == "transformer.wte.weight" and model.lm_head.weight is not p))
        self_attention = 4 * model.config.n_embd * model.config.n_layer
        assert R.reference_flops(model, 1, 1, 0) == forward_flops(model, 1) - 2 * not_matrices + self_attention


def test_gpt2_xl_at_512_cached_tokens_is_memory_bound_at_every_batch():
    # Notebook 07's claim, counted: at 512 cached tokens GPT-2 XL's KV cache per row takes longer to read on the
    # H100 than the row's k = 4 verification arithmetic takes at 40 % of the peak, so no batch is compute-bound.
    import torch

    from specref.models.gpt2 import GPT2, GPT2Config
    with torch.device("meta"):
        xl = GPT2(GPT2Config(n_layer=48, n_embd=1600, n_head=25)).to(torch.bfloat16)
    h100 = R.MACHINES["H100"]
    assert R.reference_batch(xl, h100, 4, 512) is None and R.reference_batch(xl, h100, 4, 0) == 23
    assert math.isclose(R.reference_bytes(xl, 256, 5, 512) - R.reference_bytes(xl, 256, 5, 0), 40.26e9, rel_tol=1e-3)


def test_the_setup_imports_nothing_that_solves_a_task():
    nb = json.loads((ROOT / "solutions" / "ex01_roofline.ipynb").read_text())
    first_answer = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    setup = "\n".join("".join(c["source"]) for c in nb["cells"][:first_answer] if c["cell_type"] == "code")
    assert not any(name in setup for name in ("costmodel", "weight_bytes", "forward_flops", "arithmetic_intensity"))
    assert "forward_time" in setup  # Task 3 measures with it: given, not forbidden
    assert "HIDDEN_SEED = 1" in setup  # the setup spans two cells: the checks' imports, then the rest
    measured = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "ex01_measure_answer"]
    assert len(measured) == 1 and "".join(measured[0]["source"]).startswith("# NBVAL_IGNORE_OUTPUT")


def test_every_hand_graded_task_has_a_rubric_and_the_summary_is_solution_only():
    nb = json.loads((ROOT / "solutions" / "ex01_roofline.ipynb").read_text())
    cells = nb["cells"]
    for i, c in enumerate(cells):
        g = c["metadata"].get("nbgrader", {})
        if c["cell_type"] == "markdown" and g.get("grade") and g.get("solution"):
            assert cells[i + 1]["metadata"].get("specref", {}).get("rubric") == g["grade_id"]
    assert cells[-1]["metadata"].get("specref", {}).get("solution_only") is True
