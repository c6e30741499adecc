from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from swarm.localcluster import LocalAgent

# `make test` must give the same answer on every run: hypothesis draws its examples
# from a fixed seed there ("derandomize"), so a property that fails fails everywhere,
# on this machine and in CI alike. `make fuzz` draws fresh examples each run (set
# SWARM_HYPOTHESIS=random) to look for new failures; a failure it finds becomes an
# @example or a unit test.
settings.register_profile("fixed", derandomize=True, print_blob=True)
settings.register_profile("random", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("SWARM_HYPOTHESIS", "fixed"))

# Agents in tests: no encryption key, no mDNS, any free port, fast timers.
TEST_AGENT_ARGS = [
    "--insecure",
    "--no-mdns",
    "--port",
    "0",
    "--profile",
    "local",
    "--kill-grace",
    "2",
    # hermetic on a GPU machine too: only declared (fake) inventories
    "--no-nvml",
]

AgentFactory = Callable[..., LocalAgent]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: Unix socket paths must stay under 108 bytes."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sw-") as d:
        yield Path(d)


@pytest.fixture
def make_agent(short_tmp: Path) -> Iterator[AgentFactory]:
    started: list[LocalAgent] = []

    def factory(name: str = "a1", *args: str, start: bool = True, **kw: object) -> LocalAgent:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        a = LocalAgent(short_tmp, name, [*TEST_AGENT_ARGS, *args], env=env, python=sys.executable)
        started.append(a)
        if start:
            a.start()
        return a

    yield factory
    for a in started:
        a.stop(timeout=15)
