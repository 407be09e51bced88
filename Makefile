# `make demo` runs the main job, `make test` the test suite; each creates .venv and installs what it needs.
# GPU users: `make demo TORCH_SPEC="torch>=2.6"` (or any pip requirement) instead of the CPU wheel pinned here.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# the exact package versions the published results were made with (README, Reproducibility); CONSTRAINTS= for the newest
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
# the stamp names the torch requirement: another TORCH_SPEC reinstalls torch in an existing .venv (.torch-spec
# records the one installed)
STAMP := $(VENV)/.keepsight-installed-$(shell printf '%s' '$(TORCH_SPEC)' | cksum | cut -d' ' -f1)
DEMO_ARGS ?=
TEST_ARGS ?=
# lmms-eval needs torchvision, so it gets its own venv (the CUDA torch wheels: several GB)
LMMS_VENV ?= .venv-lmms
LMMS_TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
LMMS_PY := $(LMMS_VENV)/bin/python
LMMS_STAMP := $(LMMS_VENV)/.keepsight-installed

.PHONY: install demo smoke reproduce test test-all test-lmms lint survey clean

$(STAMP): pyproject.toml Makefile constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	test "$$(cat $(VENV)/.torch-spec 2>/dev/null)" = '$(TORCH_SPEC)' || { $(PY) -m pip install --quiet --force-reinstall "$(TORCH_SPEC)" && printf '%s' '$(TORCH_SPEC)' > $(VENV)/.torch-spec; }
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[train,dev]"
	rm -f $(VENV)/.keepsight-installed*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/keepsight demo $(DEMO_ARGS)

smoke: $(STAMP)
	$(VENV)/bin/keepsight demo --smoke $(DEMO_ARGS)

# the default profile from nothing in a temporary directory, compared number by number with docs/results/full.md
reproduce: $(STAMP)
	$(VENV)/bin/keepsight demo --reproduce $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(TEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow" $(TEST_ARGS)

$(LMMS_STAMP): pyproject.toml Makefile
	test -x $(LMMS_PY) || $(PYTHON) -m venv $(LMMS_VENV)
	$(LMMS_PY) -m pip install --quiet --upgrade pip
	$(LMMS_PY) -m pip install --quiet $(LMMS_TORCH_SPEC)
	$(LMMS_PY) -m pip install --quiet -e ".[train,dev,lmms]"
	touch $(LMMS_STAMP)

# keepsight inside lmms-eval's own evaluator (tests/lmms; `make test` does not collect it)
test-lmms: $(LMMS_STAMP)
	$(LMMS_PY) -m pytest -q tests/lmms $(TEST_ARGS)

# the bad-input survey: every case must end in a clear error (or succeed where success is right)
survey: $(STAMP)
	$(PY) scripts/bad_inputs.py --strict --out runs/bench/bad_inputs.json

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) runs .pytest_cache
