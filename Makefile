# swarm — every target sets up what it needs on a fresh machine (Python >= 3.11, make, apt).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-dev

.PHONY: all venv demo test test-fast lint bench experiments chaos chaos-smoke clean sysdeps

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "swarm needs Python >= 3.11"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  echo "python venv module missing; installing python3-venv"; \
	  apt-get install -y python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

venv: $(STAMP)

# System packages the namespace/cgroup/systemd tests use; best effort when not root.
sysdeps:
	@bash .ci/sysdeps.sh

demo: $(STAMP)
	$(PY) -m swarm.demo

test: $(STAMP) sysdeps
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check swarm tests bench chaos
	$(VENV)/bin/ruff format --check swarm tests bench chaos
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/submit.py

experiments: $(STAMP)
	$(PY) -m swarm.cli sim all --out docs/experiments --doc docs/experiments.md

# The chaos suite (docs/chaos.md): real agents in network namespaces (root; loopback
# otherwise) under kills, pauses, partitions, loss; ~11 minutes. Writes
# chaos/reports/<time>/report.{md,json} and the figures in docs/chaos.md.
chaos: $(STAMP) sysdeps
	$(PY) -m chaos.run --suite full --docs docs/chaos.md

# A short seeded subset (~40 s); `make test` runs it too (tests/integration/test_chaos_smoke.py).
chaos-smoke: $(STAMP) sysdeps
	$(PY) -m chaos.run --suite smoke

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
