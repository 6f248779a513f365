# gpuspawner: the commands a newcomer needs. Run as root on Linux (the local
# swarm runs real dockerd daemons in network namespaces).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
WHEEL_VENV := .venv-wheel
LOWEST_VENV := .venv-lowest
STATE := $(CURDIR)/demo-state

.PHONY: deps test unit fuzz demo demo-down screenshots bench clean lint wheel-check test-lowest

# System packages (Debian) first (the venv needs python3-venv), then the Python
# environment. Safe to run again.
deps:
	@bash .ci/install-system-deps
	@$(MAKE) --no-print-directory $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "Installing gpuspawner and its test tools into $(VENV) (first time: a minute or two)"
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test,lint]'
	touch $@

# Every test: unit tests, then integration tests on a real three-node swarm.
test: deps
	$(PYTHON) -m pytest -ra tests

# Only the tests that need no docker.
unit: $(VENV)/.installed
	$(PYTHON) -m pytest -ra tests/unit

# ruff check, ruff format --check and mypy: the hooks of .pre-commit-config.yaml, on every tracked file.
lint: $(VENV)/.installed
	$(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

# The wheel, installed alone into a fresh venv and checked from outside the source tree
# (.ci/check_installed.py): what `pip install gpuspawner` gives a hub.
wheel-check:
	rm -rf dist $(WHEEL_VENV)
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip wheel -q --no-deps -w dist .
	$(WHEEL_VENV)/bin/python -m pip install -q dist/gpuspawner-*.whl
	$(WHEEL_VENV)/bin/python -m pip check
	cd "$$(mktemp -d)" && $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/.ci/check_installed.py $(CURDIR)

# The unit tests on the lowest versions setup.cfg allows: each dependency pinned to its
# floor (.ci/lowest-constraints.txt), the test tools as they come.
test-lowest:
	rm -rf $(LOWEST_VENV)
	$(PY) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOWEST_VENV)/bin/python -m pip install -q -r .ci/lowest-constraints.txt -e '.[test]'
	$(LOWEST_VENV)/bin/python -m pip check
	$(LOWEST_VENV)/bin/python -m pytest -ra -p no:cacheprovider tests/unit

# A real hub at http://127.0.0.1:8000 on a local three-node swarm with simulated GPUs,
# spawning real JupyterLab servers (DEMO_SERVER=standin: the fast busybox stand-in),
# GPUs reported by node agents over a fake NVML (DEMO_GPUS=static: from the file).
# Everything it builds is reused by the next run; demo-down stops and removes it all.
DEMO_SERVER ?= jupyter
DEMO_GPUS ?= agent
demo:
	@bash .ci/install-system-deps demo
	@$(MAKE) --no-print-directory $(VENV)/.installed
	$(PYTHON) -m devtools.demo --state-dir $(STATE) --server $(DEMO_SERVER) --gpus $(DEMO_GPUS)

demo-down: $(VENV)/.installed
	$(PYTHON) -m devtools.demo --state-dir $(STATE) --down

# The README's screenshots (docs/screenshots), taken by the browser tests.
screenshots: deps
	GPUSPAWNER_SCREENSHOT_DIR=$(CURDIR)/docs/screenshots $(PYTHON) -m pytest -ra tests/integration/test_browser.py tests/integration/test_access_swarm.py

bench: $(VENV)/.installed
	$(PYTHON) -m benchmarks.bench_allocator
	$(PYTHON) -m benchmarks.bench_agent
	$(PYTHON) -m benchmarks.bench_loop
	$(PYTHON) -m benchmarks.bench_shares

clean: demo-down
	rm -rf $(VENV) $(WHEEL_VENV) $(LOWEST_VENV) dist $(STATE) /var/cache/gpuspawner-image

# Every input surface fuzzed at length (the unit tests run a short subset).
fuzz: $(VENV)/.installed
	GPUSPAWNER_FUZZ=long $(PYTHON) -m pytest -ra -p no:cacheprovider --hypothesis-show-statistics --durations=0 tests/unit/test_fuzz.py
