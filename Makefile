# The two commands: `make run` (the product) and `make test` (the suite; .ci/run calls it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench-smoke clean

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

test: $(STAMP)
	sh scripts/install-chromium.sh
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal --durations=25

bench-smoke: $(STAMP)
	$(PY) -m bench.ops --suite smoke

clean:
	rm -rf $(VENV) var
