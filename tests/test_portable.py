"""`make test-portable` counts only environments that really change results on this machine.

tools/upkeep/portable.py reruns the unit tests and the checked notebooks under environments that make this
CPU round like another one. An environment proves itself by changing a fingerprint (torch's float32
logits of the bundled pair, or numpy/scipy's fits); one that does not, or cannot run here, is skipped
here (reported, not passed) and not counted by the tool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "upkeep"))
import portable  # noqa: E402

# The survey of environments means nothing inside one of them (make test-portable runs this file there too).
survey = pytest.mark.skipif(bool(os.environ.get(portable.INSIDE_ENV)), reason="inside a portable environment")


@pytest.fixture(scope="module")
def native() -> portable.Fingerprint:
    return portable.fingerprint_under({})


@pytest.mark.slow
@survey
def test_the_native_fingerprints_are_reproducible(native):
    assert not native.error and native.torch and native.numpy
    assert portable.fingerprint_under({}) == native


@pytest.fixture(scope="module")
def fingerprints() -> dict[str, portable.Fingerprint]:
    return {name: portable.fingerprint_under(env.variables) for name, env in portable.ENVIRONMENTS.items()}


@pytest.mark.slow
@survey
@pytest.mark.parametrize("name", sorted(portable.ENVIRONMENTS))
def test_environment_changes_results_here(name, native, fingerprints):
    """Reports each environment: a skip says it changes nothing on this machine, or cannot run on it, and is not
    counted."""
    fp = fingerprints[name]
    if fp.error:
        pytest.skip(f"{name} cannot run on this CPU ({fp.error}): test-portable does not count it")
    if fp == native:
        pytest.skip(f"{name} does not change results on this machine: test-portable does not count it")


@pytest.mark.slow
@survey
@pytest.mark.parametrize("part", ["torch", "numpy"])
def test_some_environment_changes_each_librarys_results_here(part, native, fingerprints):
    """Otherwise test-portable would prove nothing about that library on this machine."""
    assert any(fp.error == "" and getattr(fp, part) != getattr(native, part) for fp in fingerprints.values()), \
        fingerprints


def test_the_numpy_fingerprint_sees_a_solver_that_rounds_differently(monkeypatch):
    """The fingerprint hashes what numpy computes: a least-squares answer one ulp off changes it."""
    import numpy as np

    here = portable.numpy_fingerprint()
    assert portable.numpy_fingerprint() == here
    lstsq = np.linalg.lstsq
    monkeypatch.setattr(np.linalg, "lstsq", lambda a, b, rcond=None: (
        lambda x, *rest: (np.nextafter(x, np.inf), *rest))(*lstsq(a, b, rcond=rcond)))
    assert portable.numpy_fingerprint() != here


def test_the_unit_tests_it_reruns_are_every_test_but_the_browser_and_fresh_clone_ones():
    """The rule: tests/ less `browser`, `fresh_clone` and `grader`. A test that compares a fit with a committed file
    is in it (slow or not); the fresh clone and the grader's end-to-end tests are not."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *portable.unit_test_run(["tests/test_bench_batch.py", "tests/test_fresh_clone.py",
                                                  "tests/grading/test_hidden_seed.py"])[1:]],
                         cwd=portable.ROOT, capture_output=True, text=True, timeout=300)
    ids = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert any("test_the_in_loop_model_never_sees" in i for i in ids), out.stdout[-2000:]
    assert any("quick_prints_every_table" in i for i in ids), ids
    assert not any("fresh_clone" in i or "test_hidden_seed" in i for i in ids), ids
    assert portable.unit_test_run([]) == ["tests", "-m", "not browser and not fresh_clone and not grader"]


def _fake_fingerprints(monkeypatch, by_env) -> None:
    monkeypatch.setattr(portable, "fingerprint_under", lambda env: by_env(env))


def test_an_environment_without_effect_is_not_run_and_not_counted(monkeypatch, capsys):
    _fake_fingerprints(monkeypatch, lambda env: portable.Fingerprint("same", "same"))
    monkeypatch.setattr(portable.subprocess, "run", lambda *a, **k: pytest.fail("pytest must not run"))
    assert portable.main(["--", "notebooks"]) == 1
    out = capsys.readouterr().out
    assert "NOT checked" in out and out.count("no effect here: not counted") == len(portable.ENVIRONMENTS)


def test_an_environment_this_cpu_cannot_run_is_reported_and_not_counted(monkeypatch, capsys):
    def fp(env):
        if env.get("OPENBLAS_CORETYPE") == "SkylakeX":
            return portable.Fingerprint(None, None, "killed by signal 4")
        return portable.Fingerprint("t", "other" if env.get("OPENBLAS_CORETYPE") == "Sandybridge" else "n")
    _fake_fingerprints(monkeypatch, fp)
    monkeypatch.setattr(portable.subprocess, "run", lambda cmd, env, **k: _Done(0))
    assert portable.main(["--jobs", "1", "--only", "openblas-skylakex", "--only", "openblas-sandybridge", "--",
                          "notebooks"]) == 0
    out = capsys.readouterr().out
    assert "cannot run on this CPU (killed by signal 4): not counted" in out
    assert "1 of 1 environments that change results here passed (they perturb numpy/scipy)" in out


