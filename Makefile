# Two entry points, both safe on a fresh Debian 12 machine (they install what they need):
#   make demo   set up and run the main job on the example prompts (built-in simulator, no API key)
#   make test   set up and run the whole test suite (what CI runs)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORK ?= /tmp/raygen-ci
PYTEST_ARGS ?=

.PHONY: demo test setup system-deps engines lint bench

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
	  command -v chromium >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null || \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap docker.io containerd runc \
	     busybox-static debootstrap iproute2 util-linux chromium slurm-wlm munge >/dev/null)

# A private Docker engine, the locally built test images (no registry is reachable here) and the
# apptainer "HPC node" fixture (.ci/apptainer-setup.sh). Slurm: packages only; tests/cluster/test_slurm.py
# starts its daemons inside the tests' loopback-only network namespace with .ci/slurm-setup.sh (Slurm
# talks TCP, which does not cross network namespaces).
engines: system-deps
	eval "$$(.ci/docker-setup.sh $(WORK)/docker)" && .ci/build-test-images.sh && .ci/apptainer-setup.sh >/dev/null
	.ci/slurm-setup.sh --install-only

lint: setup
	$(BIN)/ruff check raygen tests bench
	$(BIN)/ruff format --check raygen tests bench

# Tests that start Ray run in a loopback-only network namespace (Ray probes the network at start-up).
test: setup engines lint
	eval "$$(.ci/docker-setup.sh $(WORK)/docker)" && \
	unshare -n bash -c 'ip link set lo up && $(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)'

bench: setup
	unshare -n bash -c 'ip link set lo up && $(BIN)/python -m bench $(BENCH_ARGS)'
