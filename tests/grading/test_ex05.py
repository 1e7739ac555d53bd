"""Exercise 5's graders: the reference rule passes, and each broken proposal rule is flagged by the check meant for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specref.drafts.prompt_lookup import lookup
from specref_grading.checks import prompt_lookup as G


def _start(context, max_ngram, min_ngram):
    """Where the copy starts: just after the latest earlier match of the longest suffix, else the last token."""
    L = len(context)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        starts = [i for i in range(L - n - 1, -1, -1) if context[i : i + n] == context[L - n :]]
        if starts:
            return starts[0] + n
    return L - 1


def reference(context, k, max_ngram, min_ngram):
    """The solution's answer, written independently of `lookup`."""
    s = _start(context, max_ngram, min_ngram)
    return [context[s + j % (len(context) - s)] for j in range(k)]


def _wrong(context, k, max_ngram, min_ngram, latest=True, longest_first=True):
    """The usual mistakes, written here (a learner's answer may not call the grader's own)."""
    L = len(context)
    s = L - 1
    ns = list(range(min(max_ngram, L - 1), min_ngram - 1, -1))
    for n in (ns if longest_first else ns[::-1]):
        starts = [i for i in range(L - n) if context[i : i + n] == context[L - n :]]
        if starts:
            s = (starts[-1] if latest else starts[0]) + n
            break
    return [context[s + j % (L - s)] for j in range(k)]


def earliest(context, k, max_ngram, min_ngram):
    return _wrong(context, k, max_ngram, min_ngram, latest=False)


def shortest_first(context, k, max_ngram, min_ngram):
    return _wrong(context, k, max_ngram, min_ngram, longest_first=False)


def no_wrap(context, k, max_ngram, min_ngram):  # stops copying where the context ends, then repeats the last token
    s = _start(context, max_ngram, min_ngram)
    out = context[s : s + k]
    return out + [context[-1]] * (k - len(out))


def matches_itself(context, k, max_ngram, min_ngram):  # the suffix may match itself (i = L - n): s = L, nothing follows
    L = len(context)
    for n in range(min(max_ngram, L), min_ngram - 1, -1):
        starts = [i for i in range(L - n, -1, -1) if context[i : i + n] == context[L - n :]]
        if starts:
            s = starts[0] + n
            return [context[s + j % (L - s)] for j in range(k)]
    return [context[-1]] * k


def in_place(context, k, max_ngram, min_ngram):
    out = reference(context, k, max_ngram, min_ngram)
    context.append(0)
    return out


def repeat_last(context, k, max_ngram, min_ngram):
    return [context[-1]] * k


def one_token_only(context, k, max_ngram, min_ngram):  # right about the next token, then repeats it
    return reference(context, 1, max_ngram, min_ngram) * k


class LookupDraft:
    """The solution's draft: stateless, one-hot q."""

    def __init__(self, vocab_size, max_ngram=3, min_ngram=1, rule=None):
        self.vocab_size, self.max_ngram, self.min_ngram = vocab_size, max_ngram, min_ngram
        self.rule = rule or reference

    def begin(self, batch_size):
        self.batch_size = batch_size

    def q(self, drafts):
        return torch.nn.functional.one_hot(drafts, self.vocab_size).double()

    def propose(self, tokens, lengths, k):
        rows = [self.rule(row[:n], k, self.max_ngram, self.min_ngram) for row, n in zip(tokens.tolist(), lengths.tolist())]
        drafts = torch.tensor(rows, dtype=torch.long).reshape(len(rows), k)
        return drafts, self.q(drafts)

    def rollback(self, n_valid):
        pass


class CachingDraft(LookupDraft):
    """A stateful draft: keeps each row's context and reads only the new tokens; rollback trims it."""

    def begin(self, batch_size):
        self.rows = [[] for _ in range(batch_size)]

    def propose(self, tokens, lengths, k):
        for b, n in enumerate(lengths.tolist()):
            self.rows[b] += tokens[b, len(self.rows[b]) : n].tolist()
        drafts = torch.tensor([self.rule(r, k, self.max_ngram, self.min_ngram) for r in self.rows],
                              dtype=torch.long).reshape(len(self.rows), k)
        return drafts, self.q(drafts)

    def rollback(self, n_valid):
        self.rows = [r[:n] for r, n in zip(self.rows, n_valid.tolist())]


