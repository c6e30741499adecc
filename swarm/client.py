"""Blocking client for the agent's Unix socket (used by the CLI and by user code).

Deliberately synchronous and light to import (no trio): `swarm submit` is a short
process that should start fast, and user scripts should not need an event loop.

    from swarm.client import Client
    with Client() as c:
        tid = c.submit(["python", "train.py"], name="train")
        task = c.wait(tid)
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import limits as lim
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


class InvalidRequest(RequestFailed):
    """Refused here, before sending: a field the agent would refuse, or one that cannot
    even be encoded (an integer past 64 bits, a request over the frame limit)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid", message)


def _number(
    req: Mapping[str, Any],
    key: str,
    *,
    integer: bool,
    lo_open: float,
    hi: float,
    unit: str = "",
    top: str | None = None,
    name: str | None = None,
) -> None:
    v = req.get(key)
    key = name or key
    if v is None:
        return
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"submit: {key} must be {kind}, got {type(v).__name__}")
    if isinstance(v, float) and not math.isfinite(v):
        raise InvalidRequest(f"submit: {key} must be a finite number, got {v}")
    if not (v > lo_open and v <= hi):
        shown = f"a {v.bit_length()}-bit integer" if isinstance(v, int) and v > 1e15 else f"{v:g}"
        low = "0 or more" if lo_open < 0 else "> 0"
        top = top or (f"{int(hi)}" if integer else f"{hi:g}")
        raise InvalidRequest(f"submit: {key} must be {low} and <= {top}{unit}, got {shown}")


_GANG_KEYS = {
    "gang_mode": "mode",
    "min_available": "min_available",
    "gang_restart": "restart",
    "gang_timeout": "timeout",
}


def gang_request(extra: dict[str, Any]) -> None:
    """`gang=N` and its options (gang_mode, min_available, gang_restart, gang_timeout)
    as the request's one `gang` map, in place."""
    opts = {w: extra.pop(k) for k, w in _GANG_KEYS.items() if extra.get(k) is not None}
    gang = extra.get("gang")
    if gang is None:
        if opts:
            raise InvalidRequest(f"submit: {', '.join(opts)} without gang=N")
        return
    if isinstance(gang, Mapping):
        extra["gang"] = {**gang, **opts}
        return
    if isinstance(gang, bool) or not isinstance(gang, int):
        raise InvalidRequest(f"submit: gang must be a number of members, got {gang!r:.40}")
    if opts.get("mode") == "nonstrict" and "min_available" not in opts:
        opts["min_available"] = gang
    extra["gang"] = {"size": gang, **opts}


def check_submit(req: Mapping[str, Any]) -> None:
    """The agent's size and number bounds (swarm.limits), checked before sending:
    raises InvalidRequest naming the field. Other rules (env names, ids, GPU
    requests) are left to the agent, whose answer names the field as well."""
    argv = req.get("argv")
    if isinstance(argv, (list, tuple)):
        total = sum(len(a) for a in argv if isinstance(a, str))
        if total > lim.MAX_ARGV_BYTES:
            raise InvalidRequest(
                f"submit: argv longer than 1 MiB ({total} characters); pass large data in a file"
            )
    _number(req, "weight", integer=False, lo_open=0.0, hi=lim.MAX_WEIGHT)
    _number(req, "reserve_shares", integer=True, lo_open=-1, hi=lim.MAX_RESERVE_SHARES)
    _number(req, "cpu", integer=False, lo_open=0.0, hi=lim.MAX_CPU, unit=" cores")
    _number(req, "mem", integer=True, lo_open=0, hi=lim.MAX_MEM, top="1 EiB")
    _number(req, "expected_runtime", integer=False, lo_open=0.0, hi=lim.MAX_EXPECTED_RUNTIME)
    gpu = req.get("gpu")
    if isinstance(gpu, Mapping):
        for k, hi in (
            ("core", 100 * 1024),
            ("memory_bytes", lim.MAX_MEM),
            ("memory_ratio", 100 * 1024),
        ):
            _number(gpu, k, integer=True, lo_open=0, hi=hi, name=f"gpu {k}")


