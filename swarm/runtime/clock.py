"""One source of time for the whole runtime: trio's clock, plus a wall-clock offset.

Every part of the agent reads time from one `Clock` object passed in at
construction, never from `time.time()` or `time.monotonic()` directly. Two readings:

- `now()`: trio's clock (monotonic; deadlines, retries, timeouts, ages of gossip);
- `wall()`: `now()` plus an offset taken from the system clock at start-up (journal
  records, explain entries, tombstone times: what a human or another node reads).

Because both come from trio's clock, a test that runs the agent under
`trio.testing.MockClock` moves all of its time at once, wall times included: a
tombstone expiry or an explain timestamp is then a function of the test's steps.

The offset is re-taken by `resync()` (the agent calls it from a slow loop) so a wall
clock stepped by NTP is followed within that loop's period; a clock built with
`follow_system=False` (tests) never resyncs.

The exceptions, each commented where it is: the cluster's replay window (crypto,
compared with other nodes' system clocks), code in worker threads (trio's clock
cannot be read there) and elapsed-time measurements that are not decisions.
"""

from __future__ import annotations

import time

import trio

from ..testbreak import clock_skew


def system_time() -> float:
    """The system clock (time.time), as this agent reads it everywhere it does (a
    test-only skew added: testbreak.clock_skew, the chaos suite's clock-skew fault)."""
    return time.time() + clock_skew()


class Clock:
    """trio time plus a wall-clock offset; see the module docstring."""

    def __init__(self, offset: float, *, follow_system: bool = True) -> None:
        self.offset = offset
        self.follow_system = follow_system
        # False only for a system clock built outside trio.run (an Agent is built
        # before it): its first wall() takes the offset (trio's clock starts anywhere)
        self.synced = True

    @classmethod
    def system(cls) -> Clock:
        """The clock of a real agent: wall() tracks time.time(). Built inside trio.run
        it takes its offset at once; outside (trio's clock does not exist yet) at the
        first resync() or wall() in trio.run (the agent's run() resyncs first). Read
        outside trio.run, its wall() is time.time(); now() needs trio."""
        try:
            return cls(system_time() - trio.current_time())
        except RuntimeError:  # not in trio.run
            clock = cls(0.0)
            clock.synced = False
            return clock

    @classmethod
    def fixed(cls, wall_at_zero: float = 1_700_000_000.0) -> Clock:
        """A clock for tests: wall() is `wall_at_zero` plus trio time, never resynced."""
        return cls(wall_at_zero, follow_system=False)

    def now(self) -> float:
        return trio.current_time()

    def wall(self) -> float:
        try:
            now = trio.current_time()
        except RuntimeError:
            if self.follow_system:  # outside trio.run (a direct call in a unit test)
                return system_time()
            raise
        if not self.synced:
            self.resync()
        return now + self.offset

    def resync(self) -> float:
        """Re-take the offset from the system clock; returns how far it moved (s).
        The first sync of a clock built outside trio.run returns 0."""
        if not self.follow_system:
            return 0.0
        new = system_time() - trio.current_time()
        moved = 0.0 if not self.synced else new - self.offset
        self.offset = new
        self.synced = True
        return moved
