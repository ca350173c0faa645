# The README's two commands: `make demo` (quick study on real MNIST, ending in a report) and
# `make test` (the test suite). Both create and reuse a local virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch first, pinned: on the development machines this is the CPU build on local disk; the
# project itself accepts any torch in the range declared in pyproject.toml.
TORCH_SPEC ?= torch==2.13.0
RUNS ?= runs
WORKERS ?= 2

.PHONY: demo test lint bench clean-venv

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[audit,plot]"
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -e ".[dev,audit,plot,wandb,tensorboard,ray,slurm,browser]"
	bash scripts/install-browser.sh
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/fathom data fetch mnist
	$(VENV)/bin/fathom study run ciresan-sd-quick --runs-dir $(RUNS) --workers $(WORKERS)
	$(VENV)/bin/fathom audit $(RUNS)/ciresan-sd-quick --checkpoint both
	$(VENV)/bin/fathom report $(RUNS)/ciresan-sd-quick

test: $(VENV)/.dev
	$(VENV)/bin/python -m pytest

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean-venv:
	rm -rf $(VENV)
