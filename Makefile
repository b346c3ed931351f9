# The two commands a newcomer runs: `make demo` and `make test`.
# Both set up .venv on first use (Python >= 3.10) and reinstall when
# pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs dist bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "cudagraphs needs Python >= 3.10, found " + sys.version.split()[0] + "; run make PYTHON=python3.12 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $@

demo: $(STAMP)
	$(BIN)/python -m cudagraphs demo

# the suite twice: as built by `pip install -e .` (the modules Cython compiles, the C part), then
# the same source as plain Python (a copy without compiled files, first on PYTHONPATH): what runs
# where no compiler is, and every Python path the C part stands in front of (docs/architecture.md).
# Each run in TEST_WORKERS processes (pytest-xdist; a test file stays in one process: some files
# sum up what their tests did)
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
# Test files the plain run leaves out: those whose outcome cannot differ from the first run's.
# tests/test_docs.py runs each block of the docs in a fresh interpreter on PYTHONPATH=src, the
# built tree whichever run it is in, and otherwise only reads the docs: the same work twice.
PLAIN_SKIP := tests/test_docs.py
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(PYTEST)
	PYTHONPATH=$$($(BIN)/python scripts/plain_tree.py .plain) CUDAGRAPHS_EXPECT_PLAIN=1 \
	  $(PYTEST) -p no:cacheprovider $(addprefix --ignore=,$(PLAIN_SKIP))

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

dist: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[release]"
	rm -rf dist
	$(BIN)/python -m build
	$(BIN)/python -m twine check dist/*

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .plain .pytest_cache .mypy_cache .ruff_cache build dist site src/*.egg-info
