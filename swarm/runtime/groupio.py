"""The stimuli of arrays and dependencies (issue 23), and what a restart resumes of
every group (waiting tasks, gangs, arrays, members). A part of the Driver
(driver.py); node/arrays.py and node/depends.py have the rules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import model as m
from ..node import events as ev
from ..node.state import NodeState
from .tasks import TaskTable


class GroupIO:
    state: NodeState
    table: TaskTable
    parent_reader: Callable[[list[m.TaskId]], Awaitable[dict[m.TaskId, str]]] | None

    if TYPE_CHECKING:  # provided by Driver, Effects and GangIO

        def _time(self) -> tuple[float, float]: ...
        def _next_id(self) -> str: ...
        def run_inline(self, instrs: list[ev.Instruction]) -> None: ...
        def gang_submitted(self, tid: m.TaskId) -> None: ...
        def _spawn(self, fn: Any, *args: Any) -> None: ...

    def array_submitted(self, tid: m.TaskId) -> None:
        """An array's record was written here: its elements come (node/arrays.py)."""
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.ArraySubmitted(now, wall, self._next_id(), tid)))

    def array_cancel(self, tid: m.TaskId, why: str) -> list[m.TaskId]:
        """Stop an array's elements from being created; its unfinished ones to cancel."""
        _, wall = self._time()
        ids, instrs = self.state.array_cancel(tid, why, wall)
        self.run_inline(instrs)
        return ids

    def resume_group(self, t: m.Task, mine: bool) -> bool:
        """At start-up: a task waiting for parents is judged again, a gang's coordinator
        resumes after its last round, an array goes on from its progress, a member never
        started fails (a member starts with its gang or not at all). False: none."""
        S = m.TaskState
        if mine and t.spec.after and t.state is S.QUEUED and t.id not in self.state.ledger:
            self.deps_submitted(t.id)
        elif mine and t.spec.gang is not None:
            self.gang_submitted(t.id)
        elif mine and t.spec.array:
            self.array_submitted(t.id)
        elif t.spec.member is not None and t.state is S.QUEUED:
            self.table.end_now(t.id, S.FAILED, "not started: its agent restarted", self._spawn)
        else:
            return False
        return True

    def deps_submitted(self, tid: m.TaskId) -> None:
        """A task with `--after` was written here: it waits (node/depends.py)."""
        now, wall = self._time()
        self.run_inline(self.state.handle(ev.DepsSubmitted(now, wall, self._next_id(), tid)))

    async def deps_loop(self) -> None:
        """Every second while tasks wait for parents homed elsewhere: read those
        parents' records (`parent_reader`, set by the local API) and tell the state."""
        while True:
            await trio.sleep(1.0)
            reader = self.parent_reader
            ids = self.state.deps_remote() if self.state.deps else []
            if not ids or reader is None:
                continue
            states = await reader(ids)
            if states:
                now, wall = self._time()
                s = ev.ParentsSeen(now, wall, self._next_id(), states)
                self.run_inline(self.state.handle(s))
