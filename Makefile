# gpuspawner: the commands a newcomer needs. Run as root on Linux (the local
# swarm runs real dockerd daemons in network namespaces).
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
WHEEL_VENV := .venv-wheel
STATE := $(CURDIR)/demo-state

.PHONY: deps test unit explore fuzz demo demo-down screenshots bench clean lint wheel-check labextension docs

# System packages (Debian) first (the venv needs python3-venv), then the Python
# environment. Safe to run again.
deps:
	@bash .ci/install-system-deps
	@$(MAKE) --no-print-directory $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "Installing gpuspawner and its test tools into $(VENV) (first time: a minute or two)"
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test,lint,lab,docs]'
	touch $@

# Every test: the unit tests (one worker per CPU), then the integration tests on a real
# three-node swarm (one at a time: they share the swarm; the slowest are listed) with the
# long explorations of interleavings (`make explore`) beside them at the lowest CPU
# priority (the integration tests mostly wait on the swarm); the explorations' output
# follows. Each runs even when one before failed; it fails when any does. The explorations
# run in a session of their own whose scheduling group is niced too (Linux's autogroup):
# nice alone ranks a process only within its session, and the swarm's daemons and
# containers run in sessions of their own.
test: deps
	$(PYTHON) -m pytest -ra -n auto -m "not explore" tests/unit; unit=$$?; \
	log=$$(mktemp); setsid -w sh -c 'echo 19 2>/dev/null > /proc/self/autogroup; exec nice -n 19 "$$@"' \
	  sh $(MAKE) --no-print-directory explore > "$$log" 2>&1 & beside=$$!; \
	trap 'kill -- -$$beside 2>/dev/null' INT TERM HUP; \
	$(PYTHON) -m pytest -ra --durations=15 tests/integration; integration=$$?; \
	wait $$beside; explore=$$?; cat "$$log"; rm -f "$$log"; \
	exit $$((unit || integration || explore))

# The tests that need no docker, less the long explorations of interleavings, one worker
# per CPU (2 to 3 minutes on two cores); `make explore` runs those alone, and
# `make test` runs everything.
unit: $(VENV)/.installed
	$(PYTHON) -m pytest -ra -n auto -m "not explore" tests/unit

# EXPLORE_SCALE=N samples N times as many schedules (the first ones unchanged): CI runs
# the bounded number, a long exploration by hand as many more as it likes. Each
# exploration is deterministic and needs no docker, so they run side by side (pytest-xdist).
explore: $(VENV)/.installed
	GPUSPAWNER_EXPLORE_SCALE=$(or $(EXPLORE_SCALE),1) $(PYTHON) -m pytest -ra --durations=8 -n auto -m explore tests/unit

# ruff check, ruff format --check and mypy: the hooks of .pre-commit-config.yaml, on every tracked file.
lint: $(VENV)/.installed
	$(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

# The documentation site in docs/_build/html (Sphinx, MyST, pydata-sphinx-theme; offline:
# no inventories fetched), warnings as errors, then every internal link of the built HTML
# checked (devtools/doclinks.py). Open docs/_build/html/index.html.
docs: $(VENV)/.installed
	rm -rf docs/_build
	$(PYTHON) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
	$(PYTHON) -m devtools.doclinks docs/_build/html

# The release as users install it, on the lowest versions setup.cfg allows: `python -m build`
# makes the sdist and the wheel (.ci/check_dist.py: the version, templates, migrations and
# CHANGELOG in both); the wheel, installed alone into a fresh venv with each dependency pinned
# to its floor (.ci/lowest-constraints.txt) and the test tools as they come, is checked from
# outside the source tree (.ci/check_installed.py), then the unit tests run against it, less
# the long explorations of interleavings (.ci/unit_installed.py). `make test` runs them again from the tree, on the newest versions.
# (The JupyterLab extension's server half runs in the single-user image, on JupyterLab's
# own floors, not gpuspawner's: its tests run in `make test`.)
wheel-check:
	rm -rf dist $(WHEEL_VENV)
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip build
	$(WHEEL_VENV)/bin/python -m build --sdist --wheel --outdir dist .
	$(WHEEL_VENV)/bin/python .ci/check_dist.py dist $(CURDIR)
	$(WHEEL_VENV)/bin/python -m pip install -q -r .ci/lowest-constraints.txt "$$(ls dist/gpuspawner-*.whl)[test]"
	$(WHEEL_VENV)/bin/python -m pip check
	cd "$$(mktemp -d)" && $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/.ci/check_installed.py $(CURDIR)
	$(WHEEL_VENV)/bin/python .ci/unit_installed.py $(CURDIR)

# A real hub at http://127.0.0.1:8000 on a local three-node swarm with simulated GPUs,
# spawning real JupyterLab servers (DEMO_SERVER=standin: the fast busybox stand-in),
# GPUs reported by node agents over a fake NVML (DEMO_GPUS=static: from the file).
# Everything it builds is reused by the next run; demo-down stops and removes it all.
# DEMO_MODE=stack: examples/stack/stack.yml instead, the hub as a swarm service
# (devtools/stack.py; `python -m devtools.stack down` removes it).
DEMO_MODE ?= hub
DEMO_SERVER ?= jupyter
DEMO_GPUS ?= agent
demo:
	@bash .ci/install-system-deps demo
	@$(MAKE) --no-print-directory $(VENV)/.installed
ifeq ($(DEMO_MODE),stack)
	$(PYTHON) -m devtools.stack up
else
	$(PYTHON) -m devtools.demo --state-dir $(STATE) --server $(DEMO_SERVER) --gpus $(DEMO_GPUS)
endif

demo-down: $(VENV)/.installed
	$(PYTHON) -m devtools.demo --state-dir $(STATE) --down

# The README's screenshots (docs/screenshots), taken by the browser tests.
screenshots: deps
	GPUSPAWNER_SCREENSHOT_DIR=$(CURDIR)/docs/screenshots $(PYTHON) -m pytest -ra tests/integration/test_browser.py tests/integration/test_access_swarm.py tests/integration/test_line_swarm.py tests/integration/test_jupyterlab_status.py

bench: $(VENV)/.installed
	$(PYTHON) -m benchmarks.bench_allocator
	$(PYTHON) -m benchmarks.bench_agent
	$(PYTHON) -m benchmarks.bench_loop
	$(PYTHON) -m benchmarks.bench_shares

clean: demo-down
	rm -rf $(VENV) $(WHEEL_VENV) dist $(STATE) stack-state /var/cache/gpuspawner-image

# Every input surface fuzzed at length (the unit tests run a short subset).
fuzz: $(VENV)/.installed
	GPUSPAWNER_FUZZ=long $(PYTHON) -m pytest -ra -p no:cacheprovider --hypothesis-show-statistics --durations=0 tests/unit/test_fuzz.py

# gpuspawner's JupyterLab extension as a wheel in dist/ (npm, JupyterLab's builder; the
# single-user image of the demo and the tests installs it).
labextension: $(VENV)/.installed
	$(PYTHON) -m devtools.labext
