# specref: set-up, tests and the exercise tooling.
#
#   make lab      set up .venv (first time only) and open JupyterLab on notebooks/
#   make test     set up .venv (first time only) and run the whole suite
#
# Set-up needs only Python 3.10+ and make. Overrides:
#   PYTHON=python3.11                     interpreter that creates .venv
#   TORCH_INDEX=<url>                     an extra index to take torch from. Unset, it is chosen for
#                                         you: on Linux without an NVIDIA GPU, PyTorch's CPU index
#                                         (a 190 MB wheel instead of PyPI's CUDA build of several GB);
#                                         anywhere else, PyPI. TORCH_INDEX= (empty) forces PyPI.
#                                         An index that does not answer within 5 s is left out, with a
#                                         line that says so, and torch comes from PyPI instead.
#   LAB_ARGS="--port 8899 --no-browser"   extra arguments for `jupyter lab`
#   PYTEST_ARGS="-x -k accept"            extra arguments for pytest
#   TEST_WORKERS=1                        processes `make test` runs the suite in (pytest-xdist, a file
#                                         per worker). Unset: one per core, at most 4. 1 runs it serially.

PYTHON ?= python3
VENV ?= .venv
LAB_ARGS ?=
PYTEST_ARGS ?=
CELL_TIMEOUT ?= 180
# One worker per core, at most 4: every test and notebook kernel uses one torch thread, and each
# worker loads its own models and starts its own kernels, so every worker costs memory.
TEST_WORKERS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)
# --dist loadfile keeps a file on one worker: a notebook's cells run in order in one kernel.
XDIST := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# Which torch build to install. PyPI's Linux torch is a CUDA build (several GB with its NVIDIA
# libraries); a laptop without an NVIDIA GPU needs only the CPU build. macOS wheels are CPU-only.
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
HAS_NVIDIA_GPU := $(shell { nvidia-smi -L >/dev/null 2>&1 || test -e /proc/driver/nvidia/version; } && echo yes)
ifeq ($(origin TORCH_INDEX),undefined)
  ifeq ($(shell uname -s)-$(HAS_NVIDIA_GPU),Linux-)
    TORCH_INDEX := $(CPU_TORCH_INDEX)
  else
    TORCH_INDEX :=
  endif
