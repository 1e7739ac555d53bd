"""`make test-portable` counts only environments that really change float32 results on this machine.

tools/portable.py reruns the checked notebooks under environments that make this CPU round
like another one. An environment proves itself by changing the float32 fingerprint of the bundled
pair; one that does not is skipped here (reported, not passed) and not counted by the tool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import portable  # noqa: E402


@pytest.fixture(scope="module")
def native() -> str:
    return portable.fingerprint_under({})


@pytest.mark.slow
def test_the_native_fingerprint_is_reproducible(native):
    assert portable.fingerprint_under({}) == native


@pytest.fixture(scope="module")
def fingerprints() -> dict[str, str]:
    return {name: portable.fingerprint_under(env) for name, env in portable.ENVIRONMENTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(portable.ENVIRONMENTS))
def test_environment_perturbs_float32_results_here(name, native, fingerprints):
    """Reports each environment: a skip says it changes nothing on this machine and is not counted."""
    if fingerprints[name] == native:
        pytest.skip(f"{name} does not change float32 results on this machine: test-portable does not count it")


@pytest.mark.slow
def test_some_environment_perturbs_float32_results_here(native, fingerprints):
    """Otherwise test-portable would prove nothing on this machine (and it fails for that reason too)."""
    assert any(fp != native for fp in fingerprints.values()), fingerprints


def test_an_environment_without_effect_is_not_run_and_not_counted(monkeypatch, capsys):
    monkeypatch.setattr(portable, "fingerprint_under", lambda env: "same")
    monkeypatch.setattr(portable.subprocess, "run", lambda *a, **k: pytest.fail("pytest must not run"))
    assert portable.main(["--", "notebooks"]) == 1
    out = capsys.readouterr().out
    assert "NOT checked" in out and out.count("not counted") == len(portable.ENVIRONMENTS)


class _Done:
    def __init__(self, returncode: int) -> None:
        self.returncode, self.stdout, self.stderr = returncode, "1 failed", ""


@pytest.mark.parametrize("rc, want", [(0, 0), (1, 1)])
def test_a_perturbing_environment_counts_with_its_pytest_result(monkeypatch, capsys, rc, want):
    monkeypatch.setattr(portable, "fingerprint_under", lambda env: "other" if env.get("MKL_CBWR") else "native")
    calls = []
    monkeypatch.setattr(portable.subprocess, "run", lambda cmd, env, **k: calls.append(env) or _Done(rc))
    assert portable.main(["--jobs", "1", "--", "notebooks", "--nbval"]) == want
    assert len(calls) == 1 and calls[0]["MKL_CBWR"] == "COMPATIBLE"
    out = capsys.readouterr().out
    assert ("0 of 1 perturbing environments passed" if rc else "1 of 1 perturbing environments passed") in out
    assert ("FAILED (pytest exit 1)" in out) == bool(rc)
