"""Checks judge values, not containers: one set of conversions (specref_grading/checks/report.py) reads every answer.

An honest answer may return 12.0 where a count is meant (a whole float is that integer), a list where the task
says "a pair" or "a triple", a one-element tensor or numpy integer where it says "an int". Each such answer passes
every check that reads it; a fraction, a bool, a string or a sequence of the wrong length still fails. The
regression cases are the ones a red team found losing points: ex01's `memory_bound_batch` returning 12.0, ex05's
`propose` and `compare_tau` returning lists.
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
import torch
from model_factory import best_k

from specref_grading.checks import pitfalls as L
from specref_grading.checks import prompt_lookup as P
from specref_grading.checks import report
from specref_grading.checks import roofline as R
from specref_grading.checks import speedup as S


def quiet(check, *args, **kwargs) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        check(*args, **kwargs)


# -- the conversions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [
    (12, 12), (12.0, 12), (np.int64(12), 12), (np.float32(12.0), 12), (torch.tensor(12), 12),
    (torch.tensor([12.0]), 12), (np.array([[12]]), 12), (-3.0, -3), (0.0, 0),
])
def test_a_whole_number_is_an_int_whatever_holds_it(value, want):
    assert report.as_int(value) == want and type(report.as_int(value)) is int


@pytest.mark.parametrize("value", [12.5, True, np.bool_(False), math.inf, math.nan, "12", None, [12],
                                   torch.tensor([1, 2]), torch.tensor(True), np.array([1.5])])
def test_what_is_not_one_whole_number_is_none(value):
    assert report.as_int(value) is None


def test_a_sequence_is_a_list_a_tuple_or_an_array_and_never_a_string():
    assert report.as_items((1, 2)) == report.as_items([1, 2]) == [1, 2]
    assert [int(x) for x in report.as_items(torch.tensor([1, 2]))] == [1, 2]
    assert report.as_items(np.array([1, 2]), 2) is not None and report.as_items([1, 2], 3) is None
    for bad in ("ab", b"ab", 3, None, torch.tensor(3), {1: 2}):
        assert report.as_items(bad) is None, bad
    assert report.as_ints((1.0, np.int32(2), torch.tensor(3))) == [1, 2, 3]
    assert report.as_ints([1, 2.5]) is None and report.as_ints([1, True]) is None


def test_a_verdict_is_a_bool_whatever_holds_it():
    for value, want in ((True, True), (np.bool_(False), False), (torch.tensor(True), True), (np.array([True]), True)):
        assert report.as_bool(value) is want
    for bad in (1, 0.0, "True", None, torch.tensor([True, False]), torch.tensor(1)):
        assert report.as_bool(bad) is None, bad


# -- ex08: a verdict as numpy's bool ----------------------------------------------------------------------------


def test_ex08_a_verdict_returned_as_numpys_bool_passes():
    from test_grading_ex08 import make_check

    check = make_check()
    quiet(L.check_lossless_check, lambda sampler: np.bool_(check(sampler)))
    quiet(L.check_lossless_check, lambda sampler: torch.tensor(check(sampler)), hidden=True, seed=2)
    with pytest.raises(AssertionError, match="return True"):
        quiet(L.check_lossless_check, lambda sampler: int(check(sampler)))


# -- ex01: counts and batch sizes as whole floats -------------------------------------------------------------


def test_ex01_counts_and_batch_sizes_returned_as_whole_floats_pass():
    from test_grading_ex01 import memory_bound_batch, pass_bytes, pass_flops

    def as_float(fn):
        return lambda *a: None if fn(*a) is None else float(fn(*a))

    quiet(R.check_bytes_and_flops, as_float(pass_bytes), as_float(pass_flops))
    quiet(R.check_memory_bound_batch, as_float(memory_bound_batch))
    quiet(R.check_memory_bound_batch_unseen, as_float(memory_bound_batch), seed=3)
    quiet(R.check_memory_bound_batch, lambda *a: None if memory_bound_batch(*a) is None else
          torch.tensor(memory_bound_batch(*a)))
    with pytest.raises(AssertionError, match="memory_bound_batch"):
        quiet(R.check_memory_bound_batch, lambda *a: None if memory_bound_batch(*a) is None else
              memory_bound_batch(*a) + 0.5)


# -- ex03: the best k as a whole float ----------------------------------------------------------------------




def test_ex03_best_k_as_a_whole_float_or_a_tensor_passes():
    quiet(S.check_best_k, lambda a, c, v: float(best_k(a, c, v)))
    quiet(S.check_best_k, lambda a, c, v: torch.tensor(best_k(a, c, v)), n_cases=30, seed=2)
    with pytest.raises(AssertionError, match="whole number"):
        quiet(S.check_best_k, lambda a, c, v: best_k(a, c, v) + 0.5)


# -- ex05: a pair and a triple as lists ---------------------------------------------------------------------


def test_ex05_propose_returning_a_list_passes():
    from test_grading_ex05 import CachingDraft, LookupDraft

    class ListPair(LookupDraft):
        def propose(self, tokens, lengths, k):
            return list(super().propose(tokens, lengths, k))

    class ListIds(CachingDraft):
        def propose(self, tokens, lengths, k):
            drafts, q = super().propose(tokens, lengths, k)
            return [drafts.tolist(), q]

    quiet(P.check_draft, ListPair)
    quiet(P.check_draft, ListIds, seed=7)


def test_ex05_compare_tau_returning_lists_passes():
    from test_grading_ex05 import compare_tau

    quiet(P.check_tau_interval, lambda a, b, level=0.95: [list(x) if isinstance(x, tuple) else x
                                                          for x in compare_tau(a, b, level)])
    quiet(P.check_tau_interval, lambda a, b, level=0.95: [*compare_tau(a, b, level)[:2],
                                                          float(compare_tau(a, b, level)[2])], seed=1)
    with pytest.raises(AssertionError, match="return \\(\\(tau"):
        quiet(P.check_tau_interval, lambda a, b, level=0.95: list(compare_tau(a, b, level))[:2])
