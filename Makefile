# swarm — every target sets up what it needs on a fresh machine (Python >= 3.11, make, apt).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-dev
# Byte-compile before running: where PYTHONDONTWRITEBYTECODE is set (as on CI) every
# agent and CLI process would otherwise compile swarm from source (~0.2 s per agent).
BYTECODE = $(PY) -m compileall -q swarm chaos >/dev/null

.PHONY: all venv demo test test-fast fuzz lint bench bench-gossip experiments chaos chaos-smoke clean sysdeps

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
	@$(BYTECODE)
	$(PY) -m swarm.demo

# Three pytest processes at once, each report printed in turn: the unit tests then the
# security ones (CPU-bound, then ~1 min of agents: ~8.5 min), the chaos-harness and
# elastic-pool tests then the single-agent, executor and systemd ones (agents in
# network namespaces or on loopback, mostly waiting: ~8.5 min), and the rest of the
# integration tests (~9 min; with the security tests 11 min at stop 39, the long
# pole). Wall 9:11 at stop 40. The placement and migration tests stay in the last lane: in a fourth lane of
# their own, or after the chaos harness, their load-driven decisions came too late
# (stops 38 and 39).
SLOW_TESTS = tests/integration/test_chaos_*.py tests/integration/test_elastic.py \
	$(addprefix tests/integration/test_,$(addsuffix .py,single_agent executor executor_races \
	outlive_agent systemd_files systemd_nspawn systemd_signals journal_sync net discovery))
# A failure's own lines (its test, the assertion's "E" lines) printed again last: a
# CI log shown by its head and tail keeps them (stop 45: a long traceback in the
# middle lane was cut, and with it what failed).
FAIL_LINES = '^(FAILED|ERROR) |^_{3,} .* _{3,}$$|^E  '
# each lane names its slowest tests, so that whoever rebalances the lanes has figures
DURATIONS = --durations=12 --durations-min=5
test: $(STAMP) sysdeps
	@$(BYTECODE)
	@unit_log=$$(mktemp); slow_log=$$(mktemp); rest_log=$$(mktemp); \
	$(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) tests/unit tests/security >$$unit_log 2>&1 & unit=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) $(SLOW_TESTS) >$$slow_log 2>&1 & slow=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) --ignore=tests/unit --ignore=tests/security \
		$(foreach t,$(wildcard $(SLOW_TESTS)),--ignore=$(t)) 2>&1 | tee $$rest_log; rest=$${PIPESTATUS[0]}; \
	wait $$slow; slows=$$?; wait $$unit; units=$$?; \
	echo "--- chaos-harness, elastic, single-agent, executor and systemd tests (run alongside) ---"; cat $$slow_log; \
	echo "--- tests/unit, tests/security (run alongside) ---"; cat $$unit_log; \
	grep -hE $(FAIL_LINES) $$rest_log $$slow_log $$unit_log | head -80 | \
		sed '1i --- the failures again (each test, then its "E" lines) ---'; rm -f $$unit_log $$slow_log $$rest_log; \
	test $$rest -eq 0 -a $$slows -eq 0 -a $$units -eq 0

test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit

# `make test` draws hypothesis examples from a fixed seed (tests/conftest.py), so it
# answers the same on every run; `make fuzz` draws fresh ones, ROUNDS times, from every
# unit test file that uses hypothesis. A failure prints its example and a
# @reproduce_failure blob: keep it as an @example.
ROUNDS ?= 3
FUZZ_TESTS = $(shell grep -l '^from hypothesis\|^import hypothesis' tests/unit/*.py)
fuzz: $(STAMP)
	@$(BYTECODE)
	@for i in $$(seq $(ROUNDS)); do echo "== fuzz round $$i of $(ROUNDS)"; \
		SWARM_HYPOTHESIS=random $(PY) -m pytest -q -p no:cacheprovider $(FUZZ_TESTS) || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check swarm tests bench chaos
	$(VENV)/bin/ruff format --check swarm tests bench chaos
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q tests/unit/test_layers.py

# Benchmarks print figures and write bench/results/*.json (docs/benchmarks.md has the
# latest figures). `make bench` runs them all except the 5,000-node gossip run (~30 min);
# `make bench-gossip` runs gossip at n = 100, 1,000 and 5,000 (~60 min, 2 GB RAM).
BENCHES := submit placement remote_cost start_floor idle sim migration policy crypto transport gpu_check failover failover_tick

bench: $(STAMP)
	@$(BYTECODE)
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(PY) bench/$$b.py || exit 1; done
	$(PY) bench/gossip.py --sizes 100,1000

bench-gossip: $(STAMP)
	$(PY) bench/gossip.py --sizes 100,1000,5000

bench-%: $(STAMP)
	$(PY) bench/$*.py

# A check that fails (an experiment's claim not met) still lets the quick CSVs be
# regenerated; the target then exits 1.
experiments: $(STAMP)
	$(PY) -m swarm.cli sim all --out docs/experiments --doc docs/experiments.md; rc=$$?; \
	rm -f docs/experiments/quick/*.csv && \
	$(PY) -m swarm.cli sim all --quick --out docs/experiments/quick && exit $$rc

# The chaos suite (docs/chaos.md): real agents in network namespaces (root; loopback
# otherwise) under kills, pauses, partitions, loss (one scenario keyed); ~23 minutes. Writes
# chaos/reports/<time>/report.{md,json} and the figures in docs/chaos.md.
chaos: $(STAMP) sysdeps
	@$(BYTECODE)
	$(PY) -m chaos.run --suite full --docs docs/chaos.md

# A short seeded subset (~40 s); `make test` runs it too (tests/integration/test_chaos_smoke.py).
chaos-smoke: $(STAMP) sysdeps
	@$(BYTECODE)
	$(PY) -m chaos.run --suite smoke

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
