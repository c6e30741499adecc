"""Reading a task's log file for `swarm logs`, locally or for a peer's request.

One reader serves both: the local API streams it to a client, and the peer RPC
streams it to the task's home, which proxies it on. With follow, it waits on the
task table's change events (not a timer alone), so the last bytes of a task that
ends arrive within one wake-up.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from .. import model as m
from .tasks import TaskTable

LOG_CHUNK = 64 * 1024


async def read_log(
    path: os.PathLike[str],
    offset: int,
    follow: bool,
    current: Callable[[], Awaitable[m.Task | None]],
    table: TaskTable,
) -> AsyncIterator[dict[str, Any]]:
    """Stream a log file from `offset`; with follow, until the task ends and EOF is read.

    The last part says `missing` when the file was never there although the task ran
    here and ended (or this node no longer knows it): its logs went with its record
    (`keep-finished`) or were cleaned up, and `swarm logs` says so instead of printing
    nothing and exiting 0 as if the task had written nothing.
    """
    found = False
    while True:
        data = b""
        try:
            async with await trio.open_file(path, "rb") as fh:
                found = True
                await fh.seek(offset)
                data = await fh.read(LOG_CHUNK)
        except FileNotFoundError:
            data = b""
        if data:
            offset += len(data)
            yield {"more": True, "data": data, "offset": offset}
            continue
        if not follow:
            break
        task = await current()
        if task is None or task.state.terminal or task.node not in ("", table.node):
            # one last read: output written just before exit
            try:
                async with await trio.open_file(path, "rb") as fh:
                    found = True
                    await fh.seek(offset)
                    rest = await fh.read()
            except FileNotFoundError:
                rest = b""
            if rest:
                offset += len(rest)
                yield {"more": True, "data": rest, "offset": offset}
            break
        with trio.move_on_after(0.1):
            await table.wait_change(task.id)
    last: dict[str, Any] = {"more": False, "offset": offset, "eof": True}
    if not found and _ran_here_and_ended(await current(), table):
        last["missing"] = True
    yield last


def _ran_here_and_ended(task: m.Task | None, table: TaskTable) -> bool:
    """Whether a log file should exist here but for its removal (None: forgotten)."""
    if task is None:
        return True
    return task.state.terminal and task.started_at is not None and task.node in ("", table.node)
