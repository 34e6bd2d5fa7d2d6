# The two commands of the README: `make sweep` and `make test`. Everything is installed here.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE := disabled

.PHONY: install browser test sweep bench clean

install: $(STAMP)

# torch and torchvision first, pinned, so pip takes the builds this machine keeps on disk.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -e ".[test]"
	touch $(STAMP)

# Headless Chromium (Debian's package) opens report.html in the tests; CI runs as root.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

# The suite runs in portable numerics (the same bits on every AVX2 x86-64 CPU). The second line
# is the guard that its verdict tests assert verdicts, not one float path's trajectory: the
# findings' reduced claims again, natively, on ATen's default kernels (another CPU's float path).
test: install browser
	$(PY) -m pytest
	ROBUSTTUNE_NUMERICS=native ATEN_CPU_CAPABILITY=default $(PY) -m pytest tests/test_findings.py -k claim

# the quickstart, then its report: accuracy by method and attack, where FedAvg breaks
sweep: install
	$(VENV)/bin/robusttune sweep search_spaces/quickstart.yaml
	$(VENV)/bin/robusttune report results/quickstart

bench: install
	$(PY) bench/training.py --quick
	$(PY) bench/aggregators.py --quick

clean:
	rm -rf $(VENV) .pytest_cache
