"""The agent's signals: SIGTERM/SIGINT stop it, SIGHUP re-reads the cluster key file.

Three parts: `catch_outside()` before trio's receiver is installed (start-up) and
after it is gone (the end of shutdown), `run()` while the agent runs, and `quiet()`
once it has stopped, before trio's own teardown.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import trio

from ..logs import EventLog


class Signals:
    def __init__(self, *, stop: Callable[[], None], reload: Callable[[], None], log: EventLog):
        self.stop = stop
        self.reload = reload
        self.log = log
        self.outside: int | None = None  # a stop signal that came while run() did not listen

    def catch_outside(self) -> None:
        """SIGTERM/SIGINT while trio's receiver is not installed (start-up, and the
        end of shutdown, when trio restores the previous handler and re-raises the
        signals it had not handed out) must not kill the agent half-way: remember
        them instead. A stop requested during start-up happens once it listens."""

        def remember(signum: int, frame: object) -> None:
            self.outside = signum

        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, remember)
        except ValueError:  # not the main thread (an agent inside a test): nothing to do
            pass

    def quiet(self) -> None:
        """Stop signals are ignored from here on, by the kernel: the agent has stopped
        (the end of `Agent.run`). trio's teardown closes the socket pair its signal
        wakeup fd names before it unsets that fd, and a SIGTERM in between (a second
        `kill`, a supervisor's retry) had Python write to the closed pair: "Exception
        ignored when trying to write to the signal wakeup fd" and a traceback on
        stderr, once per signal (chaos smoke's `no-crash-or-traceback` caught it at a
        `make test`; a storm of them once held the process in that close, stop 55).
        An ignored signal never reaches Python's handler, so nothing is written."""
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread (an agent inside a test): nothing to do
            pass

    async def run(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            if self.outside is not None:  # arrived during start-up
                self.log.info("agent.signal", signal=signal.Signals(self.outside).name)
                self.stop()
            async for sig in sigs:
                self.log.info("agent.signal", signal=signal.Signals(sig).name)
                if sig == signal.SIGHUP:
                    self.reload()
                else:
                    self.stop()
