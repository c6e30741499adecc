"""Replica messages to one peer travel together (issue 23): one message, one journal
commit and one answer for many tasks.

Every task has copies at k-1 other nodes (node/replicas.py), and every copy costs three
messages over the task's life: `hold` (its spec, before the submission is answered),
`runner` (where it runs, once placed) and `release` (how it ended). Each was an RPC of
its own, with its own frame, its own trip through trio's scheduler at both ends and its
own fsync at the peer: with 8 clients submitting to one agent, a copy cost 55-65 % of
the submission rate (docs/benchmarks.md, bench/replicas.py).

Here each replica message goes into a queue per destination, as handoff requests do
(runtime/handoffbatch.py). One sender per destination takes what is queued, up to
MAX_BATCH, and sends it as one `replica_batch` RPC; what queues meanwhile goes in the
next. A lone message leaves at once (no timer), a burst coalesces by itself. The peer
runs each message through the same pure rules (`NodeState.on_replica`) in order,
journals what they all decided in one commit, then answers with one list. Each
message keeps its own meaning and its own answer: the submission still waits for its
own copy's "yes", and a message that gets none (a lost batch) is retried exactly as a
lost single message was (the submission tries the next node in rendezvous order; the
reconciling tick sends owed messages again).

Bad input: a batch that is not a list of 1..ACCEPT_BATCH well-formed messages is
refused whole with one error naming the field; an answer list that does not match
the messages counts as no answer for each. Who can do what: only a key holder can
send a batch, as it could send single messages; each message is still accepted from
the task's home alone (or whoever took the home role over).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from .. import model as m
from .. import wire
from ..node import events as ev
from ..node.replicas import ASK, HOLD, ReplicaMsg, replica_msg_from_wire, replica_msg_to_wire
from .net import TransportError
from .peerqueue import PeerQueues, too_big
from .peers import RemoteError

MAX_BATCH = 512  # messages per RPC (a hold carries a spec of ~1 KB)
NEWS_LINGER = 0.05  # seconds runner and release news wait for company (peerqueue.py)
ACCEPT_BATCH = 2048  # the most a receiver takes in one message
TIMEOUT = 2.0  # seconds for one batch's answer (what one message had)


class Driver(Protocol):
    """What the batches need of the driver (runtime/driver.py)."""

    cluster: Any
    io_counters: dict[str, int]
    log: Any
    state: Any

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None: ...
    async def execute_batch(self, instrs: list[ev.Instruction]) -> None: ...


def batch_from_wire(obj: Any) -> list[ReplicaMsg]:
    """The messages of a `replica_batch` (strict: one bad entry refuses all)."""
    if not isinstance(obj, list):
        raise wire.SchemaError("replica batch: field 'msgs' must be a list")
    if not 0 < len(obj) <= ACCEPT_BATCH:
        raise wire.SchemaError(f"replica batch: field 'msgs' holds {len(obj)} (1..{ACCEPT_BATCH})")
    return [replica_msg_from_wire(x) for x in obj]


def answers_from_wire(obj: Any, n: int) -> list[tuple[bool, str]]:
    """(ok, reason) per message sent; an entry that is not one counts as no answer."""
    if not isinstance(obj, list) or len(obj) != n:
        raise wire.SchemaError("replica batch: answers do not match the messages")
    out: list[tuple[bool, str]] = []
    for a in obj:
        ok = isinstance(a, dict) and a.get("ok") is True
        reason = a.get("reason") if isinstance(a, dict) else None
        out.append((ok, reason if isinstance(reason, str) else "malformed answer"))
    return out


@attrs.define(eq=False)
class _Waiting:
    """One message in a queue: a waiter's event (`send`), or a callback (`post`)."""

    msg: ReplicaMsg
    done: trio.Event | None = None
    then: Callable[[bool], None] | None = None
    ok: bool = False


