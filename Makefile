# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast bench lint clean

install: $(STAMP)

# torch first and pinned: it takes the CPU build from this machine's disk instead of a CUDA build.
$(STAMP): pyproject.toml requirements-nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/whetstone run "What is 17 * 23? Use the calculator."

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Unit tests only: no real model weights.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache build *.egg-info
