"""The client reports the agent's refusal, not "broken pipe", when the agent answered
and closed before reading the request (a uid over its connection share)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from swarm import wire
from swarm.client import AgentUnreachable, Client, RequestFailed


def _refusing_server(path: Path, reply: dict[str, object] | None) -> threading.Event:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    closed = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        if reply is not None:
            conn.sendall(wire.encode_frame(reply))
        conn.close()  # never reads the request
        srv.close()
        closed.set()

    threading.Thread(target=serve, daemon=True).start()
    return closed


def test_a_refusal_sent_before_the_request_is_read_is_what_the_client_raises(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sock"
    busy = {"v": wire.PROTOCOL_VERSION, "ok": False, "error": "busy", "message": "too many"}
    closed = _refusing_server(path, busy)
    with Client(path, timeout=5) as c:
        assert closed.wait(5)
        # a request bigger than the socket buffer, so the send itself meets the close
        with pytest.raises(RequestFailed) as e:
            c.call("info", pad="x" * (1 << 20))
    assert (e.value.code, e.value.message) == ("busy", "too many")


def test_a_close_without_an_answer_is_still_unreachable(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    closed = _refusing_server(path, None)
    with Client(path, timeout=5) as c:
        assert closed.wait(5)
        with pytest.raises(AgentUnreachable):
            c.call("info", pad="x" * (1 << 20))
