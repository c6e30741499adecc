"""The runner's queue of task ids: a deque that answers `tid in queue` in O(1).

The node's pure code asks whether a task is queued once per arriving task, per
handoff answer and per fence check (node/location.py, fencing.py, failover.py); a
plain deque answers that by a scan, which a runner with thousands queued paid on
every arrival (issue 23: `Location.on_run_now` 3.6 % of a busy runner's loop). The
order is still the deque's; a count per id keeps membership exact with duplicates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, NoReturn

from .. import model as m


class TaskQueue(deque[m.TaskId]):
    """A deque of task ids with a membership count kept by every mutator used."""

    def __init__(self, items: Iterable[m.TaskId] = ()) -> None:
        super().__init__()
        self._count: dict[m.TaskId, int] = {}
        self.extend(items)

    def _add(self, tid: m.TaskId) -> None:
        self._count[tid] = self._count.get(tid, 0) + 1

    def _drop(self, tid: m.TaskId) -> None:
        n = self._count[tid] - 1
        if n:
            self._count[tid] = n
        else:
            del self._count[tid]

    def __contains__(self, tid: object) -> bool:
        return tid in self._count

    def append(self, tid: m.TaskId) -> None:
        super().append(tid)
        self._add(tid)

    def appendleft(self, tid: m.TaskId) -> None:
        super().appendleft(tid)
        self._add(tid)

    def extend(self, tids: Iterable[m.TaskId]) -> None:
        for tid in list(tids):
            self.append(tid)

    def extendleft(self, tids: Iterable[m.TaskId]) -> None:
        for tid in list(tids):
            self.appendleft(tid)

    def popleft(self) -> m.TaskId:
        tid = super().popleft()
        self._drop(tid)
        return tid

    def pop(self, *args: int) -> m.TaskId:
        if args:
            self._unsupported()
        tid = super().pop()
        self._drop(tid)
        return tid

    def remove(self, tid: m.TaskId) -> None:
        """As a deque's (ValueError when absent), but a miss is answered from the count:
        most removals are of tasks not queued (a handoff's drop), and a deque scanned
        all of a runner's thousands queued to say so."""
        if tid not in self._count:
            raise ValueError(f"{tid!r} is not queued")
        super().remove(tid)
        self._drop(tid)

    def clear(self) -> None:
        super().clear()
        self._count.clear()

    def _unsupported(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("TaskQueue supports append/extend/pop/remove/clear only")

    insert = __setitem__ = __delitem__ = __iadd__ = __imul__ = _unsupported  # type: ignore[assignment]
