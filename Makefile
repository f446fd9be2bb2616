# Two entry points, both safe on a fresh Debian 12 machine (they install what they need):
#   make demo   set up and run the main job on the example prompts (built-in simulator, no API key)
#   make test   set up and run the whole test suite (what CI runs)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORK ?= /tmp/raygen-ci
PYTEST_ARGS ?=

.PHONY: demo test test-fast setup system-deps engines lint bench

$(BIN)/raygen: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,docker,modal]"
	touch $(BIN)/raygen

setup: $(BIN)/raygen

demo: setup
	$(BIN)/raygen run examples/prompts.jsonl --run-name demo-$$(date +%Y%m%d-%H%M%S)

# Debian packages the tests use: bubblewrap (local sandbox), Docker engine and image tools.
system-deps:
	@command -v bwrap >/dev/null && command -v dockerd >/dev/null && command -v debootstrap >/dev/null && \
	  command -v chromium >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null && \
	  command -v npm >/dev/null || \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap docker.io containerd runc \
	     busybox-static debootstrap iproute2 util-linux chromium slurm-wlm munge nodejs npm >/dev/null)

# A private Docker engine, the locally built test images (no registry is reachable here) and the
# apptainer "HPC node" fixture (.ci/apptainer-setup.sh), and the agent harnesses the tests run as
# sessions, from PyPI (.ci/agents-setup.sh). Slurm: packages only; tests/cluster/test_slurm.py
# starts its daemons inside the tests' loopback-only network namespace with .ci/slurm-setup.sh (Slurm
# talks TCP, which does not cross network namespaces).
engines: system-deps
	eval "$$(.ci/docker-setup.sh $(WORK)/docker)" && .ci/build-test-images.sh && .ci/apptainer-setup.sh >/dev/null
	.ci/agents-setup.sh $(WORK)/agents >/dev/null
	.ci/slurm-setup.sh --install-only

lint: setup
	$(BIN)/ruff check raygen tests bench
	$(BIN)/ruff format --check raygen tests bench
	$(BIN)/mypy

# Tests that start Ray run in a loopback-only network namespace (Ray probes the network at start-up).
# The suite mostly waits (Ray start-up, containers, subprocess runs), so it runs in TEST_WORKERS processes;
# a test file stays on one worker (--dist loadfile), which keeps each file's shared fixtures (a Slurm
# controller, an S3 server) to itself.
TEST_WORKERS ?= 4
test: setup engines lint
	eval "$$(.ci/docker-setup.sh $(WORK)/docker)" && \
	RAYGEN_AGENTS_DIR=$(WORK)/agents unshare -n bash -c 'ip link set lo up && $(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)'

# The inner loop: every test that starts no Ray cluster, container, Slurm or Apptainer and is not marked
# slow (about 4 minutes on this machine). No root, no engines needed.
FAST_MARKERS := not ray and not docker and not singularity and not slurm and not multinode and not slow
test-fast: setup
	RAYGEN_AGENTS_DIR=$(WORK)/agents $(BIN)/python -m pytest -q -ra -n 2 -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

bench: setup
	unshare -n bash -c 'ip link set lo up && $(BIN)/python -m bench $(BENCH_ARGS)'
