"""Keyed one-shot timers for a sans-IO state machine.

The membership core keeps every deadline (probe rounds, probe timeouts, suspicions,
push-pull, ...) here under a hashable key and asks for the earliest one; the adapter
turns that into one sleep. Rescheduling a key replaces its deadline without
searching the heap (stale heap entries are dropped when they surface).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable


class Timers:
    """Keyed one-shot timers on a heap with lazy deletion (rescheduling is cheap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}
        self._n = 0

    def set(self, key: Hashable, when: float) -> None:
        self._due[key] = when
        self._n += 1
        heapq.heappush(self._heap, (when, self._n, key))

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def when(self, key: Hashable) -> float | None:
        return self._due.get(key)

    def _clean(self) -> None:
        h = self._heap
        while h and self._due.get(h[0][2]) != h[0][0]:
            heapq.heappop(h)

    def next(self) -> float:
        self._clean()
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> tuple[Hashable, float] | None:
        self._clean()
        h = self._heap
        if not h or h[0][0] > now:
            return None
        when, _, key = heapq.heappop(h)
        del self._due[key]
        return key, when
