"""TEST-ONLY switches that break the agent on purpose, for the chaos suite's self-test.

A chaos suite that cannot fail proves nothing: `tests/integration/test_chaos_breaks.py`
starts agents with `SWARM_TEST_MODE=1 SWARM_TEST_BREAK=<name>` and checks that the run
fails naming the violated invariant. Without SWARM_TEST_MODE=1 nothing here is ever
active, whatever SWARM_TEST_BREAK says.

Two test-only knobs, numbers rather than switches: SWARM_TEST_CLOCK_SKEW=S adds
S seconds (may be negative, at most 60 either way) to this agent's every reading of the
system clock (runtime/clock.py `system_time`): the chaos suite's clock-skew scenario
(network namespaces share the host's clock, so one node's clock cannot be set alone).
And SWARM_TEST_LOAD_PER_CORE=L (>= 0) replaces the host's 1-minute load average per
core in this agent's samples (runtime/sampler.py): agents on one machine share its
load average, which the migration policy's slowdown reads, so a loaded test machine
(three `make test` lanes: above 8 per core) made every peer look as slow as the
overloaded node and a loopback migration test waited in vain (stop 40).

Names (comma-separated):
  drop-acked     acknowledge some submissions (ids ending in 0-3) without journaling them
  ignore-drain   start queued tasks on a drained node
  oversubscribe  start tasks whose reservation does not fit the free shares
  ignore-constraints
                 place and admit tasks as if they had no hard constraints
"""

from __future__ import annotations

import functools
import math
import os

NAMES = frozenset({"drop-acked", "ignore-drain", "oversubscribe", "ignore-constraints"})


@functools.cache
def _active() -> frozenset[str]:
    if os.environ.get("SWARM_TEST_MODE") != "1":
        return frozenset()
    raw = os.environ.get("SWARM_TEST_BREAK", "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip() in NAMES)


def active() -> frozenset[str]:
    """The switches on in this process (the node's state machine takes them as data)."""
    return _active()


def broken(name: str) -> bool:
    """True only in test mode with `name` listed in SWARM_TEST_BREAK."""
    return name in _active()


@functools.cache
def clock_skew() -> float:
    """TEST-ONLY: seconds added to this agent's system clock (0 outside test mode)."""
    if os.environ.get("SWARM_TEST_MODE") != "1":
        return 0.0
    try:
        skew = float(os.environ.get("SWARM_TEST_CLOCK_SKEW", "0"))
    except ValueError:
        return 0.0
    return max(-60.0, min(60.0, skew)) if skew == skew else 0.0


@functools.cache
def load_per_core() -> float | None:
    """TEST-ONLY: the load average per core this agent reports (None: the host's)."""
    if os.environ.get("SWARM_TEST_MODE") != "1":
        return None
    try:
        value = float(os.environ.get("SWARM_TEST_LOAD_PER_CORE", "nan"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
