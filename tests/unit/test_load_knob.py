"""The loopback tests' load-average knob (swarm/testbreak.py): only in test mode, a
number >= 0, and what the agent's sampler reports as the host's load per core."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarm import testbreak
from swarm.runtime.sampler import Sampler


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    testbreak.load_per_core.cache_clear()
    yield
    testbreak.load_per_core.cache_clear()


@pytest.mark.parametrize(
    ("mode", "value", "forced"),
    [
        (None, "0", None),  # not in test mode: never
        ("1", "0", 0.0),
        ("1", "2.5", 2.5),
        ("1", "-1", None),
        ("1", "nan", None),
        ("1", "inf", None),
        ("1", "busy", None),
    ],
)
def test_only_in_test_mode_and_only_a_load(
    monkeypatch: pytest.MonkeyPatch, mode: str | None, value: str, forced: float | None
) -> None:
    if mode is None:
        monkeypatch.delenv("SWARM_TEST_MODE", raising=False)
    else:
        monkeypatch.setenv("SWARM_TEST_MODE", mode)
    monkeypatch.setenv("SWARM_TEST_LOAD_PER_CORE", value)
    assert testbreak.load_per_core() == forced


def test_the_sampler_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_TEST_MODE", "1")
    monkeypatch.setenv("SWARM_TEST_LOAD_PER_CORE", "7.25")
    assert Sampler().sample().load_per_core == 7.25
    testbreak.load_per_core.cache_clear()
    monkeypatch.delenv("SWARM_TEST_MODE")
    assert Sampler().sample().load_per_core >= 0.0  # the host's own
