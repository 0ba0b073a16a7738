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

test: $(STAMP)
	sh scripts/install-chromium.sh
	$(PY) -m pytest -q -ra --durations=25

bench-smoke: $(STAMP)
	$(PY) -m bench.ops --suite smoke

clean:
	rm -rf $(VENV) var
