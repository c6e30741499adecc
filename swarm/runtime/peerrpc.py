"""Peer RPCs over the cluster's encrypted port: a pooled client and the server side.

Requests address a peer by node id (its address comes from the membership view);
connections are kept and reused per peer, because a TCP connect, handshake and close
per request cost more than most requests. The server reads requests on one
connection until the peer closes it or it goes idle, and routes each by its `op` to
the table the agent installs (`runtime/routes.py`). Split from `peers.py`, which
drives the membership protocol over the same transport.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .. import model as m
from .. import wire
from ..cluster.membership import Membership
from ..logs import EventLog
from .net import Addr, FramedStream, RequestPlan, Transport, TransportError

RpcHandler = Callable[[dict[str, Any], m.NodeId, FramedStream], Awaitable[dict[str, Any] | None]]

POOL_PER_PEER = 8  # idle RPC connections kept per peer
IDLE_CONN_TIMEOUT = 60.0  # a server closes an RPC connection idle this long


class RemoteError(Exception):
    """A peer answered an RPC with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class PeerRpc:
    """The RPC half of `ClusterNode` (which inherits it): the client (`request`,
    `open_stream`) with its connection pool, and the server loop (`_serve`).

    It reads the node's transport, membership view, route table, counters and log,
    which `ClusterNode` sets up; they are declared here for the type checker.
    """

    node: m.NodeId
    transport: Transport | None
    membership: Membership | None
    rpc: dict[str, RpcHandler]
    counters: dict[str, int]
    log: EventLog
    _pool: dict[Addr, list[FramedStream]]

    def address_of(self, node: m.NodeId) -> Addr | None:
        ms = self.membership
        if ms is None:
            return None
        mb = ms.member(node)
        return None if mb is None else (mb.addr, mb.port)

    async def request(
        self, node: m.NodeId, obj: dict[str, Any], timeout: float = 5.0
    ) -> dict[str, Any]:
        """One RPC to a peer by node id. Raises TransportError (unknown node included).

        Connections are kept and reused per peer (a TCP connect, handshake and close per
        request cost more than the request). The transport's fault shim applies here as
        on `Transport.request`: a dropped request times out, a dropped reply fails.
        """
        addr = self.address_of(node)
        t = self.transport
        if addr is None or t is None:
            raise TransportError(f"unknown peer {node}")
        faults = t.faults
        plan = faults.plan_request() if faults is not None and faults.active else RequestPlan()
        msg = {"v": wire.PROTOCOL_VERSION, "from": self.node, "to": node, **obj}
        with trio.move_on_after(timeout):
            await trio.sleep(plan.delay)
            if plan.drop_request:
                t.counters["dropped_fault"] += 1
                await trio.sleep_forever()
            reply = await self._pooled_call(addr, msg, timeout)
            if plan.drop_reply:
                t.counters["dropped_fault"] += 1
                raise TransportError(f"{node}: reply dropped (fault shim)")
            if not isinstance(reply, dict):
                raise TransportError(f"{node}: malformed reply")
            if reply.get("error"):
                raise RemoteError(str(reply.get("error")), str(reply.get("message", "")))
            return reply
        raise TransportError(f"{node}: request timed out after {timeout}s")

    async def _pooled_call(self, addr: Addr, msg: dict[str, Any], timeout: float) -> Any:
        t = self.transport
        assert t is not None
        idle = self._pool.setdefault(addr, [])
        for attempt in range(2):
            fresh = not idle
            stream = idle.pop() if idle else await t.open_stream(addr, timeout=timeout)
            try:
                await stream.send(msg, timeout=timeout)
                reply = await stream.receive(timeout=timeout)
            except TransportError:
                await stream.aclose()
                if fresh or attempt:
                    raise
                continue  # a pooled connection the peer had closed: once more, fresh
            except BaseException:
                await stream.aclose()  # cancelled mid-call: the stream is out of step
                raise
            if len(idle) < POOL_PER_PEER:
                idle.append(stream)
            else:
                await stream.aclose()
            return reply
        raise TransportError(f"{addr[0]}:{addr[1]}: no connection")

    async def open_stream(
        self, node: m.NodeId, obj: dict[str, Any], timeout: float = 5.0
    ) -> FramedStream:
        addr = self.address_of(node)
        if addr is None or self.transport is None:
            raise TransportError(f"unknown peer {node}")
        s = await self.transport.open_stream(addr, timeout=timeout)
        await s.send(
            {"v": wire.PROTOCOL_VERSION, "from": self.node, "to": node, **obj}, timeout=timeout
        )
        return s

    async def _serve(self, stream: FramedStream, peer: Addr) -> None:
        """Serve requests on one connection until the peer closes it (or goes idle);
        a streaming handler (logs) takes the connection over and ends it."""
        first = True
        while True:
            try:
                req = await stream.receive(timeout=10.0 if first else IDLE_CONN_TIMEOUT)
            except TransportError:
                return
            first = False
            self.counters["rpc_in"] += 1
            try:
                if not isinstance(req, dict):
                    raise wire.SchemaError("rpc: expected a map")
                wire.check_version(req, "rpc")
                op = req.get("op")
                sender = req.get("from")
                if not isinstance(op, str) or not isinstance(sender, str):
                    raise wire.SchemaError("rpc: missing op or from")
                # the session is bound to this connection (net.py); this binds it to
                # the node id the sender meant, so it cannot be redirected
                to = req.pop("to", self.node)
                if to != self.node:
                    raise wire.SchemaError(f"rpc: meant for {to!r}, not this node")
                handler = self.rpc.get(op)
                if handler is None:
                    raise wire.SchemaError(f"rpc: unknown op {op!r}")
                reply = await handler(req, sender, stream)
            except wire.WireError as e:
                self.counters["rpc_errors"] += 1
                reply = {"error": e.code, "message": str(e)}
            except RemoteError as e:
                reply = {"error": e.code, "message": e.message}
            except TransportError:
                return
            except Exception as e:
                self.counters["rpc_errors"] += 1
                op_name = str(req.get("op") if isinstance(req, dict) else "")
                self.log.exception("cluster.rpc_failed", e, op=op_name)
                reply = {"error": "internal", "message": f"{type(e).__name__}: {e}"}
            if reply is None:
                return  # a streaming handler used the connection
            try:
                await stream.send(reply, timeout=10.0)
            except TransportError:
                return
