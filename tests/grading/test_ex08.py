"""Exercise 8's graders: the grader's own verdicts are right, hidden samplers are built from the seed, the reference
check passes (an honest sampled check too), and broken, constant or library-calling answers fail without being told
which verdict is wrong; Task 2's threshold and sample size are graded by simulation, sound derivations pass and
invalid, loose or powerless ones fail, and so does the course test's own union bound, copied from the package
(which the learner can read) or called (which the jail removes). A fraction of that bound passes, as no number can
show a derivation: the derivation is a hand-graded answer with a rubric, which the solution carries.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from specref.checks.rng import exact_distribution
from specref.checks.toy import MarkovChain
from specref.sampling import TorchRNG
from specref_grading.checks import pitfalls as G

N = 2


def make_check(*bugs: str):
    """is_lossless as the solution writes it, with `bugs` in (the mistakes a learner's check can make)."""

    def is_lossless(sampler) -> bool:
        for target, draft, start in G.reference_cases():
            want = MarkovChain(target).processed(G.TEMPERATURE).joint(start, N)

            def run(rng, target=target, draft=draft, start=start):
                t, d = (target, draft) if "no_copies" in bugs else (target.clone(), draft.clone())
                out = tuple(int(x) for x in sampler(t, d, start, N, rng))
                if "no_input_check" not in bugs and not (torch.equal(t, target) and torch.equal(d, draft)):
                    return ("changed its inputs",)
                return out[:1] if "first_token_only" in bugs else out

            try:
                got = exact_distribution(run)
            except Exception:
                if "no_copies" in bugs:
                    raise
                return False
            if "first_token_only" in bugs:
                want = want.sum(-1)
            tol = 0.3 if "loose" in bugs else 1e-9
            cells = set(got) | {tuple(c) for c in torch.nonzero(want > 0).tolist()}
            if any(len(c) != want.dim() or abs(got.get(c, 0.0) - float(want[c])) > tol for c in cells):
                return False
        return True

    return is_lossless


def tv_threshold(n_cells, n, level):
    """Task 2 as the solution derives it: E[TV] bound plus bounded differences."""
    return 0.5 * math.sqrt((n_cells - 1) / n) + math.sqrt(math.log(1 / level) / (2 * n))


def samples_needed(tv, n_cells, level):
    return math.ceil((2 * tv_threshold(n_cells, 1, level) / tv) ** 2)


def bhc_threshold(n_cells, n, level):
    """The course test's own threshold (Bretagnolle-Huber-Carol, a union over the 2^m events), copied from the
    package's source: valid, but Task 2 asks for one below it where outcomes are many."""
    return math.sqrt((n_cells * math.log(2) + math.log(1 / level)) / (2 * n))


def bhc_samples(tv, n_cells, level):
    return math.ceil((2 * bhc_threshold(n_cells, 1, level) / tv) ** 2)


def _fits(want: torch.Tensor, rows: list) -> bool:
    """A learner's own goodness-of-fit (ex08 forbids specref's Monte-Carlo test): no sample where the joint is 0,
    and a chi-square test of the counts against the joint at level 1e-6."""
    from scipy.stats import chisquare

    p = want.flatten().double()  # the joint of N tokens, row-major
    V = want.shape[-1]
    counts = torch.zeros_like(p)
    for row in rows:
        counts[sum(int(t) * V ** (len(row) - 1 - i) for i, t in enumerate(row))] += 1
    if bool((counts[p == 0] > 0).any()):
        return False
    seen = p > 0
    return chisquare(counts[seen].numpy(), (p[seen] * len(rows)).numpy()).pvalue > 1e-6


def sampled_check(samples: int = 2000):
    """An honest check by sampling: a smoke run copied from the exercise, then a chi-square test on each case."""

    def is_lossless(sampler) -> bool:
        target, draft, start = G.reference_cases()[0]
        sampler(target.clone(), draft.clone(), start, 5, TorchRNG(torch.Generator().manual_seed(0)))  # smoke run
        for target, draft, start in G.reference_cases():
            want = MarkovChain(target).processed(G.TEMPERATURE).joint(start, N)
            rng = TorchRNG(torch.Generator().manual_seed(0))
            rows = []
            for _ in range(samples):
                t, d = target.clone(), draft.clone()
                rows.append(sampler(t, d, start, N, rng))
                if not (torch.equal(t, target) and torch.equal(d, draft)):
                    return False
            if not _fits(want, rows):
                return False
        return True

    return is_lossless


# --------------------------------------------------------------------------------------
# The grader's verdicts, and hidden samplers built from the seed
# --------------------------------------------------------------------------------------


def test_the_visible_six_are_decided_as_designed():
    truth = {name: G._truth(spec) for name, spec in G._VISIBLE.items()}
    assert {n: t[0] for n, t in truth.items()} == {"A": True, "B": False, "C": True, "D": False, "E": True, "F": False}
    assert truth["F"][1] == "target"
    assert truth["B"][1] > 0.03 and truth["D"][1] > 0.03  # the power a sampled check needs


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_hidden_samplers_are_composed_from_the_seed(seed):
    specs = G.hidden_specs(seed)
    truths = [G._truth(s) for s in specs]
    assert sum(t[0] for t in truths) == len(specs) // 2  # half lossless: a constant check is wrong on half
    for lossless, found in truths:
        assert lossless and found <= 1e-12 or isinstance(found, str) or found >= G.MIN_TV  # clear-cut, both ways
    assert specs != G.hidden_specs(seed + 100)  # another seed, other samplers: no fixed list to memorise
    assert len(set(specs)) == len(specs)


def test_hidden_samplers_cover_many_constructions_and_parameters():
    specs = [s for seed in range(6) for s in G.hidden_specs(seed)]
    kinds = {(s.verify.split(":")[0], s.final, s.bonus, s.inplace, s.sampled.split(":")[0], s.temperature != G.TEMPERATURE)
             for s in specs}
    assert len(kinds) >= 15
    assert len({s.sampled for s in specs if s.sampled.startswith("mix:")}) >= 3  # parameters drawn anew


def test_lossless_hidden_samplers_are_lossless_beyond_the_tokens_checked():
    """A sampler the grader calls lossless on N = 2 tokens is lossless on 3 too (no flaw hides past the check)."""
    target, draft, start = G.reference_cases(seed=1)[0]
    want = MarkovChain(target).processed(G.TEMPERATURE).joint(start, 3)
    for spec in G.hidden_specs(0):
        if G._truth(spec)[0]:
            got = exact_distribution(lambda rng, spec=spec: tuple(G._make(spec)(target.clone(), draft.clone(), start, 3, rng)))
            assert max(abs(p - float(want[c])) for c, p in got.items()) < 1e-12, spec


# --------------------------------------------------------------------------------------
# Honest answers pass
# --------------------------------------------------------------------------------------


def test_the_reference_check_and_resolution_pass(capsys):
    check = make_check()
    G.check_lossless_check(check)
    G.check_lossless_check(check, hidden=True, seed=1)
    G.check_resolution(tv_threshold, samples_needed)
    G.check_resolution(tv_threshold, samples_needed, seed=7)
    G.check_resolution(jensen_threshold, samples_needed, seed=3)
    assert capsys.readouterr().out.count("passed") == 5


def jensen_threshold(n_cells, n, level):
    """Another sound derivation: E[TV] <= 0.5 sum_x sqrt(P(x) / n) <= 0.5 sqrt(n_cells / n) (dropping 1 - P(x), then
    Cauchy-Schwarz), plus the same bounded-differences deviation: a little looser than the solution's, still below
    the union bound on 1000 cells."""
    return 0.5 * math.sqrt(n_cells / n) + math.sqrt(math.log(1 / level) / (2 * n))


def test_the_course_tests_union_bound_is_no_answer_to_task_2():
    """The threshold the package prints (and whose formula its source and Task 2's text give) is valid on every
    configuration of the first part, yet scores 0: at 1000 cells Task 2 asks for a threshold below it. A number
    below it that a correct sampler crosses fails too: the large configuration is simulated like the others."""
    from specref.checks.montecarlo import tv_bound

    assert bhc_threshold(9, 1000, 0.01) == pytest.approx(tv_bound(9, 1000, 0.01))  # the package's own rule
    with pytest.raises(AssertionError, match=r"tv_threshold\(1000, 20000, 0\.05\) = 0\.1319 is not below the union bound"):
        G.check_resolution(bhc_threshold, bhc_samples, seed=3)
    assert tv_threshold(*G._LARGE, 0.01) < 0.95 * tv_bound(*G._LARGE, 0.01)  # the solution's, with room to spare

    def too_tight(n_cells, n, level):  # at 1000 cells: below the mean TV of a correct sampler on a uniform target
        return 0.08 if n_cells >= 1000 else tv_threshold(n_cells, n, level)

    with pytest.raises(AssertionError, match=r"tv_threshold\(1000, 20000, 0\.05\) = 0\.0800 is not valid"):
        G.check_resolution(too_tight, samples_needed)


def test_a_shaved_union_bound_passes_the_check_which_is_why_the_derivation_is_graded_by_hand():
    """No number tells a derivation from a fraction of the printed union bound: 0.9 of it passes the automatic
    check (the limit pitfalls.check_resolution's docstring states). So Task 2's points are the hand-graded
    derivation's, with a rubric that gives such a copy 0, and the check is a gate worth none; the negative control is 1.1 of the bound, which fails."""
    import nbformat

    from specref_grading.exercises import check_rubrics

    shaved = lambda n_cells, n, level: 0.9 * bhc_threshold(n_cells, n, level)  # noqa: E731
    G.check_resolution(shaved, lambda tv, n_cells, level: math.ceil((2 * shaved(n_cells, 1, level) / tv) ** 2), seed=5)
    with pytest.raises(AssertionError, match="is not below the union bound"):
        G.check_resolution(lambda c, n, lv: 1.1 * bhc_threshold(c, n, lv), bhc_samples, seed=5)

    path = Path(__file__).resolve().parents[2] / "solutions" / "ex08_lossless_or_not.ipynb"
    nb = nbformat.read(path, as_version=4)
    graded = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    derivation = graded["ex08_resolution_derivation"]
    assert derivation.cell_type == "markdown" and derivation.metadata["nbgrader"]["solution"]
    assert derivation.metadata["nbgrader"]["points"] == 3  # the task's points: the check is a gate worth none
    assert graded["ex08_resolution_check"].metadata["nbgrader"]["points"] == 0
    rubric = check_rubrics(nb, path.name)["ex08_resolution_derivation"]
    assert "McDiarmid" in rubric and "union bound" in rubric and "0 for the task" in rubric
    # The derivation comes after Task 2's check, before Task 3.
    order = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert order.index("ex08_resolution_check") < order.index("ex08_resolution_derivation") < order.index("ex08_explain")


def test_the_jailed_kernel_of_ex08_has_no_distribution_test_and_keeps_the_setup():
    """The specref the learner's kernel sees when ex08 is graded: specref.checks.montecarlo is gone, and with it
    every module that imports it (specref's lazy distribution_test, the audit and pitfall checks, ex04's power
    figures, which hold the same union bound), while what the setup imports stays."""
    from specref_grading.trust import kernel_tree

    forbidden = tuple(sorted(set(G.FORBIDDEN) | set(kernel_tree.ALWAYS_FORBIDDEN)))
    reading = kernel_tree.shared_reading()
    for gone in ("specref.checks.montecarlo", "specref.checks.montecarlo.tv_bound", "specref.distribution_test",
                 "specref.simulate", "specref.checks.pitfalls", "specref.checks.hf_audit", "specref.checks.pair_power"):
        assert not reading.available(forbidden, gone), gone
    for kept in ("specref.checks.rng.exact_distribution", "specref.checks.samplers.SAMPLERS",
                 "specref.checks.samplers.reference_cases", "specref.checks.toy.MarkovChain", "specref.sampling.TorchRNG"):
        assert reading.available(forbidden, kept), kept


@pytest.mark.slow
def test_an_honest_sampled_check_with_a_smoke_run_gets_full_marks():
    G.check_lossless_check(sampled_check())
    G.check_lossless_check(sampled_check(), hidden=True, seed=1)


# --------------------------------------------------------------------------------------
# Broken, constant and library-calling answers fail, and the feedback names no verdict
# --------------------------------------------------------------------------------------


def _no_oracle(message: str) -> None:
    assert "SAMPLERS[" not in message and "expected" not in message and "first wrong" not in message


def test_a_check_of_the_first_token_only_misses_a_flaw_of_the_second():
    """The grader builds such samplers (a bonus from the wrong position when k < N); a check must look at N tokens."""
    spec = G.Spec(k=1, bonus="same")
    assert G._truth(spec)[0] is False and make_check("first_token_only")(G._make(spec)) is True
    assert make_check()(G._make(spec)) is False


@pytest.mark.parametrize("bugs, hidden", [(("no_input_check",), False), (("loose",), True)])
def test_a_check_with_a_mistake_fails_without_saying_where(bugs, hidden):
    with pytest.raises(AssertionError, match="verdicts are not all right") as e:
        G.check_lossless_check(make_check(*bugs), hidden=hidden, seed=1)
    _no_oracle(str(e.value))


def test_a_check_that_does_not_copy_its_inputs_fails():
    with pytest.raises(AssertionError, match="your check raised"):
        G.check_lossless_check(make_check("no_copies"))


@pytest.mark.parametrize("verdict", [True, False])
@pytest.mark.parametrize("hidden", [False, True])
def test_a_constant_check_fails(verdict, hidden):
    with pytest.raises(AssertionError, match="verdicts are not all right") as e:
        G.check_lossless_check(lambda sampler: verdict, hidden=hidden, seed=3)
    _no_oracle(str(e.value))


def test_a_table_of_the_six_outputs_gains_nothing_on_the_hidden_samplers():
    """Fingerprint each visible sampler by one seeded run and look its verdict up: full marks on the six, none on the
    samplers built from the seed."""
    check = make_check()
    target, draft, start = G.reference_cases()[0]

    def fingerprint(sampler):
        rng = TorchRNG(torch.Generator().manual_seed(0))
        return tuple(tuple(sampler(target.clone(), draft.clone(), start, 4, rng)) for _ in range(20))

    table = {fingerprint(s): check(s) for s in G.SAMPLERS.values()}

    def memorised(sampler):
        return table.get(fingerprint(sampler), True)

    G.check_lossless_check(memorised)  # the six: looked up
    for seed in (1, 2):
        with pytest.raises(AssertionError, match="verdicts are not all right"):
            G.check_lossless_check(memorised, hidden=True, seed=seed)


def test_a_check_must_return_a_bool():
    with pytest.raises(AssertionError, match="return True"):
        G.check_lossless_check(lambda s: "yes")


@pytest.mark.parametrize("threshold, needed, message", [
    (lambda m, n, level: 0.5 * math.sqrt((m - 1) / n), samples_needed, "is not valid"),  # the mean, no deviation
    (lambda m, n, level: 0.1, lambda tv, m, level: 1000, "is not valid"),  # one number for every n
    (lambda m, n, level: 0.5 * m * math.sqrt(math.log(2 * m / level) / (2 * n)), samples_needed, "too loose"),  # per cell
    (lambda m, n, level: 1.0, samples_needed, "too loose"),  # a test that flags nothing
    (tv_threshold, lambda tv, m, level: math.ceil((tv_threshold(m, 1, level) / tv) ** 2), "misses a sampler"),  # no 2x
    (tv_threshold, lambda tv, m, level: 10**9, "too many samples"),
    (tv_threshold, lambda tv, m, level: 12.5, "not a positive whole number"),
    (lambda m, n, level: -1.0, samples_needed, "positive, finite"),
    (lambda m, n, level: float("nan"), samples_needed, "positive, finite"),
])
def test_a_wrong_threshold_or_sample_size_fails(threshold, needed, message):
    with pytest.raises(AssertionError, match=message):
        G.check_resolution(threshold, needed)


def test_the_resolution_check_holds_its_false_fail_rate_on_a_threshold_at_the_edge():
    """A threshold exactly at the uniform target's simulated (1 - level) quantile, the tightest valid one there,
    passes the validity part on uniform targets at several seeds: the binomial quantile absorbs the simulation's noise."""
    import numpy as np

    rng = np.random.default_rng(123)
    quantile = {}
    for m in (2, 9, 27):
        for n in (50, 1000):
            for level in (0.05, 0.01):
                tv = G._empirical_tv(rng, np.full(m, 1 / m), np.full(m, 1 / m), n, 200_000)
                quantile[m, n, level] = float(np.quantile(tv, 1 - level))
    edge = lambda m, n, level: quantile.get((m, n, level), tv_threshold(m, n, level))  # noqa: E731
    for seed in range(3):
        G.check_resolution(edge, samples_needed, seed=seed)


def test_the_graders_own_verdicts_used_as_the_answer_score_zero_with_a_message_that_says_why():
    from specref_grading.checks.pitfalls import _evidence_of, _truth, hidden_specs  # noqa: F401

    def is_lossless(sampler):
        return _evidence_of(sampler, G.reference_cases())[1] < 1e-9

    def needed(tv, n_cells, level):
        return G._grader_samples(tv, n_cells, level)

    def from_the_course(n_cells, n, level):
        from specref.checks.montecarlo import distribution_test

        p = torch.full((n_cells,), 1 / n_cells, dtype=torch.float64)
        return distribution_test(p, samples=torch.zeros(n, dtype=torch.long), alpha=level).tv_bound

    with pytest.raises(AssertionError, match=r"Task 1: your is_lossless uses specref_grading\.checks\.pitfalls\._evidence_of"):
        G.check_lossless_check(is_lossless)
    with pytest.raises(AssertionError, match=r"Task 2: your needed uses .*_grader_samples.*scores 0"):
        G.check_resolution(tv_threshold, needed)
    def the_rule_itself(n_cells, n, level):
        from specref.checks.montecarlo import tv_bound

        return 0.9 * tv_bound(n_cells, n, level)

    with pytest.raises(AssertionError, match=r"Task 2: your from_the_course uses specref\.checks\.montecarlo"):
        G.check_resolution(from_the_course, samples_needed)
    with pytest.raises(AssertionError, match=r"Task 2: your the_rule_itself uses specref\.checks\.montecarlo\.tv_bound"):
        G.check_resolution(the_rule_itself, samples_needed)
    G.check_lossless_check(make_check())  # the exercise's own setup names (reference_cases, TEMPERATURE) are allowed


def test_an_unsolved_stub_says_which_task_is_not_done_yet():
    def stub1(sampler):
        raise NotImplementedError("Task 1: write is_lossless (see the task above)")

    def stub2(n_cells, n, level):
        raise NotImplementedError("Task 2: write tv_threshold (see the task above)")

    with pytest.raises(NotImplementedError, match="^Task 1 is not done yet: write is_lossless"):
        G.check_lossless_check(stub1)
    with pytest.raises(NotImplementedError, match="^Task 2 is not done yet: write tv_threshold"):
        G.check_resolution(stub2, samples_needed)
