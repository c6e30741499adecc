"""Peer RPCs that read what this node holds: a task's record (for `swarm status` at
another agent) and a task's log, streamed to its home, which proxies it to the client.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import codec, wire
from .. import model as m
from .logread import read_log
from .runner import LocalRunner
from .tasks import TaskTable, UnknownTask


class PeerReads:
    def __init__(
        self,
        table: TaskTable,
        runner: LocalRunner,
        copy_of: Callable[[m.TaskId], m.Task | None] = lambda tid: None,
    ) -> None:
        self.table = table
        self.runner = runner
        self.copy_of = copy_of  # a replica's copy of another home's task (issue 19)

    async def rpc_task(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        """Look up a task record here (for `swarm status` from another agent)."""
        tid = req.get("id")
        if not m.valid_task_id(tid):
            raise wire.SchemaError("task: missing or invalid id")
        assert isinstance(tid, str)
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            copy = self.copy_of(tid)
            return {"task": None if copy is None else codec.task_to_wire(copy)}
        return {"task": codec.task_to_wire(t)}

    async def rpc_logs(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> None:
        """Stream a local task's log to a peer (the task's home proxies it to its client)."""
        f = wire.Fields(req, "logs rpc", ignore=("v", "op", "from"))
        tid = f.task_id("id", required=True)
        which = f.str("stream", "stdout")
        follow = f.bool("follow", False)
        offset = f.int("offset", 0, lo=0)
        f.done()
        out, err = self.runner.log_paths(tid)
        path = out if which == "stdout" else err

        async def current() -> m.Task | None:
            try:
                return await self.table.get(tid)
            except UnknownTask:
                return None

        stream.timeout = math.inf
        async for part in read_log(path, offset, follow, current, self.table):
            await stream.send(part, timeout=30.0)
        return None
