"""Task records in memory (pure): the active tasks and a bounded cache of finished ones.

The node's decisions read and change these synchronously, so a rule that moves a task
twice in one step (QUEUED -> TRANSFERRING -> QUEUED) sees its own first move. Making
each change durable and waking those who wait on a task is the runtime's job: every
change here comes back as an `events.Record` instruction for it to carry out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .. import model as m

RECENT_FINISHED = 20_000  # finished records kept in memory (older ones: the journal)


class TaskRecords:
    def __init__(self, recent_finished: int = RECENT_FINISHED) -> None:
        self.active: dict[m.TaskId, m.Task] = {}
        self.finished: OrderedDict[m.TaskId, m.Task] = OrderedDict()
        self.counts: dict[str, int] = {}  # transitions by destination state
        self.recent_finished = recent_finished
        # tasks whose record changed (stored, finished, forgotten, evicted) since the
        # failover tick last looked: what may owe their copies news (replicas.py)
        self.touched: set[m.TaskId] = set()

    def get_cached(self, task_id: m.TaskId) -> m.Task | None:
        return self.active.get(task_id) or self.finished.get(task_id)

    def apply(
        self, task_id: m.TaskId, dst: m.TaskState, wall: float, cause: str, **kw: Any
    ) -> m.Task:
        """Move a task (model.transition's rules; KeyError if it is not active here)."""
        old = self.active[task_id]
        new = m.transition(old, dst, wall, cause, **kw)
        self.store(new)
        self.counts[dst.value] = self.counts.get(dst.value, 0) + 1
        return new

    def store(self, task: m.Task) -> None:
        self.touched.add(task.id)
        if task.state.terminal:
            self.active.pop(task.id, None)
            self.finished[task.id] = task
            self.finished.move_to_end(task.id)
            while len(self.finished) > self.recent_finished:
                self.touched.add(self.finished.popitem(last=False)[0])
        else:
            self.active[task.id] = task

    def forget(self, task_id: m.TaskId) -> None:
        self.touched.add(task_id)
        self.active.pop(task_id, None)
        self.finished.pop(task_id, None)