def encode_request(req: Mapping[str, Any]) -> bytes:
    """One request frame; a field that cannot be encoded, or a request over the
    agent's frame limit, is an InvalidRequest naming the (largest) field."""
    msg = {"v": wire.PROTOCOL_VERSION, **req}
    op = str(req.get("op", "request"))
    try:
        return wire.encode_frame(msg)
    except wire.FrameTooLarge:
        sizes = {k: len(_packed(v)) for k, v in req.items()}
        big = max(sizes, key=lambda k: sizes[k])
        raise InvalidRequest(
            f"{op}: request larger than the agent accepts ({lim.MAX_FRAME >> 20} MiB); "
            f"field {big!r} alone is {sizes[big]} bytes"
        ) from None
    except (OverflowError, TypeError, ValueError) as e:
        for k, v in req.items():
            try:
                wire.pack(v)
            except (OverflowError, TypeError, ValueError):
                raise InvalidRequest(f"{op}: field {k!r} cannot be sent: {e}") from None
        raise InvalidRequest(f"{op}: request cannot be sent: {e}") from None


def _packed(v: Any) -> bytes:
    try:
        return wire.pack(v)
    except (OverflowError, TypeError, ValueError):
        return b""


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
        frame = encode_request(req)
        self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(frame)
        except OSError as e:
            # An agent that refuses a connection (too many from one uid) answers
            # before reading the request and closes; the answer is still queued
            # on our side, and it says why, which "broken pipe" does not.
            if self._read_refusal():
                return
            self.close()
            raise AgentUnreachable(self.path, f"connection lost: {e}") from None

    def _read_refusal(self) -> bool:
        """After a failed send, take a reply the agent queued before it closed."""
        assert self._sock is not None
        data = b""
        try:
            self._sock.setblocking(False)
            while chunk := self._sock.recv(1 << 16):
                data += chunk
        except OSError:
            pass
        try:
            self._pending.extend(self._decoder.feed(data))
        except wire.WireError:
            return False
        if not self._pending:
            return False
        self._sock.close()
        self._sock = None
        self._decoder = wire.FrameDecoder()
        return True

    def _recv(self) -> dict[str, Any]:
        while not self._pending:
            if self._sock is None:
                raise AgentUnreachable(self.path, "the agent closed the connection")
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

    def submit(self, argv: Sequence[str], **fields: Any) -> str:
        """Submit a task; returns its id once the agent has journaled it. The fields
        are `submit_answer`'s (name, env, cwd, weight, no_retry, task_id, and the
        request's others: gang, array, after, ...)."""
        return str(self.submit_answer(argv, **fields)["id"])

    def submit_answer(
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
    ) -> dict[str, Any]:
        """Submit a task; the agent's whole answer once it has journaled it: `id`, and
        `replicas`, how many other nodes journaled a copy of the task before the
        answer (none for an array, a gang or a task with --after, which need their
        home).

        `gang=N` (issue 22) submits N members of the command that start together:
        with `gang_mode="nonstrict"` and `min_available=M` at least M of them; with
        `gang_restart=True` a failed gang starts again as a whole; `gang_timeout` fails
        it when it is not running after that many seconds. The id is the gang's; its
        members are ID.0 .. ID.N-1 (docs/gang.md)."""
        gang_request(extra)
        if cwd is None:
            try:
                cwd = os.getcwd()
            except OSError:
                cwd = "/"
        fields: dict[str, Any] = dict(
            argv=list(argv),
            name=name,
            env=dict(env or {}),
            cwd=cwd,
            weight=weight,
            no_retry=no_retry or None,
            id=task_id,
            **extra,
        )
        check_submit(fields)
        return self.call("submit", **fields)

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
            if part.get("missing"):
                raise RequestFailed(
                    "gone",
                    f"the {'stderr' if stderr else 'stdout'} of {task_id} is no longer kept"
                    " where it ran (removed with its record after keep-finished, or cleaned up)",
                )

    def info(self) -> dict[str, Any]:
        return self.call("info")
