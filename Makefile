# gpuspawner: the commands a newcomer needs. Run as root on Linux (the local
# swarm runs real dockerd daemons in network namespaces).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STATE := $(CURDIR)/demo-state

.PHONY: deps test unit demo demo-down bench clean

# System packages (Debian) and the Python environment. Safe to run again.
deps: $(VENV)/.installed
	@bash .ci/install-system-deps

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

# Every test: unit tests, then integration tests on a real three-node swarm.
test: deps
	$(PYTHON) -m pytest -ra tests

# Only the tests that need no docker.
unit: $(VENV)/.installed
	$(PYTHON) -m pytest -ra tests/unit

# A real hub at http://127.0.0.1:8000 on a local three-node swarm with simulated GPUs.
demo: deps
	$(PYTHON) -m tests.harness.demo --state-dir $(STATE)

demo-down: $(VENV)/.installed
	$(PYTHON) -m tests.harness.demo --state-dir $(STATE) --down

bench: $(VENV)/.installed
	$(PYTHON) -m benchmarks.bench_allocator
	$(PYTHON) -m benchmarks.bench_agent

clean: demo-down
	rm -rf $(VENV) $(STATE)
