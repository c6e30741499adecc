"""The agent's signal handling outside trio's receiver (swarm/runtime/signals.py)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from swarm.logs import EventLog
from swarm.runtime.signals import Signals

STOPS = (signal.SIGTERM, signal.SIGINT)


@pytest.fixture
def handlers() -> Iterator[None]:
    """This process's stop-signal handlers, put back after the test."""
    before = {s: signal.getsignal(s) for s in STOPS}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _signals() -> Signals:
    return Signals(stop=lambda: None, reload=lambda: None, log=EventLog())


def test_a_stop_signal_outside_trio_is_remembered_not_fatal(handlers: None) -> None:
    sig = _signals()
    sig.catch_outside()
    os.kill(os.getpid(), signal.SIGTERM)
    assert sig.outside == signal.SIGTERM


def test_once_stopped_stop_signals_are_ignored_by_the_kernel(handlers: None) -> None:
    """After `quiet()` a SIGTERM reaches no Python handler at all: none runs, so none
    can write to trio's signal wakeup fd while trio's teardown closes it (stop 55:
    a second SIGTERM then printed a traceback to the agent's stderr)."""
    sig = _signals()
    sig.catch_outside()
    sig.quiet()
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in STOPS)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    assert sig.outside is None


def test_quiet_outside_the_main_thread_changes_nothing(handlers: None) -> None:
    before = {s: signal.getsignal(s) for s in STOPS}
    t = threading.Thread(target=_signals().quiet)
    t.start()
    t.join()
    assert {s: signal.getsignal(s) for s in STOPS} == before
