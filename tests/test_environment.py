"""One tested set of versions, declared consistently everywhere, and a readiness report that tells the truth.

The pins (requirements/base.txt, test.txt) are the source; lock.txt, environment.yml
and pyproject.toml's ranges must agree with them, and this environment must be
running them. `python -m specref` (specref.course.doctor) must pass here and must fail when
a rule, the widget extension or the bundled models are broken.
"""

from __future__ import annotations

import ast
import functools
import http.server
import re
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from specref import chain_verify, rejection
from specref.checks import montecarlo
from specref.course import doctor
from specref.course.doctor import FAIL, OK, WARN, pinned_versions

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the lock installs tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
REQ = REPO / "requirements"
PYTHONS = ("3.10", "3.11")  # the lock resolves for both; 3.11 is the one CI runs
HERE = "{}.{}".format(*sys.version_info[:2])


def own_names(path: Path) -> set[str]:
    """Names a requirements file pins itself (not through -r)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            names.add(canonicalize_name(Requirement(line).name))
    return names


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def environment_yml_pins() -> tuple[str, dict[str, str], list[str]]:
    """(python version, {name: version} of the pip section, pip options) of environment.yml."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    python, pip_section = None, None
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip_section = dep["pip"]
        elif str(dep).startswith("python="):
            python = str(dep).split("=", 1)[1]
    pins, options = {}, []
    for line in pip_section:
        if line.startswith("-"):
            options.append(line)
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"environment.yml: {line} is not an exact pin"
        pins[canonicalize_name(req.name)] = spec.version
    return python, pins, options


# -- the pinned set --------------------------------------------------------------------------
@pytest.mark.parametrize("python", PYTHONS)
def test_lock_holds_every_direct_pin_at_the_same_version(python):
    direct = pinned_versions(REQ / "test.txt", python)
    lock = pinned_versions(REQ / "lock.txt", python)
    assert {n: lock.get(n) for n in direct} == direct


def test_lock_pins_torch_without_a_local_build_suffix():
    """`torch==2.13.0` matches the CPU wheel (2.13.0+cpu) and CUDA builds alike; `+cpu` would fail on PyPI."""
    assert all("+" not in v for v in pinned_versions(REQ / "lock.txt", HERE).values())


def test_this_environment_runs_the_pinned_versions():
    lock = pinned_versions(REQ / "lock.txt", HERE)
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wrong = {n: (v, installed.get(n)) for n, v in lock.items()
             if installed.get(n) is None or Version(installed[n]).public != Version(v).public}
    assert wrong == {}, "pinned vs installed; run `make venv`"


def test_environment_yml_lists_the_pinned_set():
    python, pins, options = environment_yml_pins()
    assert python == "3.11"
    assert pins == pinned_versions(REQ / "test.txt", python)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in options


@pytest.mark.parametrize("python", PYTHONS)
def test_pyproject_ranges_admit_every_pin(python):
    project = pyproject()["project"]
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    pins = pinned_versions(REQ / "test.txt", python)
    rejected = [f"{r} rejects {pins[canonicalize_name(Requirement(r).name)]}" for r in declared
                if not Requirement(r).specifier.contains(pins[canonicalize_name(Requirement(r).name)], prereleases=True)]
    assert rejected == []


def test_pyproject_declares_exactly_the_pinned_packages():
    project = pyproject()["project"]
    names = lambda reqs: {canonicalize_name(Requirement(r).name) for r in reqs}  # noqa: E731
    extras = project["optional-dependencies"]
    assert names(project["dependencies"]) == own_names(REQ / "base.txt")
    assert names(extras["test"]) | names(extras["browser"]) == own_names(REQ / "test.txt")


@pytest.mark.parametrize("python", PYTHONS)
def test_requires_python_admits_the_locked_pythons(python):
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet(pyproject()["project"]["requires-python"]).contains(python + ".0")


@pytest.mark.parametrize("folder", ["specref", "tools", "tests"])
def test_sources_parse_as_python_3_10(folder):
    """The lock supports Python 3.10, so no 3.11+ syntax (except*, PEP 695 generics) may creep in."""
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        try:
            ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))
        except SyntaxError as e:
            bad.append(f"{path.relative_to(REPO)}:{e.lineno}: {e.msg}")
    assert bad == []


