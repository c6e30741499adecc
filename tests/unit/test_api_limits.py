"""The submit socket's connection limits: per-uid caps, root's reserve, idle close.

A real ApiServer on a Unix socket in a temp dir, under trio's autojump clock (the idle
timeout is minutes of virtual time, seconds of none)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing

from swarm import wire
from swarm.runtime import api
from swarm.runtime.api import ApiServer, Ops, PeerCred


async def _info(f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
    f.done()
    return {"uid": cred.uid}


def _server(path: Path, **kw: Any) -> ApiServer:
    return ApiServer(path, Ops(unary={"info": _info}), **kw)


def test_admission_caps_per_uid_and_keeps_room_for_root() -> None:
    s = _server(Path("/nonexistent/sock"), max_connections=4, max_per_uid=2)
    assert s._admit(1001) is None and s._admit(1001) is None
    assert "from uid 1001 (at most 2)" in (s._admit(1001) or "")
    assert s._admit(1002) is None and s._admit(1002) is None
    assert s._admit(1003) == "too many connections to the agent"  # all users' 4 taken
    for _ in range(api.ROOT_RESERVE):  # root is never crowded out by users
        assert s._admit(0) is None
    s._release(1001)
    assert s._admit(1003) is None  # a released slot is free again
    assert s._open_users == 4


async def _request(sock: trio.SocketStream) -> dict[str, Any]:
    await sock.send_all(wire.encode_frame({"v": wire.PROTOCOL_VERSION, "op": "info"}))
    dec = wire.FrameDecoder()
    while True:
        data = await sock.receive_some(65536)
        assert data, "closed before the reply"
        got = dec.feed(data)
        if got:
            return dict(got[0])


async def _idle_scenario() -> None:
    with tempfile.TemporaryDirectory(prefix="sw-") as d:
        path = Path(d) / "sock"
        s = _server(path, idle_timeout=120.0)
        async with trio.open_nursery() as n:
            await n.start(s.serve)
            idle = await trio.open_unix_socket(str(path))
            active = await trio.open_unix_socket(str(path))
            assert (await _request(active))["ok"] is True
            for _ in range(5):  # a request every 60 s keeps a connection open
                await trio.sleep(60)
                assert (await _request(active))["uid"] == os.getuid()
            # the idle one was closed by the agent within 1.25 timeouts
            with trio.fail_after(60):
                assert await idle.receive_some(100) == b""
            assert s.stats["idle_closed"] == 1
            await idle.aclose()
            await active.aclose()
            n.cancel_scope.cancel()


def test_idle_connections_are_closed_and_busy_ones_kept() -> None:
    # virtual time jumps only when nothing has run for 50 ms of real time: never while
    # a request is on its way through the (real) socket
    trio.run(_idle_scenario, clock=trio.testing.MockClock(autojump_threshold=0.05))
