"""Handoff requests to one peer travel together (issue 23): one message, one journal
commit and one reply for many tasks.

A task placed remotely costs two request/reply exchanges (offer, then commit), and
each used to be an RPC of its own: its own frame, its own trip through trio's
scheduler at both ends, its own fsync at the guest. Under a burst (an array's
elements, many submissions at one entry node) that was most of the cost, and ten
thousand concurrent RPCs opened connections faster than the pool could reuse them.

Here every handoff request goes into a queue per destination. One sender per
destination takes what is queued, up to MAX_BATCH requests, and sends it as one
`handoff_batch` RPC; whatever queued meanwhile goes in the next one. So a lone request
leaves at once (no timer, no added latency) and a burst coalesces by itself: the
batch grows with the round trip. The receiver answers every request in order through
the same pure state machine (cluster/handoff.py), journals what they all decided in
one commit, then replies with one list. Each request keeps its own (task id, epoch)
identity, retries and idempotence, so the handoff's exactly-one-place guarantee holds
per task, whatever batch it travelled in; a batch that gets no answer is a lost
answer for each of its requests (they are retried on the handoff timers, as before).

Bad input: a batch that is not a list of at most MAX_BATCH well-formed requests is
refused whole with one error naming the field (only a key holder can send one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .. import model as m
from .. import wire
from ..cluster import handoff as h
from ..node import events as ev
from .net import TransportError
from .peerqueue import PeerQueues, too_big
from .peers import RemoteError


class Driver(Protocol):
    """What the batches need of the driver (runtime/driver.py)."""

    cluster: Any
    rpc_timeout: float
    io_counters: dict[str, int]
    log: Any
    state: Any
    _inflight: set[tuple[m.NodeId, h.Request]]

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None: ...
    def _time(self) -> tuple[float, float]: ...
    def _next_id(self) -> str: ...
    async def execute_batch(self, instrs: list[ev.Instruction]) -> None: ...


MAX_BATCH = 512  # requests per message (a frame of ~1 KB specs stays far under MAX_FRAME)
ACCEPT_BATCH = 2048  # the most a receiver takes in one message


def batch_to_wire(reqs: Sequence[h.Request]) -> list[dict[str, Any]]:
    return [h.request_to_wire(r) for r in reqs]


def batch_from_wire(obj: Any) -> list[h.Request]:
    """The requests of a `handoff_batch` message (strict: one bad entry refuses all)."""
    if not isinstance(obj, list):
        raise wire.SchemaError("handoff batch: reqs must be a list")
    if not 0 < len(obj) <= ACCEPT_BATCH:
        raise wire.SchemaError(f"handoff batch: reqs holds {len(obj)} (1..{ACCEPT_BATCH})")
    return [h.request_from_wire(r) for r in obj]


def replies_from_wire(obj: Any, reqs: Sequence[h.Request]) -> list[h.Reply | None]:
    """The replies to `reqs`, in order; an entry that does not answer its request (another
    task, malformed) counts as no answer for that request alone. The epoch is not
    compared: a home that fenced its holder answers a query with the new epoch, which
    the holder must see (chaos scenario `gangs`, seed 7, found a holder left MOVING
    for good when such answers were dropped)."""
    if not isinstance(obj, list) or len(obj) != len(reqs):
        raise wire.SchemaError("handoff batch: replies do not match the requests")
    out: list[h.Reply | None] = []
    for raw, req in zip(obj, reqs, strict=True):
        try:
            r = h.reply_from_wire(raw)
        except wire.WireError:
            out.append(None)
            continue
        out.append(r if r.task_id == req.task_id else None)
    return out


class HandoffOutbox:
    """The per-destination queues and their senders (one batch in flight per peer)."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        self.q = PeerQueues[h.Request](driver._spawn, self._send, MAX_BATCH)

    def put(self, s: h.Send) -> None:
        self.q.put(s.dest, s.request)

    async def _send(self, dest: m.NodeId, batch: list[h.Request]) -> None:
        d = self.d
        replies: list[h.Reply | None] = [None] * len(batch)
        c = d.io_counters
        c["handoff_rpcs"] += 1
        c["handoff_batched"] = c.get("handoff_batched", 0) + len(batch)
        for r in batch:
            kind = "handoff_sent_" + type(r).__name__.lower()
            c[kind] = c.get(kind, 0) + 1
        try:
            if d.cluster is not None:
                msg = {"op": "handoff_batch", "reqs": batch_to_wire(batch)}
                raw = await d.cluster.request(dest, msg, d.rpc_timeout)
                replies = replies_from_wire(raw.get("replies"), batch)
        except TransportError as e:
            if too_big(e, batch):  # too big for one frame: halve it
                half = len(batch) // 2
                await self._send(dest, batch[:half])
                await self._send(dest, batch[half:])
                return
            self._failed(dest, batch, e)
        except (RemoteError, wire.WireError) as e:
            self._failed(dest, batch, e)
        finally:
            for r in batch:
                d._inflight.discard((dest, r))
        # the answers are taken in a task of their own, so the next batch to this peer
        # leaves while these wait for their journal commit
        d._spawn(self._answered, dest, batch, replies)

    async def _answered(
        self, dest: m.NodeId, batch: list[h.Request], replies: list[h.Reply | None]
    ) -> None:
        d = self.d
        now, wall = d._time()
        answers = [
            ev.HandoffReply(now, wall, d._next_id(), dest, req, reply)
            for req, reply in zip(batch, replies, strict=True)
        ]
        await d.execute_batch(d.state.handle(*answers))

    def _failed(self, dest: m.NodeId, batch: list[h.Request], e: Exception) -> None:
        self.d.io_counters["handoff_rpc_failures"] += 1
        self.d.log.debug("handoff.batch_failed", dest=dest, requests=len(batch), error=str(e))


async def serve_batch(d: Driver, req: dict[str, Any], sender: m.NodeId) -> dict[str, Any]:
    """Answer a peer's batch: each request through the state machine in order (an
    offer's admission sees the ones accepted before it), every journal write of the lot
    in one commit, then one list of replies."""
    reqs = batch_from_wire(req.get("reqs"))
    now, wall = d._time()
    replies: list[dict[str, Any]] = []
    instrs: list[ev.Instruction] = []
    for r in reqs:
        refusal = d.state.admission_refusal(r.spec) if isinstance(r, h.Offer) else None
        reply, out = d.state.on_request(sender, r, now, wall, refusal)
        replies.append(h.reply_to_wire(reply))
        instrs += out
    await d.execute_batch(instrs)
    return {"replies": replies}
