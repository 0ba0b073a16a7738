# The two commands: `make run` (the product) and `make test` (lint, then the suite; .ci/run calls it).
# For a developer's loop: `make lint` (ruff + import contracts, seconds) and `make test-fast` (no slow tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint bench-smoke clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/altune db upgrade
	$(VENV)/bin/altune serve

# two pytest processes (pytest-xdist): each test still has its own database (tests/conftest.py), and most of a
# test's time is a child process, a build or a tune, so two cores run the suite in about 13 minutes, not 20
TEST_WORKERS ?= 2

# ruff (the rules in pyproject.toml's [tool.ruff.lint]) and import-linter (the contracts in [tool.importlinter])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	sh scripts/install-chromium.sh
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal --durations=25

# the suite without the tests marked slow (pyproject.toml's markers: tunes, builds a whole model, starts the server)
test-fast: lint
	sh scripts/install-chromium.sh
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal -m "not slow"

bench-smoke: $(STAMP)
	$(PY) -m bench.ops --suite smoke

clean:
	rm -rf $(VENV) var