def test_a_fingerprint_process_that_dies_says_how(monkeypatch):
    class Died:
        returncode, stdout, stderr = -4, "", "Illegal instruction\n"
    monkeypatch.setattr(portable.subprocess, "run", lambda *a, **k: Died())
    assert portable.fingerprint_under({"OPENBLAS_CORETYPE": "SkylakeX"}) == portable.Fingerprint(
        None, None, "killed by signal 4: Illegal instruction")


class _Done:
    def __init__(self, returncode: int) -> None:
        self.returncode, self.stdout, self.stderr = returncode, "1 failed", ""


@pytest.mark.parametrize("units, notebooks, want", [(0, 0, 0), (1, 0, 1), (0, 1, 1)])
def test_a_changing_environment_counts_with_both_pytest_results(monkeypatch, capsys, units, notebooks, want):
    _fake_fingerprints(monkeypatch, lambda env: portable.Fingerprint("other" if env.get("MKL_CBWR") else "native",
                                                                     "native"))
    calls = []

    def run(cmd, env, **k):
        assert env[portable.INSIDE_ENV] == "mkl-compatible"
        calls.append(cmd)
        return _Done(units if "tests" in cmd else notebooks)
    monkeypatch.setattr(portable.subprocess, "run", run)
    assert portable.main(["--jobs", "1", "--", "notebooks", "--nbval"]) == want
    assert len(calls) == 2
    assert calls[0][-3:] == portable.unit_test_run([]) and calls[1][-2:] == ["notebooks", "--nbval"]
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("mkl-compatible"))
    assert row.split()[2:] == ["torch", "passed" if not units else "FAILED", *([] if not units else ["(1)"]),
                               "passed" if not notebooks else "FAILED", *([] if not notebooks else ["(1)"])]
    assert (f"{1 - want} of 1 environments that change results here passed") in out


def _by_library(env: dict[str, str]) -> portable.Fingerprint:
    """Sandybridge changes numpy's fingerprint, MKL_CBWR torch's; both set change both."""
    return portable.Fingerprint("other" if env.get("MKL_CBWR") else "native",
                                "other" if env.get("OPENBLAS_CORETYPE") == "Sandybridge" else "native")


def _record_runs(monkeypatch) -> list[str]:
    for env in portable.ENVIRONMENTS.values():  # inside a portable run the outer variables are set already
        for name in env.variables:
            monkeypatch.delenv(name, raising=False)
    names = []

    def run(cmd, env, **k):
        names.append(env[portable.INSIDE_ENV])
        assert ("MKL_CBWR" in env) == ("mkl-compatible" in env[portable.INSIDE_ENV])
        assert ("OPENBLAS_CORETYPE" in env) == ("openblas-sandybridge" in env[portable.INSIDE_ENV])
        return _Done(0)
    monkeypatch.setattr(portable.subprocess, "run", run)
    return names


ONLY_TWO = ["--jobs", "1", "--only", "openblas-sandybridge", "--only", "mkl-compatible"]


def test_a_numpy_and_a_torch_environment_share_one_run(monkeypatch, capsys):
    _fake_fingerprints(monkeypatch, _by_library)
    names = _record_runs(monkeypatch)
    assert portable.main([*ONLY_TWO, "--", "notebooks"]) == 0
    assert names == ["openblas-sandybridge+mkl-compatible"] * 2  # the unit tests, then the notebooks
    out = capsys.readouterr().out
    assert "2 of 2 environments that change results here passed" in out and "in 1 test runs" in out
    assert "(in one run with mkl-compatible)" in out and "(in one run with openblas-sandybridge)" in out


def test_a_pair_whose_combination_changes_only_one_library_runs_apart(monkeypatch, capsys):
    def masked(env):  # set together, the torch variable hides the numpy one: no longer a test of both
        fp = _by_library(env)
        return portable.Fingerprint(fp.torch, "native") if env.get("MKL_CBWR") else fp
    _fake_fingerprints(monkeypatch, masked)
    names = _record_runs(monkeypatch)
    assert portable.main([*ONLY_TWO, "--", "notebooks"]) == 0
    assert sorted(names) == ["mkl-compatible"] * 2 + ["openblas-sandybridge"] * 2
    assert "in 2 test runs" in capsys.readouterr().out


def test_separately_gives_each_environment_its_own_run(monkeypatch):
    _fake_fingerprints(monkeypatch, _by_library)
    names = _record_runs(monkeypatch)
    assert portable.main([*ONLY_TWO, "--separately", "--", "notebooks"]) == 0
    assert sorted(names) == ["mkl-compatible"] * 2 + ["openblas-sandybridge"] * 2


def test_a_failure_in_a_shared_run_fails_both_environments(monkeypatch, capsys):
    _fake_fingerprints(monkeypatch, _by_library)
    monkeypatch.setattr(portable.subprocess, "run", lambda cmd, env, **k: _Done(1 if "tests" in cmd else 0))
    assert portable.main([*ONLY_TWO, "--", "notebooks"]) == 1
    out = capsys.readouterr().out
    assert "0 of 2 environments that change results here passed" in out
    assert "---- openblas-sandybridge + mkl-compatible" in out
