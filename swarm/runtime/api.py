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

MAX_CONNECTIONS = 2048


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
    ) -> None:
        self.path = path
        self.ops = ops
        self.group = group
        self.mode = mode
        self.log = log
        self.max_frame = max_frame
        self.stats: dict[str, int] = {
            "connections": 0,
            "requests": 0,
            "bad_requests": 0,
            "bad_frames": 0,
        }
        self._limit = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def _prepare_path(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
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

    async def _connection(self, stream: trio.SocketStream) -> None:
        if self._limit.available_tokens == 0:
            await _send(stream, _error("busy", "too many connections to the agent"))
            await stream.aclose()
            return
        async with self._limit, stream:
            self.stats["connections"] += 1
            try:
                cred = peer_cred(stream.socket)
            except OSError as e:
                self.log.warning("api.peercred_failed", error=str(e))
                return
            decoder = wire.FrameDecoder(self.max_frame)
            try:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    try:
                        reqs = decoder.feed(data)
                    except wire.WireError as e:
                        self.stats["bad_frames"] += 1
                        self.log.info("api.bad_frame", error=str(e), uid=cred.uid)
                        await _send(stream, _error(e.code, str(e)))
                        return
                    for req in reqs:
                        await self._dispatch(stream, req, cred)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

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
