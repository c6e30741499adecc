"""The chaos suite's clock-skew knob (swarm/testbreak.py): only in test mode, bounded,
and seen by every reading of the system clock the agent makes (runtime/clock.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from swarm import testbreak
from swarm.runtime import clock


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    testbreak.clock_skew.cache_clear()
    yield
    testbreak.clock_skew.cache_clear()


@pytest.mark.parametrize(
    ("mode", "value", "skew"),
    [
        (None, "5", 0.0),  # not in test mode: never
        ("1", "5", 5.0),
        ("1", "-5", -5.0),
        ("1", "3600", 60.0),  # bounded
        ("1", "nan", 0.0),
        ("1", "soon", 0.0),
    ],
)
def test_skew_only_in_test_mode_and_bounded(
    monkeypatch: pytest.MonkeyPatch, mode: str | None, value: str, skew: float
) -> None:
    if mode is None:
        monkeypatch.delenv("SWARM_TEST_MODE", raising=False)
    else:
        monkeypatch.setenv("SWARM_TEST_MODE", mode)
    monkeypatch.setenv("SWARM_TEST_CLOCK_SKEW", value)
    assert testbreak.clock_skew() == skew


def test_the_agents_system_clock_carries_the_skew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_TEST_MODE", "1")
    monkeypatch.setenv("SWARM_TEST_CLOCK_SKEW", "-5")
    assert clock.system_time() - time.time() == pytest.approx(-5.0, abs=0.5)
    assert clock.Clock.system().wall() - time.time() == pytest.approx(-5.0, abs=0.5)
