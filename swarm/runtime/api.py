"""The local submit socket: a Unix stream socket speaking swarm.wire frames.

Request:  {"v": 1, "op": "<name>", ...fields}
Reply:    {"v": 1, "ok": true, ...}  or  {"v": 1, "ok": false, "error": code, "message": text}
Streams:  several {"ok": true, "more": true, ...} frames, then a final frame without "more".

Every request is validated by its op handler; a bad request gets an error reply and
the connection stays usable. Bytes that cannot be framed (garbage, an oversized
length prefix) get one error reply and the connection is closed, since the stream is
no longer in sync. Nothing a client sends can crash the agent: unexpected handler
exceptions are logged and answered with an "internal" error.

The caller's identity comes from SO_PEERCRED, never from the request.
"""

from __future__ import annotations

import errno
import grp
import os
import socket as _socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import wire
from ..logs import NULL_LOG, EventLog
from .clock import Clock

# Connection limits: one local user must not lock every other user (or root) out by
# holding connections open. Each uid gets at most MAX_PER_UID at once; all non-root
# users together MAX_CONNECTIONS; root and the agent's own user have ROOT_RESERVE more
# that nobody else can take. A connection idle between requests for IDLE_TIMEOUT
# seconds is closed (a request in progress, such as `swarm wait` or `logs --follow`,
# is not idle).
MAX_CONNECTIONS = 2048
MAX_PER_UID = 128
ROOT_RESERVE = 256
IDLE_TIMEOUT = 120.0


@attrs.define(eq=False)
class _Conn:
    """An open submit-socket connection, as the idle sweep sees it."""

    scope: trio.CancelScope
    last: float  # trio time its last request finished (or it connected)
    busy: bool = False  # a request is being served (a wait, a followed log)


@attrs.frozen
class PeerCred:
    pid: int
    uid: int
    gid: int


class RequestError(Exception):
    """A handler's way to answer with a clear error (not a crash)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Reply = dict[str, Any]
Handler = Callable[[wire.Fields, PeerCred], Awaitable[Reply]]
StreamHandler = Callable[[wire.Fields, PeerCred], AsyncIterator[Reply]]


@attrs.define
class Ops:
    unary: dict[str, Handler] = attrs.field(factory=dict)
    stream: dict[str, StreamHandler] = attrs.field(factory=dict)


def peer_cred(sock: trio.socket.SocketType) -> PeerCred:
    fmt = "3i"
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    return PeerCred(pid, uid, gid)


def _error(code: str, message: str) -> Reply:
    return {"v": wire.PROTOCOL_VERSION, "ok": False, "error": code, "message": message}


def new_stats() -> dict[str, int]:
    """The server's counters (ApiServer.stats)."""
    return {
        "connections": 0,
        "requests": 0,
        "bad_requests": 0,
        "bad_frames": 0,
        "refused_busy": 0,
        "idle_closed": 0,
    }


