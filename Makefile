# The two commands of README.md ("Quick start"). Each sets up what it needs, then runs:
#
#   make demo   .venv with qcompile; tune the default kernel for avx2 into the embedded SQLite
#               default (~/.cache/qcompile/tuning.sqlite, or $QCOMPILE_DB), build it into
#               kernels/, then load and run it (docs/examples/first_kernel.py)
#   make test   .venv with qcompile and its test tools; ruff, the import contract, python -m pytest
#
# Both can be run again: pip runs again only when setup.cfg or pyproject.toml changed (or the
# venv is new), and a second tune reuses the records of the first ("0 trials, reused").
# The set-up is README's install by hand, step for step:
#   python3 -m venv .venv && . .venv/bin/activate
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
#   pip install -e '.[test]'
#
# Variables (make VAR=value ...):
#   PYTHON       the interpreter that makes the venv (python3; 3.11 or later)
#   VENV         where the venv goes (.venv)
#   TORCH_INDEX  where torch comes from: PyTorch's CPU wheel index, since stock PyPI's Linux
#                torch brings several GB of CUDA libraries. Empty (TORCH_INDEX=) uses pip's own
#                configuration: what a GPU machine wants.
#   TARGET       the demo's target preset (avx2; `qcompile targets` lists them)
#   TRIALS       the demo's tuning budget (empty: qcompile's default, 64)
#   PYTEST_ARGS  for make test, e.g. PYTEST_ARGS='-m "not slow"' (the fast subset)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TARGET ?= avx2
TRIALS ?=
PYTEST_ARGS ?=

# Every recipe line runs with the venv active, as README's commands do (tests start `qcompile`).
ACTIVATE := . $(VENV)/bin/activate
BASE := $(VENV)/.installed
TEST := $(VENV)/.installed-test

.PHONY: demo test setup setup-test

demo: $(BASE)
	$(ACTIVATE) && qcompile tune --target $(TARGET) $(if $(TRIALS),--trials $(TRIALS))
	$(ACTIVATE) && qcompile build --target $(TARGET) --out kernels/
	$(ACTIVATE) && python docs/examples/first_kernel.py

test: $(TEST)
	$(ACTIVATE) && ruff check .
	@# The import contract (.importlinter; docs/architecture.md): packages point one way, and
	@# only qcompile/_tvm.py imports TVM.
	$(ACTIVATE) && lint-imports
	$(ACTIVATE) && python -m pytest $(PYTEST_ARGS)

setup: $(BASE)
setup-test: $(TEST)

$(BASE): setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(ACTIVATE) && python -m pip install -q --upgrade pip
	@# --retries 1: where the index cannot be reached (a machine with the wheel on disk), pip's
	@# default of 5 retries with back-off per dependency cost 80 s before it used the local wheel
	$(ACTIVATE) && pip install -q --retries 1 $(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(ACTIVATE) && pip install -q -e .
	touch $@

$(TEST): $(BASE)
	$(ACTIVATE) && pip install -q -e '.[test]'
	touch $@
