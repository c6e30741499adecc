"""The node's task records: in memory for speed, in the journal for durability.

Every state change goes through `TaskTable.change`, which applies the pure lifecycle
state machine (model.transition), journals the new record and wakes whoever waits
on the task. Results (terminal states) are awaited to be durable before waiters
hear of them, so a client never sees a result the journal could forget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import trio

from .. import model as m
from ..logs import NULL_LOG, EventLog
from ..node.records import TaskRecords
from .clock import Clock
from .journal import DelTask, Journal, Op, PutTask


class UnknownTask(KeyError):
    pass


class TaskTable:
    """The records (swarm/node/records.py, shared with the node's state machine) plus
    their journal and the waiters on each task."""

    def __init__(
        self,
        journal: Journal,
        node: m.NodeId,
        log: EventLog = NULL_LOG,
        clock: Clock | None = None,
        records: TaskRecords | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock or journal.clock  # transition times are clock.wall()
        self.node = node
        self.log = log
        self.records = records if records is not None else TaskRecords()
        self._changed: dict[m.TaskId, trio.Event] = {}
        # ends applied in memory whose write is not on disk yet (change_durably): a
        # wait does not answer from them, so what it reports survives a crash and the
        # runner's steps after the write (its status directory) are done
        self._writing: set[m.TaskId] = set()

    @property
    def active(self) -> dict[m.TaskId, m.Task]:
        return self.records.active

    @property
    def finished(self) -> dict[m.TaskId, m.Task]:
        return self.records.finished

    @property
    def counts(self) -> dict[str, int]:
        """Transitions by destination state."""
        return self.records.counts

    # ----------------------------------------------------------------- reads

    def get_cached(self, task_id: m.TaskId) -> m.Task | None:
        return self.active.get(task_id) or self.finished.get(task_id)

    async def get(self, task_id: m.TaskId) -> m.Task:
        t = self.get_cached(task_id)
        if t is None:
            t = await self.journal.get_task(task_id)
        if t is None:
            raise UnknownTask(task_id)
        return t

    def by_state(self, *states: m.TaskState) -> list[m.Task]:
        return [t for t in self.active.values() if t.state in states]

    # ---------------------------------------------------------------- writes

    def load(self, tasks: Iterable[m.Task]) -> None:
        for t in tasks:
            self._store(t)

    async def add(
        self,
        task: m.Task,
        extra_ops: Iterable[Op] = (),
        on_written: Callable[[m.Task], None] | None = None,
    ) -> None:
        """Journal a new task durably. Raises JournalError.

        The task is visible (and `on_written(task)` runs) once its record is written,
        which a crash of the agent cannot undo, possibly before it is synced: see
        Journal.commit. So when this raises, the task may be in the table already
        (the write landed, the fsync failed): the caller undoes it."""

        def written() -> None:
            self._store(task)
            self.log.info(
                "task.state",
                task=task.id,
                src="",
                dst=task.state.value,
                cause=task.history[-1].cause,
            )
            if on_written is not None:
                on_written(task)

        await self.journal.commit([PutTask(task), *extra_ops], on_written=written)

    def change(self, task_id: m.TaskId, dst: m.TaskState, cause: str, **kw: Any) -> m.Task:
        """Apply a transition now; the journal write is queued and will land."""
        new = self._apply(task_id, dst, cause, **kw)
        self.journal.enqueue([PutTask(new)])
        self._wake(task_id)
        return new

    def end_now(
        self,
        task_id: m.TaskId,
        dst: m.TaskState,
        cause: str,
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> m.Task:
        """End a task now, from code that cannot await (a start refused, a member found
        at start-up): the record changes in memory at once, as with `change`, so
        nothing starts it meanwhile; its write goes in a task `spawn` starts, and a
        wait answers the end once that write is on disk (as `change_durably`), never
        from memory before it: what a wait reports survives a crash."""
        new = self._apply(task_id, dst, cause)
        ids = self._mark_writing([task_id])  # now: before the write task even runs

        async def write() -> None:
            try:
                await self.journal.commit([PutTask(new)], must_land=True)
            finally:
                self._written(ids)

        spawn(write)
        return new

    async def change_durably(
        self, task_id: m.TaskId, dst: m.TaskState, cause: str, **kw: Any
    ) -> m.Task:
        """Apply a transition and wait until it is on disk before waking waiters."""
        new = self._apply(task_id, dst, cause, **kw)
        with self.writing([task_id]):
            await self.journal.commit([PutTask(new)], must_land=True)
        return new

    def replace(self, task: m.Task) -> None:
        """Adopt a record computed elsewhere (e.g. a guest task accepted from its home)."""
        self.records.store(task)
        self.noted(task)
        self.journal.enqueue([PutTask(task)])
        self._wake(task.id)

    def forget(self, task_id: m.TaskId) -> None:
        """Drop a record entirely (journaled): a guest that left before it ran here."""
        self.records.forget(task_id)
        self.journal.enqueue([DelTask(task_id)])
        self._wake(task_id)

    def noted(self, task: m.Task) -> None:
        """Log a record's latest transition (the node's state machine made it)."""
        last = task.history[-1] if task.history else None
        dst = task.state
        self.log.info(
            "task.state",
            task=task.id,
            src="" if last is None or last.src is None else last.src.value,
            dst=dst.value,
            cause="" if last is None else last.cause,
            where=task.node,
            **({"exit": task.exit_code} if dst.terminal and task.exit_code is not None else {}),
            **({"signal": task.signal} if dst.terminal and task.signal is not None else {}),
        )

    def _apply(self, task_id: m.TaskId, dst: m.TaskState, cause: str, **kw: Any) -> m.Task:
        if task_id not in self.records.active:
            raise UnknownTask(task_id)
        new = self.records.apply(task_id, dst, self.clock.wall(), cause, **kw)
        self.noted(new)
        return new

    def _store(self, task: m.Task) -> None:
        self.records.store(task)

    # --------------------------------------------------------------- waiting

    @contextlib.contextmanager
    def writing(self, task_ids: Iterable[m.TaskId]) -> Iterator[None]:
        """These records, applied in memory, are being written: a wait answers an end
        among them once the write is on disk (then they are woken; a failed write
        wakes them too, and they answer from memory)."""
        ids = self._mark_writing(task_ids)
        try:
            yield
        finally:
            self._written(ids)

    def _mark_writing(self, task_ids: Iterable[m.TaskId]) -> set[m.TaskId]:
        """Mark these records as being written; the ones this call marked (one already
        marked: its writer wakes it)."""
        ids = set(task_ids) - self._writing
        self._writing |= ids
        return ids

    def _written(self, ids: set[m.TaskId]) -> None:
        """Their write is over (landed or failed): waits on them answer now."""
        self._writing -= ids
        for tid in ids:
            self._wake(tid)

    def wake(self, task_id: m.TaskId) -> None:
        """Whoever waits on this task looks again (its record changed)."""
        self._wake(task_id)

    def _wake(self, task_id: m.TaskId) -> None:
        ev = self._changed.pop(task_id, None)
        if ev is not None:
            ev.set()

    async def wait_change(self, task_id: m.TaskId) -> None:
        ev = self._changed.get(task_id)
        if ev is None:
            ev = self._changed[task_id] = trio.Event()
        await ev.wait()

    async def wait_terminal(self, task_id: m.TaskId) -> m.Task:
        """The task's record once it has ended; an end the runner is writing is
        answered once it is on disk (change_durably)."""
        while True:
            t = await self.get(task_id)
            if t.state.terminal and task_id not in self._writing:
                return t
            await self.wait_change(task_id)
