"""Blocking client for the agent's Unix socket (used by the CLI and by user code).

Deliberately synchronous and light to import (no trio): `swarm submit` is a short
process that should start fast, and user scripts should not need an event loop.

    from swarm.client import Client
    with Client() as c:
        tid = c.submit(["python", "train.py"], name="train")
        task = c.wait(tid)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import wire
from .paths import default_socket_path


class ClientError(Exception):
    pass


class AgentUnreachable(ClientError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot reach the swarm agent at {path}: {reason}")
        self.path = path


class RequestFailed(ClientError):
    """The agent answered with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Client:
    def __init__(
        self, path: str | os.PathLike[str] | None = None, timeout: float | None = None
    ) -> None:
        self.path = Path(path) if path is not None else default_socket_path()
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._decoder = wire.FrameDecoder()
        self._pending: list[Any] = []

    # ------------------------------------------------------------ plumbing

    def connect(self) -> None:
        if self._sock is not None:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(str(self.path))
        except FileNotFoundError:
            s.close()
            raise AgentUnreachable(self.path, "no socket there (is the agent running?)") from None
        except ConnectionRefusedError:
            s.close()
            raise AgentUnreachable(self.path, "connection refused (agent not running?)") from None
        except PermissionError:
            s.close()
            raise AgentUnreachable(
                self.path, "permission denied (are you in the agent's socket group?)"
            ) from None
        except OSError as e:
            s.close()
            raise AgentUnreachable(self.path, e.strerror or str(e)) from None
        self._sock = s

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._decoder = wire.FrameDecoder()
        self._pending = []

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, req: Mapping[str, Any]) -> None:
        self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(wire.encode_frame({"v": wire.PROTOCOL_VERSION, **req}))
        except OSError as e:
            self.close()
            raise AgentUnreachable(self.path, f"connection lost: {e}") from None

    def _recv(self) -> dict[str, Any]:
        assert self._sock is not None
        while not self._pending:
            try:
                data = self._sock.recv(1 << 16)
            except TimeoutError:
                raise
            except OSError as e:
                self.close()
                raise AgentUnreachable(self.path, f"connection lost: {e}") from None
            if not data:
                self.close()
                raise AgentUnreachable(self.path, "the agent closed the connection")
            try:
                self._pending.extend(self._decoder.feed(data))
            except wire.WireError as e:
                self.close()
                raise ClientError(f"bad reply from the agent: {e}") from None
        reply = self._pending.pop(0)
        if not isinstance(reply, dict):
            raise ClientError(f"unexpected reply from agent: {reply!r:.80}")
        if not reply.get("ok"):
            raise RequestFailed(str(reply.get("error", "error")), str(reply.get("message", "")))
        return reply

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self._send({"op": op, **{k: v for k, v in fields.items() if v is not None}})
        return self._recv()

    def stream(self, op: str, **fields: Any) -> Iterator[dict[str, Any]]:
        self._send({"op": op, **{k: v for k, v in fields.items() if v is not None}})
        while True:
            part = self._recv()
            yield part
            if not part.get("more"):
                return

    # ------------------------------------------------------------ operations

    def submit(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        weight: float | None = None,
        no_retry: bool = False,
        task_id: str | None = None,
        **extra: Any,
    ) -> str:
        """Submit a task; returns its id once the agent has journaled it."""
        if cwd is None:
            try:
                cwd = os.getcwd()
            except OSError:
                cwd = "/"
        reply = self.call(
            "submit",
            argv=list(argv),
            name=name,
            env=dict(env or {}),
            cwd=cwd,
            weight=weight,
            no_retry=no_retry or None,
            id=task_id,
            **extra,
        )
        return str(reply["id"])

    def status(self, task_id: str) -> dict[str, Any]:
        return self.call("status", id=task_id)["task"]  # type: ignore[no-any-return]

    def list(self, all: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        return self.call("list", all=all, limit=limit)["tasks"]  # type: ignore[no-any-return]

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self.call("cancel", id=task_id)

    def wait(self, task_id: str, timeout: float | None = None) -> dict[str, Any]:
        return self.call("wait", id=task_id, timeout=timeout)["task"]  # type: ignore[no-any-return]

    def logs(self, task_id: str, *, stderr: bool = False, follow: bool = False) -> Iterator[bytes]:
        for part in self.stream(
            "logs", id=task_id, stream="stderr" if stderr else "stdout", follow=follow
        ):
            data = part.get("data")
            if data:
                yield bytes(data)

    def info(self) -> dict[str, Any]:
        return self.call("info")