endif
TORCH_PIN := $(shell sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements/base.txt)
NO_INDEX_BUILD := PyPI or pip's own configured index (on Linux PyPI's build is a CUDA build: several GB)
TORCH_BUILD := $(if $(filter $(CPU_TORCH_INDEX),$(TORCH_INDEX)),the CPU build (a download of about 190 MB; 0.8 GB installed),$(if $(TORCH_INDEX),from $(TORCH_INDEX),PyPI's default build (on Linux a CUDA build: several GB)))

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.specref-installed
PIN_FILES := requirements/base.txt requirements/test.txt requirements/lock.txt
PIP_INSTALL := $(VPY) -m pip install --disable-pip-version-check --progress-bar on
# Jupyter refuses to start as root unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
# Folders of notebooks that run under strict nbval (a fresh clone has only non-empty ones).
NB_DIRS := $(wildcard notebooks solutions)
NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg

.DEFAULT_GOAL := help
.PHONY: help venv lab test test-portable test-fast doctor exercises check-exercises lint grade grade-all grade-merge release execute fresh-clone clean distclean

help:
	@echo "make lab                  set up .venv if needed and open JupyterLab on notebooks/"
	@echo "make test                 set up .venv if needed and run the whole test suite"
	@echo "make test-portable        rerun the unit tests and notebooks as other CPUs would round (CI runs it)"
	@echo "make doctor               readiness report (python -m specref)"
	@echo "make exercises            regenerate exercises/ from solutions/"
	@echo "make grade NB=exercises/ex02_accept_reject.ipynb   grade one notebook (SOLUTION=... to name its solution, SEED=N|random for other hidden cases, UNJAILED=1 where no jail can be made)"
	@echo "make grade-all DIR=submissions/ [JOBS=N] [CSV=gradebook.csv] [SEED=N|random] [FRESH=1] [UNJAILED=1]  grade a class in parallel (resumes; outputs in DIR-grading/ unless CSV= names the gradebook)"
	@echo "make grade-merge DIR=submissions/ [CSV=gradebook.csv]  merge the hand-grading sheets' marks into the gradebook"
	@echo "make release DIR=../class/ [GRADED=ex02,ex05]  a folder to hand a class: notebooks, exercises, the package; no solutions, rubrics or grader; GRADED exercises' answer keys left out"
	@echo "make execute              re-run notebooks/ and solutions/ in place, then make exercises"
	@echo "make venv                 only the set-up"
	@echo "make fresh-clone          clone HEAD to a temporary folder and check that set-up works there"

venv: $(STAMP)

# The stamp makes set-up idempotent: it reruns only when a pin file or pyproject.toml changes.
# Step 2 probes the torch index once (tools/upkeep/probe_index.py) instead of letting pip retry it per package.
$(STAMP): $(PIN_FILES) pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
		{ echo "specref needs Python 3.10 or newer; '$(PYTHON)' is older (set PYTHON=...)"; exit 1; }
	@echo "specref set-up [1/4]: a virtual environment in $(VENV)"
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@echo "specref set-up [2/4]: torch $(TORCH_PIN), $(TORCH_BUILD) (override: TORCH_INDEX=..., see the Makefile's head)"
	index='$(TORCH_INDEX)'; \
	if [ -n "$$index" ] && ! why=$$($(VPY) tools/upkeep/probe_index.py "$$index" 2>&1); then \
		echo "specref set-up [2/4]: $$why; going on without it: torch from $(NO_INDEX_BUILD)"; index=; fi; \
	$(PIP_INSTALL) $${index:+--extra-index-url "$$index"} "torch==$(TORCH_PIN)" -c requirements/lock.txt
	@echo "specref set-up [3/4]: JupyterLab, numpy, scipy, matplotlib, the test tools (about 1 GB installed)"
	$(PIP_INSTALL) -r requirements/test.txt -c requirements/lock.txt
	@echo "specref set-up [4/4]: specref itself, then a consistency check"
	$(PIP_INSTALL) --no-deps -e .
	$(VPY) -m pip check
	touch $@
	@echo "specref set-up: done. Next: make lab (the course) or make test (the suite)."

lab: venv
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks $(ROOT_FLAG) $(LAB_ARGS)

# The linter (ruff, rules in pyproject.toml), then one pytest run: unit tests, exercise sync + grading self-check, browser tests and every
# notebook in notebooks/ and solutions/ under strict nbval, spread over TEST_WORKERS processes.
# The fresh-clone check installs a second environment (minutes), so it has its own target,
# which .ci/run calls.
test: venv
	$(VPY) -m ruff check
	$(VPY) -m pytest tests $(NB_DIRS) $(NBVAL) -m "not fresh_clone" $(XDIST) $(PYTEST_ARGS)

# The unit tests and the checked notebooks again, under environments that make this CPU round like
# another one: torch's MKL and ATen kernels, numpy's and scipy's OpenBLAS kernels, thread counts
# (tools/upkeep/portable.py). Half an hour on 2 cores: CI runs it after `make test`.
test-portable: venv
	$(VPY) tools/upkeep/portable.py -- $(NB_DIRS) $(NBVAL) $(PYTEST_ARGS)

# Everything but the slow checks (fresh clone, grading self-check, notebooks): a quick loop.
test-fast: venv
	$(VPY) -m pytest tests -m "not slow and not fresh_clone and not browser" $(XDIST) $(PYTEST_ARGS)

doctor: venv
	$(VPY) -m specref

exercises: venv
	$(VPY) -m specref_grading.exercises

check-exercises: venv
	$(VPY) -m specref_grading.exercises --check

# What every committed notebook must look like (title, goals, summary, seeds, no errors or machine
# paths) and no development history in what a learner reads; `make test` checks both too.
lint: venv
	$(VPY) -m ruff check
	$(VPY) tools/upkeep/lint_notebooks.py
	$(VPY) tools/upkeep/learner_text.py

NB ?=
# File names never reach a shell or make's own expansion: $(value X) is the text as given, put in
# single quotes with every ' escaped; unexport keeps make from expanding them into the environment.
unexport NB DIR CSV SOLUTION SEED
_grade_q = '$(subst ','\'',$(value $(1)))'
grade: venv
	@test -n $(call _grade_q,NB) || { echo "usage: make grade NB=path/to/notebook.ipynb [SOLUTION=solutions/<name>.ipynb] [SEED=N|random]"; exit 2; }
	$(VPY) -I -m specref_grading.grade --solutions-dir '$(CURDIR)/solutions' $(if $(value SOLUTION),--solution $(call _grade_q,SOLUTION)) $(if $(value SEED),--seed $(call _grade_q,SEED)) $(if $(filter 1,$(UNJAILED)),--unjailed) -- $(call _grade_q,NB)

grade-all: venv
	@test -n $(call _grade_q,DIR) || { echo "usage: make grade-all DIR=submissions/ [JOBS=N] [CSV=gradebook.csv] [SEED=N|random] [FRESH=1] [UNJAILED=1]"; exit 2; }
	$(VPY) -I -m specref_grading.classrun grade --solutions-dir '$(CURDIR)/solutions' $(if $(value JOBS),--jobs $(call _grade_q,JOBS)) $(if $(value CSV),--csv $(call _grade_q,CSV)) $(if $(value SEED),--seed $(call _grade_q,SEED)) $(if $(filter 1,$(FRESH)),--fresh) $(if $(filter 1,$(UNJAILED)),--unjailed) -- $(call _grade_q,DIR)

grade-merge: venv
	@test -n $(call _grade_q,DIR) || { echo "usage: make grade-merge DIR=submissions/ [CSV=gradebook.csv]"; exit 2; }
	$(VPY) -I -m specref_grading.classrun merge $(if $(value CSV),--csv $(call _grade_q,CSV)) -- $(call _grade_q,DIR)

release: venv
	@test -n $(call _grade_q,DIR) || { echo "usage: make release DIR=<a new or empty folder outside the repository> [GRADED=ex02,ex05]"; exit 2; }
	$(VPY) -I -m specref_grading.release --root '$(CURDIR)' $(if $(value GRADED),--graded $(call _grade_q,GRADED)) -- $(call _grade_q,DIR)

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