class NoRollback(CachingDraft):
    def rollback(self, n_valid):
        pass


class Smoothed(LookupDraft):
    """The negative control of the distribution test: the same proposals, q half one-hot and half uniform."""

    def q(self, drafts):
        return 0.5 * super().q(drafts) + 0.5 / self.vocab_size


class Float32(LookupDraft):
    def q(self, drafts):
        return super().q(drafts).float()


class InPlace(LookupDraft):
    def propose(self, tokens, lengths, k):
        out = super().propose(tokens, lengths, k)
        lengths -= 1
        return out


def test_the_reference_rule_and_draft_pass_every_check(capsys):
    G.check_proposals(reference)
    G.check_proposals(reference, n_cases=400, seed=1)
    G.check_draft(LookupDraft)
    G.check_draft(LookupDraft, seed=1)
    G.check_draft(CachingDraft, seed=7)
    G.check_tau_interval(compare_tau)
    G.check_tau_interval(compare_tau, n_cases=200, seed=1)
    assert capsys.readouterr().out.count("passed") == 7


def test_the_reference_equals_the_package_rule_on_the_hidden_cases():
    for context, k, max_ngram, min_ngram in G._cases(400, seed=1):
        assert reference(context, k, max_ngram, min_ngram) == lookup(context, k, max_ngram, min_ngram)


@pytest.mark.parametrize(
    "rule, message",
    [
        (earliest, "EARLIEST occurrence"),
        (shortest_first, "shortest n-gram first"),
        (no_wrap, "your copy stops where the context ends"),
        (matches_itself, "ZeroDivisionError"),
        (in_place, "changed `context` in place"),
        (lambda c, k, a, b: [x + 0.5 for x in reference(c, k, a, b)], "return a list of"),
        (lambda c, k, a, b: reference(c, k, a, b)[:-1] if k else [0], "return a list of"),
        (lambda c, k, a, b: c[len(c) + 1], "your function raised IndexError"),
    ],
)
def test_the_proposal_check_flags_each_broken_rule(rule, message):
    with pytest.raises(AssertionError, match=message):
        G.check_proposals(rule)


def _interval(steps, level, quantile=None, ddof=1):
    """(mean, low, high), written here independently of the grader: mean -+ t s / sqrt(n)."""
    x = np.asarray(steps, dtype=np.float64)
    t = stats.t.ppf((1 + level) / 2, len(x) - 1) if quantile is None else quantile(level, len(x))
    half = t * x.std(ddof=ddof) / np.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def _compare(a, b, level=0.95, **kw):
    ia, ib = _interval(a, level, **kw), _interval(b, level, **kw)
    return ia, ib, 1 if ia[1] > ib[2] else -1 if ia[2] < ib[1] else 0


def compare_tau(a, b, level=0.95):
    """The solution's answer."""
    return _compare(a, b, level)


def compare_tau_scipy(a, b, level=0.95):
    """The same answer through scipy's own interval."""
    def one(x):
        m = float(np.mean(x))
        low, high = stats.t.interval(level, len(x) - 1, loc=m, scale=stats.sem(x))
        return m, low, high
    ia, ib = one(a), one(b)
    return ia, ib, 1 if ia[1] > ib[2] else -1 if ia[2] < ib[1] else 0


def compare_tau_float32(a, b, level=0.95):
    """The solution's arithmetic in float32: within the check's tolerance."""
    def one(x):
        x = torch.tensor(x, dtype=torch.float32)
        half = float(stats.t.ppf((1 + level) / 2, len(x) - 1)) * x.std() / len(x) ** 0.5
        return float(x.mean()), float(x.mean() - half), float(x.mean() + half)
    ia, ib = one(a), one(b)
    return ia, ib, 1 if ia[1] > ib[2] else -1 if ia[2] < ib[1] else 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_interval_check_accepts_scipy_and_float32_answers(seed):
    G.check_tau_interval(compare_tau_scipy, n_cases=200, seed=seed)
    G.check_tau_interval(compare_tau_float32, n_cases=200, seed=seed)


