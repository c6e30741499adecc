"""One queue per peer and at most one sender per peer (issue 23): the shape shared by
the batched handoff requests (handoffbatch.py) and replica messages (replicabatch.py).

The sender takes up to `most` queued items and hands them to `send` as one batch; what
queues while that batch is out goes in the next. So a lone item leaves at once (no
timer, no added latency) and a burst coalesces by itself: the batch grows with the
round trip.

`linger` (seconds, default none): a sender that finds fewer than `most` items waits
that long first, for news nobody waits on. Where a queue drains, tasks start and end
one at a time, and without it each of their messages went in an RPC (and a commit at
the receiver) of its own (issue 23, stop 50)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

from .. import model as m

T = TypeVar("T")


class PeerQueues(Generic[T]):
    def __init__(
        self,
        spawn: Callable[..., Any],
        send: Callable[[m.NodeId, list[T]], Awaitable[None]],
        most: int,
        linger: float = 0.0,
    ) -> None:
        self._spawn = spawn
        self._send = send
        self.most = most
        self.linger = linger
        self.queues: dict[m.NodeId, list[T]] = {}
        self.sending: set[m.NodeId] = set()

    def put(self, dest: m.NodeId, item: T) -> None:
        self.queues.setdefault(dest, []).append(item)
        if dest not in self.sending:
            self.sending.add(dest)
            self._spawn(self._drain, dest)

    async def _drain(self, dest: m.NodeId) -> None:
        try:
            while True:
                q = self.queues.get(dest)
                if not q:
                    return
                if self.linger and len(q) < self.most:
                    await trio.sleep(self.linger)  # put() appends to this very list
                batch, q[:] = q[: self.most], q[self.most :]
                await self._send(dest, batch)
        finally:
            self.sending.discard(dest)
            if not self.queues.get(dest):
                self.queues.pop(dest, None)


def too_big(e: Exception, batch: list[Any]) -> bool:
    """Was `batch` refused for not fitting one frame (and can it be halved)?"""
    return len(batch) > 1 and "exceeds" in str(e)