class ApiServer:
    def __init__(
        self,
        path: Path,
        ops: Ops,
        *,
        group: str | None = None,
        mode: int = 0o660,
        log: EventLog = NULL_LOG,
        max_frame: int = wire.MAX_FRAME,
        max_connections: int = MAX_CONNECTIONS,
        max_per_uid: int = MAX_PER_UID,
        idle_timeout: float = IDLE_TIMEOUT,
        clock: Clock | None = None,
        stats: dict[str, int] | None = None,
    ) -> None:
        self.path = path
        self.clock = clock or Clock.system()
        self.ops = ops
        self.group = group
        self.mode = mode
        self.log = log
        self.max_frame = max_frame
        self.stats = new_stats() if stats is None else stats  # given: read by runtime/stats
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.idle_timeout = idle_timeout
        self._open: dict[int, int] = {}  # uid -> connections open now
        self._open_users = 0  # connections of uids other than root and the agent's
        self._refusals_logged = float("-inf")  # trio time of the last "busy" log line
        self._conns: set[_Conn] = set()  # open connections, for the idle sweep

    async def _prepare_path(self) -> None:
        parent = self.path.parent
        if not parent.is_dir():
            # made here, not by systemd (RuntimeDirectory=): whoever may use the socket
            # must reach it, whatever the agent's own umask (0077)
            parent.mkdir(parents=True, exist_ok=True)
            parent.chmod(0o755)
        if self.path.exists() or self.path.is_symlink():
            probe = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                await probe.connect(str(self.path))
            except OSError as e:
                if e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                    raise
                self.path.unlink(missing_ok=True)  # stale socket of a dead agent
            else:
                raise OSError(
                    errno.EADDRINUSE, f"another agent is already listening on {self.path}"
                )
            finally:
                probe.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._prepare_path()
        sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(self.path))
        finally:
            os.umask(old)
        if self.group:
            try:
                gid = grp.getgrnam(self.group).gr_gid
                os.chown(self.path, -1, gid)
            except (KeyError, PermissionError) as e:
                self.log.warning("api.socket_group", group=self.group, error=str(e))
        os.chmod(self.path, self.mode)
        sock.listen(512)
        listener = trio.SocketListener(sock)
        try:
            async with listener:
                task_status.started()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._close_idle)
                    while True:
                        try:
                            stream = await listener.accept()
                        except OSError as e:  # EMFILE and friends: back off, keep serving
                            self.log.warning("api.accept_failed", error=str(e))
                            await trio.sleep(0.1)
                            continue
                        nursery.start_soon(self._connection, stream)
        finally:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass

    def _admit(self, uid: int) -> str | None:
        """Take a connection slot for `uid`, or say why not (pure bookkeeping)."""
        privileged = uid in (0, os.getuid())
        n = self._open.get(uid, 0)
        if privileged:
            if n >= self.max_connections + ROOT_RESERVE:
                return "too many connections to the agent"
        elif n >= self.max_per_uid:
            return f"too many connections from uid {uid} (at most {self.max_per_uid})"
        elif self._open_users >= self.max_connections:
            return "too many connections to the agent"
        self._open[uid] = n + 1
        if not privileged:
            self._open_users += 1
        return None

    def _release(self, uid: int) -> None:
        n = self._open.get(uid, 0) - 1
        if n > 0:
            self._open[uid] = n
        else:
            self._open.pop(uid, None)
        if uid not in (0, os.getuid()):
            self._open_users -= 1

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            cred = peer_cred(stream.socket)
        except OSError as e:
            self.log.warning("api.peercred_failed", error=str(e))
            await stream.aclose()
            return
        refusal = self._admit(cred.uid)
        if refusal is not None:
            self.stats["refused_busy"] += 1
            now = self.clock.now()
            if now - self._refusals_logged >= 10.0:  # one line per 10 s at most
                self._refusals_logged = now
                self.log.warning("api.busy", uid=cred.uid, reason=refusal)
            with trio.move_on_after(1.0):
                await _send(stream, _error("busy", refusal))
            await stream.aclose()
            return
        try:
            await self._serve_connection(stream, cred)
        finally:
            self._release(cred.uid)

    async def _serve_connection(self, stream: trio.SocketStream, cred: PeerCred) -> None:
        async with stream:
            self.stats["connections"] += 1
            decoder = wire.FrameDecoder(self.max_frame)
            # one cancel scope per connection, cancelled by _close_idle: a timeout
            # around every receive would cost a scope on every request's path
            with trio.CancelScope() as scope:
                conn = _Conn(scope, self.clock.now())
                self._conns.add(conn)
                try:
                    while True:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        conn.busy = True
                        try:
                            reqs = decoder.feed(data)
                        except wire.WireError as e:
                            self.stats["bad_frames"] += 1
                            self.log.info("api.bad_frame", error=str(e), uid=cred.uid)
                            await _send(stream, _error(e.code, str(e)))
                            return
                        for req in reqs:
                            await self._dispatch(stream, req, cred)
                        conn.busy = False
                        conn.last = self.clock.now()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                finally:
                    self._conns.discard(conn)

    async def _close_idle(self) -> None:
        """Close connections idle between requests for idle_timeout (checked a few
        times per timeout: a connection lives between 1 and 1.25 timeouts idle)."""
        while True:
            await trio.sleep(self.idle_timeout / 4)
            now = self.clock.now()
            for conn in list(self._conns):
                if not conn.busy and now - conn.last >= self.idle_timeout:
                    self._conns.discard(conn)
                    self.stats["idle_closed"] += 1
                    conn.scope.cancel()

    async def _dispatch(self, stream: trio.SocketStream, req: Any, cred: PeerCred) -> None:
        self.stats["requests"] += 1
        try:
            wire.check_version(req, "request")
            op = req.get("op")
            if not isinstance(op, str):
                raise wire.SchemaError("request: missing field 'op'")
            fields = wire.Fields(req, f"{op} request", ignore=("v", "op"))
            if op in self.ops.unary:
                reply = await self.ops.unary[op](fields, cred)
                await _send(stream, {"v": wire.PROTOCOL_VERSION, "ok": True, **reply})
                return
            if op in self.ops.stream:
                async for part in self.ops.stream[op](fields, cred):
                    await _send(stream, {"v": wire.PROTOCOL_VERSION, "ok": True, **part})
                return
            known = ", ".join(sorted([*self.ops.unary, *self.ops.stream]))
            raise RequestError("unknown_op", f"unknown operation {op!r} (known: {known})")
        except wire.WireError as e:
            self.stats["bad_requests"] += 1
            await _send(stream, _error(e.code, str(e)))
        except RequestError as e:
            await _send(stream, _error(e.code, e.message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except trio.Cancelled:
            raise
        except Exception as e:
            self.log.exception(
                "api.handler_crashed", e, op=str(req.get("op") if isinstance(req, dict) else None)
            )
            await _send(stream, _error("internal", f"internal error: {type(e).__name__}: {e}"))


async def _send(stream: trio.SocketStream, reply: Mapping[str, Any]) -> None:
    try:
        frame = wire.encode_frame(reply)
    except wire.FrameTooLarge as e:
        frame = wire.encode_frame(_error("reply_too_large", str(e)))
    await stream.send_all(frame)