@pytest.mark.parametrize("answer, message", [
    (lambda a, b, level=0.95: _compare(a, b, level, quantile=lambda lv, n: stats.norm.ppf((1 + lv) / 2)),
     "the interval misses the contract"),  # a normal quantile
    (lambda a, b, level=0.95: _compare(a, b, level, ddof=0), "estimate of the spread"),
    (lambda a, b, level=0.95: _compare(a, b, level, quantile=lambda lv, n: stats.t.ppf(lv, n - 1)),
     "the interval misses the contract"),  # one-sided
    (lambda a, b, level=0.95: (*_compare(a, b, level)[:2], int(np.sign(np.mean(a) - np.mean(b)))),
     "a difference inside the intervals decides nothing"),  # the verdict by the means alone
    (lambda a, b, level=0.95: (*_compare(a, b, level)[:2], True), "expected verdict"),
    (lambda a, b, level=0.95: (_compare(a, b, level)[0], _compare(a, b, level)[0], 0), "expected for b"),
    (lambda a, b, level=0.95: (_interval([len(a)] + a[1:], level), *_compare(a, b, level)[1:]), "tau is the mean"),
    (lambda a, b, level=0.95: _compare(a, b, level)[:2], "return \\(\\(tau"),
    (lambda a, b, level=0.95: (a.sort(), _compare(a, b, level))[1], "changed its input lists in place"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_interval_check_flags_each_usual_mistake(answer, message, seed):
    with pytest.raises(AssertionError, match=message):
        G.check_tau_interval(answer, seed=seed)


def test_the_interval_cases_hold_decided_and_undecided_pairs_none_on_the_edge():
    for seed in (0, 1, 2):
        cases = G.tau_cases(200, seed)
        verdicts = [_compare(a, b, level)[2] for a, b, level in cases]
        assert verdicts.count(0) >= 20 and verdicts.count(1) >= 20 and verdicts.count(-1) >= 20, seed
        assert all(2 <= len(a) <= 400 and 2 <= len(b) <= 400 and len(set(a)) > 1 for a, b, _ in cases)
    assert G.tau_cases(60, 0) == G.tau_cases(60, 0) and G.tau_cases(60, 0) != G.tau_cases(60, 1)


@pytest.mark.parametrize("draft, message", [
    (Smoothed, "not the target's"),  # the negative control: the distribution test flags it
    (lambda V, a, b: Smoothed(V, a, b), "not the target's"),
    (Float32, "q must be a float64 tensor"),
    (NoRollback, "wrong proposal"),  # remembers rejected drafts
    (InPlace, "changed the buffer or the lengths in place"),
    (lambda V, a, b: LookupDraft(V, a, b, rule=earliest), "wrong proposal"),
])
def test_the_draft_check_flags_each_broken_draft(draft, message):
    with pytest.raises(AssertionError, match=message):
        G.check_draft(draft)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_distribution_test_has_power_against_a_smoothed_q_and_passes_the_one_hot_q(seed):
    """At the check's sample size, the one-hot draft passes and a draft reporting q = 0.9 one-hot + 0.1 uniform (a
    milder smoothing than the negative control's) already fails, on the visible prompt and on hidden ones."""

    class Mild(LookupDraft):
        def q(self, drafts):
            return 0.9 * super().q(drafts) + 0.1 / self.vocab_size

    target = G.tiny_target(1000 + seed)
    V = target.config.vocab_size
    prompt = G._prompt(seed, V)
    assert G.first_two_test(G._Adapter(LookupDraft(V), V), target, prompt, G.RUNS, seed).passed
    assert not G.first_two_test(G._Adapter(Mild(V), V), target, prompt, G.RUNS, seed).passed


def test_one_line_library_calls_score_zero_with_a_message_that_says_why():
    """Each task's answer made of the reference it asks for fails at the visible check, and says why."""
    from specref.decoding import positions
    from specref.drafts import PromptLookupDraft
    from specref.drafts import prompt_lookup as pl
    from specref_grading.checks.draft_positions import check_acceptance_counts

    def lookup_proposal(context, k, max_ngram, min_ngram):
        return lookup(context, k, max_ngram, min_ngram)

    def via_module(context, k, max_ngram, min_ngram):
        return pl._copy(context, pl.match(context, max_ngram, min_ngram) or len(context) - 1, k)

    class Subclass(PromptLookupDraft):
        pass

    def acceptance_by_position(steps, k):
        return positions.acceptance_by_position(steps, k)

    for check, answer, task in [(G.check_proposals, lookup_proposal, 1), (G.check_proposals, via_module, 1),
                                (G.check_draft, Subclass, 2),
                                (G.check_draft, lambda V, a, b: PromptLookupDraft(V, a, b), 2),
                                (check_acceptance_counts, acceptance_by_position, 5)]:
        with pytest.raises(AssertionError, match=rf"Task {task}: your .* uses specref\.") as e:
            check(answer)
        assert "scores 0" in str(e.value)


def test_the_reference_rule_leaves_proxies_alone():
    """A grader's proxy of a learner function is not a Python function: the inspection does nothing to it."""
    from specref_grading.checks.rules import reference_uses

    class Proxy:
        def __call__(self, *args):
            return lookup(*args)

    assert reference_uses(Proxy(), ("specref.drafts.prompt_lookup",)) == []
    G.check_proposals(Proxy())  # graded by what it returns; the grader's scanner flags reference use there


def test_constant_answers_fail_every_task():
    with pytest.raises(AssertionError):
        G.check_proposals(lambda c, k, a, b: [0] * k)
    with pytest.raises(AssertionError):
        G.check_tau_interval(lambda a, b, level=0.95: ((2.0, 1.0, 3.0), (2.0, 1.0, 3.0), 0))
    with pytest.raises(AssertionError, match="wrong proposal"):
        G.check_draft(lambda V, a, b: LookupDraft(V, a, b, rule=lambda c, k, x, y: [0] * k))


def test_answers_are_read_as_plain_ints_by_value():
    assert G._as_proposal(torch.tensor([3, 4]), 2) == [3, 4]
    assert G._as_proposal([np.int64(3), torch.tensor(4)], 2) == [3, 4]
    assert all(type(x) is int for x in G._as_proposal([np.int64(3), 5], 2))
    assert G._as_proposal([1.0, 2.0], 2) == [1, 2] and G._as_proposal(torch.tensor([1.0, 2.0]), 2) == [1, 2]
    for bad in ([1.5, 2.0], torch.tensor([1.0, 2.5]), [True, 1], [1], "12", torch.tensor([[1, 2]]), None):
        assert G._as_proposal(bad, 2) is None, bad


def test_an_unsolved_stub_says_which_task_is_not_done_yet():
    def stub(*args):
        raise NotImplementedError("Task 1: write lookup_proposal (see the task above)")

    class StubDraft:
        def __init__(self, *args):
            raise NotImplementedError("Task 2: write LookupDraft.__init__ (see the task above)")

    with pytest.raises(NotImplementedError, match=r"^Task 1 is not done yet: write lookup_proposal"):
        G.check_proposals(stub)

    def stub3(*args):
        raise NotImplementedError("Task 3: write compare_tau (see the task above)")

    with pytest.raises(NotImplementedError, match=r"^Task 3 is not done yet: write compare_tau"):
        G.check_tau_interval(stub3)
    with pytest.raises(NotImplementedError, match=r"^Task 2 is not done yet: write LookupDraft.__init__"):
        G.check_draft(StubDraft)
    with pytest.raises(NotImplementedError, match=r"^Task 2 is not done yet"):
        G.check_draft(lambda *a: (_ for _ in ()).throw(NotImplementedError()))


def test_an_answer_that_hard_codes_the_visible_streams_passes_them_and_fails_the_hidden_ones():
    memo = {(tuple(c), k, a, b): lookup(c, k, a, b) for c, k, a, b in G._cases(150, seed=0)}

    def hard_coded(context, k, max_ngram, min_ngram):
        return memo.get((tuple(context), k, max_ngram, min_ngram), repeat_last(context, k, max_ngram, min_ngram))

    G.check_proposals(hard_coded)  # the visible check alone cannot tell
    with pytest.raises(AssertionError, match="check_proposals: wrong answer"):
        G.check_proposals(hard_coded, n_cases=400, seed=1)  # the hidden test can


def _scan(source: str) -> list[str]:
    """What specref_grading's scan finds in an answer cell of exercise 5, with the solution's setup names."""
    import json
    from pathlib import Path

    from specref_grading.scan import imported_specref_names, names_used, scan

    root = Path(__file__).resolve().parents[2]

    cells = json.loads((root / "solutions" / "ex05_prompt_lookup.ipynb").read_text())["cells"]
    first = next(i for i, c in enumerate(cells) if c["metadata"].get("nbgrader", {}).get("solution"))
    setup = imported_specref_names(["".join(c["source"]) for c in cells[:first] if c["cell_type"] == "code"])
    solution = "".join(cells[first]["source"])
    return [f.kind for f in scan(source or solution, setup, names_used(solution) & setup)]


@pytest.mark.parametrize("source", [
    "from specref.drafts.prompt_lookup import lookup\n\ndef lookup_proposal(c, k, a, b):\n    return lookup(c, k, a, b)\n",
    "import specref_grading.checks.prompt_lookup as g\ng.lookup = lambda *a: a[0][:a[1]]\n",
    "def lookup_proposal(c, k, a, b):\n    return [c[-1]] * k\n\ncheck_proposals.__globals__['lookup'] = lookup_proposal\n",
    "def lookup_proposal(c, k, a, b):\n    return list(edit_cases(1)[0].tokens[:k])\n",  # a setup name from specref
])
def test_an_answer_that_uses_or_patches_the_reference_gets_nothing_and_the_solution_is_not_noted(source):
    """The kernel's specref lacks prompt lookup, and the kernel has no specref_grading and no checks: each of these
    fails the task. The scanner notes what it sees (never a gate); the solution's own answer gets no note."""
    import json
    from pathlib import Path

    from specref_grading import grade as grader
    from specref_grading import plan as grade_plan

    sol = json.loads((Path(__file__).resolve().parents[2] / "solutions" / "ex05_prompt_lookup.ipynb").read_text())
    sub = json.loads(json.dumps(sol))
    cell = next(c for c in sub["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "ex05_lookup_answer")
    cell["source"] = source
    plan = grade_plan.build_plan(sol, sub, "ex05_prompt_lookup.ipynb")
    plan.tests = [t for t in plan.tests if t.grade_id == "ex05_lookup_check"]  # only the cells up to its test run
    (result,) = grader.grade_plan(plan, cell_timeout=120)
    assert result.outcome != "passed" and result.score == 0, (result.outcome, result.message)
    if "specref" in source.split("\n")[0]:
        assert any("'ex05_lookup_answer'" in n and "specref" in n for n in plan.notes), plan.notes
    assert _scan("") == []  # "": the solution's own answer, which is clean


def test_an_interval_answer_made_of_the_notebooks_intervals_scores_zero():
    """specref.perf.intervals holds notebook 05's comparison: Task 3 answered with it fails the visible check."""
    from specref.perf import intervals

    def compare_tau(a, b, level=0.95):
        ia, ib = intervals.mean_ci(a, level), intervals.mean_ci(b, level)
        return ia, ib, intervals.apart(ia[1:], ib[1:])

    assert "specref.perf.intervals" in G.FORBIDDEN
    with pytest.raises(AssertionError, match=r"Task 3: your .* uses specref\.") as e:
        G.check_tau_interval(compare_tau)
    assert "scores 0" in str(e.value)
