"""TEST-ONLY switches that break the agent on purpose, for the chaos suite's self-test.

A chaos suite that cannot fail proves nothing: `tests/integration/test_chaos_breaks.py`
starts agents with `SWARM_TEST_MODE=1 SWARM_TEST_BREAK=<name>` and checks that the run
fails naming the violated invariant. Without SWARM_TEST_MODE=1 nothing here is ever
active, whatever SWARM_TEST_BREAK says.

Names (comma-separated):
  drop-acked     acknowledge some submissions (ids ending in 0-3) without journaling them
  ignore-drain   start queued tasks on a drained node
  oversubscribe  start tasks whose reservation does not fit the free shares
  ignore-constraints
                 place and admit tasks as if they had no hard constraints
"""

from __future__ import annotations

import functools
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