# -- the test command ------------------------------------------------------------------------
def test_make_test_runs_the_whole_suite_with_strict_nbval_and_timeouts():
    out = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    (cmd,) = [ln for ln in out.splitlines() if " -m pytest " in ln]
    args = cmd.split()
    assert args[args.index("pytest") + 1:][:1] == ["tests"]
    for wanted in ("--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"):
        assert wanted in args
    assert "--nbval-lax" not in args
    assert any(a.startswith("--nbval-cell-timeout=") for a in args)
    assert pyproject()["tool"]["pytest"]["ini_options"]["timeout"] > 0


def _venv_commands(*overrides: str) -> list[str]:
    """The commands `make venv` would run, with make variables set on its command line."""
    out = subprocess.run(["make", "-n", "-B", "venv", *overrides], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()


def _torch_install(lines: list[str]) -> str:
    (line,) = [ln for ln in lines if " -m pip install " in ln and '"torch==' in ln]
    return line


def _torch_index(lines: list[str]) -> str:
    """The index the torch step probes and, if it answers, hands to pip ('' for none)."""
    (line,) = [ln for ln in lines if ln.startswith("index='")]
    assert '${index:+--extra-index-url "$index"}' in _torch_install(lines)
    return line.split("'")[1]


def test_torch_index_override_reaches_pip():
    """`make venv TORCH_INDEX=...` takes torch from that index; the other packages never ask it."""
    url = "https://example.invalid/whl"
    lines = _venv_commands(f"TORCH_INDEX={url}")
    assert _torch_index(lines) == url
    rest = [ln for ln in lines if " -m pip install " in ln and "requirements/test.txt" in ln]
    assert len(rest) == 1 and "--extra-index-url" not in rest[0]


@pytest.mark.skipif(sys.platform != "linux", reason="the automatic choice is made on Linux only")
def test_without_an_nvidia_gpu_linux_takes_the_cpu_build_of_torch():
    assert _torch_index(_venv_commands("HAS_NVIDIA_GPU=")) == "https://download.pytorch.org/whl/cpu"
    assert _torch_index(_venv_commands("HAS_NVIDIA_GPU=yes")) == ""
    assert _torch_index(_venv_commands("TORCH_INDEX=")) == ""  # forced PyPI


def _torch_step(index: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run the set-up's torch step as `make venv` would, with pip replaced by echo; (result, seconds)."""
    lines = _venv_commands(f"TORCH_INDEX={index}", "PIP_INSTALL=echo pip install", f"VPY={sys.executable}")
    first = next(i for i, ln in enumerate(lines) if ln.startswith("index='"))
    last = next(i for i, ln in enumerate(lines) if '"torch==' in ln)
    script = tmp_path / "step.sh"
    script.write_text("\n".join(lines[first:last + 1]) + "\n")
    start = time.monotonic()
    done = subprocess.run(["bash", str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - start


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_torch_index_costs_seconds_and_one_line_then_pypi(tmp_path):
    index = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    done, seconds = _torch_step(index, tmp_path)
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stdout.splitlines() if "cannot be reached" in ln]
    assert len(said) == 1 and index in said[0] and "going on without it" in said[0]
    install = done.stdout.splitlines()[-1]
    assert install.startswith("pip install") and "--extra-index-url" not in install and "torch==" in install
    assert seconds < 10


def test_a_reachable_torch_index_is_handed_to_pip(tmp_path):
    served = tmp_path / "index"
    (served / "torch").mkdir(parents=True)
    (served / "torch" / "index.html").write_text("<a href='torch-0-py3-none-any.whl'>torch</a>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        done, _ = _torch_step(index, tmp_path)
        missing, _ = _torch_step(index + "/elsewhere", tmp_path)  # the server answers, but 404: no torch there
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0 and "cannot be reached" not in done.stdout
    assert done.stdout.splitlines()[-1].split()[2:4] == ["--extra-index-url", index]
    assert "HTTP 404" in missing.stdout and "--extra-index-url" not in missing.stdout.splitlines()[-1]


def test_the_probe_gives_up_on_a_silent_index_at_its_timeout():
    sys.path.insert(0, str(REPO / "tools" / "upkeep"))
    import probe_index

    with socket.socket() as s:  # listens, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        start = time.monotonic()
        reason = probe_index.probe(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.5)
    assert reason is not None and "0.5 s" in reason and time.monotonic() - start < 5
    assert probe_index.probe("ftp://example.invalid") is not None
    with pytest.raises(ValueError, match="timeout"):
        probe_index.probe("http://127.0.0.1:1", timeout=0)


def test_setup_announces_each_step_and_the_torch_build():
    echoes = [ln for ln in _venv_commands("HAS_NVIDIA_GPU=") if ln.startswith("echo ")]
    assert [e.split("[", 1)[1][:3] for e in echoes if "set-up [" in e] == ["1/4", "2/4", "3/4", "4/4"]
    assert any("CPU build" in e and "MB" in e for e in echoes)
    assert any("several GB" in e for e in _venv_commands("HAS_NVIDIA_GPU=yes") if e.startswith("echo "))


def _sanitized(text: str) -> str:
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns((REPO / "tests" / "nbval_sanitize.cfg").read_text()):
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize("a, b", [
    ("<Figure size 640x480 with 1 Axes>", "<Figure size 1200x400 with 1 Axes>"),
    ("<specref.checks.toy.MarkovChain object at 0x7f3a2b1c0d90>", "<specref.checks.toy.MarkovChain object at 0x55d1e2f3a4b0>"),
    ("decode step: 12.3 ms, total 1.5 s", "decode step: 9.87 ms, total 2 s"),
    ("Wall time: 1.23 s", "Wall time: 980 ms"),
    ("100%|##########| 64/64 [00:02<00:00, 28.1it/s]", "100%|##########| 64/64 [00:05<00:00, 11.9it/s]"),
    ("model_id 0123456789abcdef0123456789abcdef", "model_id fedcba9876543210fedcba9876543210"),
])
def test_sanitizer_equalizes_output_that_varies_between_runs(a, b):
    assert _sanitized(a) == _sanitized(b)


@pytest.mark.parametrize("a, b", [
    ("tokens per step 3.36", "tokens per step 3.37"),
    ("k = 4 gives 2.8x", "k = 5 gives 2.8x"),
    ("beta = 0.7, residual = [1.0, 0.0, 0.0]", "beta = 0.6, residual = [1.0, 0.0, 0.0]"),
    ("<Figure size 640x480 with 1 Axes>", "<Figure size 640x480 with 2 Axes>"),
    ("accepted 17 of 20 drafts", "accepted 16 of 20 drafts"),
])
def test_sanitizer_keeps_the_results_notebooks_check(a, b):
    assert _sanitized(a) != _sanitized(b)


# -- python -m specref -----------------------------------------------------------------------
def test_readiness_report_passes_on_this_machine(tmp_path):
    """Run from an unrelated folder, so it proves the package is installed, not just on the path."""
    proc = subprocess.run([sys.executable, "-m", "specref"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("torch", "numpy", "scipy", "ipywidgets", "jupyterlab", "device", "widgets", "assets", "self-check"):
        assert re.search(rf"^  ok\s+{re.escape(line)}\s", proc.stdout, re.MULTILINE), proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("READY")


def test_self_check_passes_with_the_real_rule():
    check = doctor.self_check()
    assert check.status == OK, check.detail


def test_self_check_fails_when_the_rule_skips_the_residual(monkeypatch):
    monkeypatch.setattr(chain_verify, "verify_chain", montecarlo.verify_skip_residual)
    check = doctor.self_check()
    assert check.status == FAIL and "not exact" in check.detail


def test_self_check_fails_when_the_residual_is_wrong(monkeypatch):
    monkeypatch.setattr(rejection, "residual", lambda p, q: q)
    check = doctor.self_check()
    assert check.status == FAIL and "worked case" in check.detail


def test_exit_code_is_nonzero_iff_a_check_fails(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_python, doctor.self_check))
    assert doctor.main([]) == 0
    monkeypatch.setattr(chain_verify, "verify_chain", montecarlo.verify_always_accept)
    assert doctor.main([]) == 1
    assert "NOT READY: self-check failed" in capsys.readouterr().out


def test_a_crashing_check_is_a_failure_not_a_crash():
    def boom():
        raise RuntimeError("no")

    (check,) = doctor.run_checks([boom])
    assert check.status == FAIL and "RuntimeError" in check.detail


def test_device_line_names_a_cuda_gpu_when_there_is_one(monkeypatch):
    class Props:
        name, total_memory = "NVIDIA H200", 141 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    check = doctor.check_device()
    assert check.status == OK and "CUDA: NVIDIA H200, 141 GiB" in check.detail


def test_missing_widget_extension_fails(monkeypatch, tmp_path):
    import jupyter_core.paths

    monkeypatch.setattr(jupyter_core.paths, "jupyter_path", lambda *parts: [str(tmp_path)])
    check = doctor.check_widgets()
    assert check.status == FAIL and doctor.WIDGET_EXTENSION in check.detail


def tiny_pair(folder: Path, draft_vocab_delta: int = 0) -> None:
    """A loadable target/draft pair and tokenizer in the bundled layout, small enough to make in a second."""
    from specref.models.gpt2 import GPT2, GPT2Config
    from specref.models.pretrained import save_pretrained
    from specref.models.tokenizer import train_tokenizer

    tok = train_tokenizer(["def add(a, b):\n    return a + b\n" * 20], vocab_size=280)
    tok.tok.save(str(folder / "tokenizer.json"))
    for name, layers, delta in (("target", 2, 0), ("draft", 1, draft_vocab_delta)):
        cfg = GPT2Config(vocab_size=tok.vocab_size + delta, n_positions=32, n_embd=16, n_layer=layers, n_head=2,
                         bos_token_id=0, eos_token_id=0)
        save_pretrained(GPT2(cfg), folder / name)


def test_assets_check_passes_on_a_loadable_pair(monkeypatch, tmp_path):
    from specref.models import pair

    tiny_pair(tmp_path)
    monkeypatch.setattr(pair, "assets_dir", lambda: tmp_path)
    check = doctor.check_assets()
    assert check.status == OK, check.detail
    assert "target 2 layers x 16" in check.detail and "draft 1 layers x 16" in check.detail


def test_assets_check_fails_when_draft_and_target_vocabularies_differ(monkeypatch, tmp_path):
    from specref.models import pair

    tiny_pair(tmp_path, draft_vocab_delta=1)
    monkeypatch.setattr(pair, "assets_dir", lambda: tmp_path)
    assert doctor.check_assets().status == FAIL


def test_missing_assets_fail(monkeypatch, tmp_path):
    from specref.models import pair

    monkeypatch.setattr(pair, "assets_dir", lambda: tmp_path)
    check = doctor.check_assets()
    assert check.status == FAIL and "missing" in check.detail


def test_a_version_other_than_the_pin_warns_but_does_not_fail(tmp_path):
    pins = tmp_path / "pins.txt"
    pins.write_text(f"numpy==0.0.1\ntorch=={Version(torch.__version__).public}\n")
    by_name = {c.name: c for c in doctor.check_packages(pins)}
    assert by_name["numpy"].status == WARN and "tested with 0.0.1" in by_name["numpy"].detail
    assert by_name["torch"].status == OK


def test_an_unreadable_pin_file_warns_and_still_checks_every_package(tmp_path):
    pins = tmp_path / "pins.txt"
    pins.write_text("numpy>=1\n")
    checks = doctor.check_packages(pins)
    assert checks[0].name == "pins" and checks[0].status == WARN
    assert [c.name for c in checks[1:]] == list(doctor.PACKAGES)


def test_a_missing_package_fails(monkeypatch):
    monkeypatch.setattr(doctor, "PACKAGES", ("torch", "no_such_package_specref"))
    by_name = {c.name: c for c in doctor.check_packages(None)}
    assert by_name["torch"].status == OK and by_name["no_such_package_specref"].status == FAIL
