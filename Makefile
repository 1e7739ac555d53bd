# specref: set-up, tests and the exercise tooling.
#
#   make lab      set up .venv (first time only) and open JupyterLab on notebooks/
#   make test     set up .venv (first time only) and run the whole suite
#
# Set-up needs only Python 3.10+ and make. Overrides:
#   PYTHON=python3.11                     interpreter that creates .venv
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu
#                                         where to look for torch as well (the CPU build
#                                         instead of PyPI's multi-GB CUDA build)
#   LAB_ARGS="--port 8899 --no-browser"   extra arguments for `jupyter lab`
#   PYTEST_ARGS="-x -k accept"            extra arguments for pytest

PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
LAB_ARGS ?=
PYTEST_ARGS ?=
CELL_TIMEOUT ?= 180

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.specref-installed
PIN_FILES := requirements/base.txt requirements/test.txt requirements/lock.txt
PIP_INSTALL := $(VPY) -m pip install --disable-pip-version-check $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
# Jupyter refuses to start as root unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
# Folders of notebooks that run under strict nbval (a fresh clone has only non-empty ones).
NB_DIRS := $(wildcard notebooks solutions)
NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg

.DEFAULT_GOAL := help
.PHONY: help venv lab test test-fast doctor exercises check-exercises grade execute fresh-clone clean distclean

help:
	@echo "make lab                  set up .venv if needed and open JupyterLab on notebooks/"
	@echo "make test                 set up .venv if needed and run the whole test suite"
	@echo "make doctor               readiness report (python -m specref)"
	@echo "make exercises            regenerate exercises/ from solutions/"
	@echo "make grade NB=exercises/ex02_accept_reject.ipynb   grade one notebook"
	@echo "make execute              re-run notebooks/ and solutions/ in place, then make exercises"
	@echo "make venv                 only the set-up"
	@echo "make fresh-clone          clone HEAD to a temporary folder and check that set-up works there"

venv: $(STAMP)

# The stamp makes set-up idempotent: it reruns only when a pin file or pyproject.toml changes.
$(STAMP): $(PIN_FILES) pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
		{ echo "specref needs Python 3.10 or newer; '$(PYTHON)' is older (set PYTHON=...)"; exit 1; }
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -r requirements/test.txt -c requirements/lock.txt
	$(PIP_INSTALL) --no-deps -e .
	$(VPY) -m pip check
	touch $@

lab: venv
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks $(ROOT_FLAG) $(LAB_ARGS)

# One pytest run: unit tests, exercise sync + grading self-check, browser tests and every
# notebook in notebooks/ and solutions/ under strict nbval. The fresh-clone check installs
# a second environment (minutes), so it has its own target, which .ci/run calls.
test: venv
	$(VPY) -m pytest tests $(NB_DIRS) $(NBVAL) -m "not fresh_clone" $(PYTEST_ARGS)

# Everything but the slow checks (fresh clone, grading self-check, notebooks): a quick loop.
test-fast: venv
	$(VPY) -m pytest tests -m "not slow and not fresh_clone and not browser" $(PYTEST_ARGS)

doctor: venv
	$(VPY) -m specref

exercises: venv
	$(VPY) tools/make_exercises.py

check-exercises: venv
	$(VPY) tools/make_exercises.py --check

NB ?=
grade: venv
	@test -n "$(NB)" || { echo "usage: make grade NB=exercises/<name>.ipynb"; exit 2; }
	$(VPY) tools/grade.py "$(NB)"

execute: venv
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=$(CELL_TIMEOUT) --ExecutePreprocessor.kernel_name=python3 \
		--ExecutePreprocessor.record_timing=False \
		$(wildcard notebooks/*.ipynb solutions/*.ipynb)
	$(MAKE) exercises

# Clone the committed HEAD into a temporary folder and run the README's set-up there.
fresh-clone: venv
	$(VPY) -m pytest tests/test_fresh_clone.py -m fresh_clone $(PYTEST_ARGS)

clean:
	rm -rf .pytest_cache .hypothesis build *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
