# `make demo` runs the main job, `make test` the test suite; each creates .venv and installs what it needs.
# GPU users: `make demo TORCH_SPEC="torch>=2.6"` (or any pip requirement) instead of the CPU wheel pinned here.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.keepsight-installed
DEMO_ARGS ?=
TEST_ARGS ?=

.PHONY: install demo smoke test test-all lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[train,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/keepsight demo $(DEMO_ARGS)

smoke: $(STAMP)
	$(VENV)/bin/keepsight demo --smoke $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(TEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow" $(TEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) runs .pytest_cache