class ReplicaOutbox:
    """The per-destination queues and their senders (one batch in flight per peer)."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        # runner and release news: nobody waits on them (a holder learns a task's runner
        # or end a moment later), so they linger to travel together where tasks start
        # and end one at a time (a draining queue: 1.0 RPC per message without it)
        self.q = PeerQueues[_Waiting](driver._spawn, self._answer, MAX_BATCH, NEWS_LINGER)
        # holds travel apart: a submission's answer waits for its copy, and must not
        # wait behind a batch of runner and release news about earlier tasks (that
        # doubled the added latency of a copy: ~10 ms per submission, one client)
        self.holds = PeerQueues[_Waiting](driver._spawn, self._answer, MAX_BATCH)
        # a holder's asks (node/copyasks.py) travel apart too: an agent before them
        # refuses the kind, and with it the whole batch, which must not hold other news
        self.asks = PeerQueues[_Waiting](driver._spawn, self._answer, MAX_BATCH)

    def _queue(self, msg: ReplicaMsg) -> PeerQueues[_Waiting]:
        return self.holds if msg.kind == HOLD else self.asks if msg.kind == ASK else self.q

    async def send(self, dest: m.NodeId, msg: ReplicaMsg) -> bool:
        """Deliver `msg` with whatever else is going to `dest`; True once it said yes."""
        done = trio.Event()
        w = _Waiting(msg, done=done)
        self._queue(msg).put(dest, w)
        await done.wait()
        return w.ok

    def post(self, dest: m.NodeId, msg: ReplicaMsg, then: Callable[[bool], None]) -> None:
        """Deliver `msg` as `send` does, and call `then(ok)` once answered (or lost):
        the reconciling tick's runner and release news, two per copy of every task,
        each waited in a task of its own with its own event before (issue 23: ~10 % of
        a busy home's loop)."""
        self._queue(msg).put(dest, _Waiting(msg, then=then))

    async def _answer(self, dest: m.NodeId, batch: list[_Waiting]) -> None:
        try:
            await self._send(dest, batch)
        finally:  # answered, refused or lost: each waiter goes on
            failed: BaseException | None = None
            for w in batch:
                if w.done is not None:
                    w.done.set()
                if w.then is not None:
                    try:
                        w.then(w.ok)
                    except Exception as e:  # a bug: raised once every waiter went on
                        failed = failed or e
            if failed is not None:
                raise failed

    async def _send(self, dest: m.NodeId, batch: list[_Waiting]) -> None:
        d = self.d
        c = d.io_counters
        c["replica_rpcs"] = c.get("replica_rpcs", 0) + 1
        c["replica_msgs"] = c.get("replica_msgs", 0) + len(batch)
        try:
            if d.cluster is None:
                raise TransportError("no cluster")
            msg = {"op": "replica_batch", "msgs": [replica_msg_to_wire(w.msg) for w in batch]}
            raw = await d.cluster.request(dest, msg, timeout=TIMEOUT)
            answers = answers_from_wire(raw.get("answers"), len(batch))
        except TransportError as e:
            if too_big(e, batch):  # too big for one frame: halve it
                half = len(batch) // 2
                await self._send(dest, batch[:half])
                await self._send(dest, batch[half:])
                return
            self._failed(dest, batch, e)
            return
        except (RemoteError, wire.WireError) as e:
            self._failed(dest, batch, e)
            return
        for w, (ok, reason) in zip(batch, answers, strict=True):
            w.ok = ok
            if not ok:
                d.log.info("replica.refused", dest=dest, task=w.msg.task_id, reason=reason)

    def _failed(self, dest: m.NodeId, batch: Sequence[_Waiting], e: Exception) -> None:
        self.d.io_counters["replica_rpc_failures"] = (
            self.d.io_counters.get("replica_rpc_failures", 0) + 1
        )
        self.d.log.debug("replica.batch_failed", dest=dest, msgs=len(batch), error=str(e))


async def serve_batch(d: Driver, req: dict[str, Any], sender: m.NodeId) -> dict[str, Any]:
    """Answer a peer's batch: each message through the replica rules in order, every
    journal write of the lot in one commit (awaited before the answer: a copy is
    acknowledged once journaled), then one list of answers."""
    msgs = batch_from_wire(req.get("msgs"))
    answers: list[dict[str, Any]] = []
    instrs: list[ev.Instruction] = []
    for msg in msgs:
        why, out = d.state.on_replica(sender, msg)
        answers.append({"ok": why is None, "reason": why})
        instrs += out
    await d.execute_batch(instrs)
    return {"answers": answers}
