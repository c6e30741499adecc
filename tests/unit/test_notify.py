"""sd_notify against a fake systemd: an AF_UNIX datagram socket we read from."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from swarm.runtime import notify


@pytest.fixture
def systemd(short_tmp: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(short_tmp / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setblocking(False)
    yield s, path
    s.close()


def _messages(s: socket.socket) -> list[list[str]]:
    out = []
    while True:
        try:
            out.append(s.recv(4096).decode().split("\n"))
        except BlockingIOError:
            return out


def test_ready_status_ping_stopping_reach_systemd(systemd: tuple[socket.socket, str]) -> None:
    s, path = systemd
    n = notify.Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("2 peers; 1 running")
    assert n.status("line one\nline two")
    assert n.ping()
    assert n.stopping("bye")
    assert _messages(s) == [
        ["READY=1", "STATUS=2 peers; 1 running"],
        ["STATUS=line one line two"],  # a newline must not start a new assignment
        ["WATCHDOG=1"],
        ["STOPPING=1", "STATUS=bye"],
    ]
    assert n.sent == 4 and n.failures == 0
    n.close()


def test_abstract_namespace_socket() -> None:
    name = f"swarm-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + name.encode())
    try:
        n = notify.Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert s.recv(100) == b"READY=1"
    finally:
        s.close()


def test_without_systemd_everything_is_a_no_op() -> None:
    n = notify.Notifier({})
    assert not n.enabled
    assert not n.ready() and not n.ping() and not n.stopping()
    assert n.sent == 0 and n.failures == 0


def test_undeliverable_is_counted_not_raised(short_tmp: Path) -> None:
    n = notify.Notifier({"NOTIFY_SOCKET": str(short_tmp / "nobody-listens")})
    assert not n.ready()
    assert n.failures == 1 and n.last_error


def test_watchdog_interval() -> None:
    pid = os.getpid()
    assert notify.watchdog_interval({}) is None
    assert notify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert notify.watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(pid)}) == 2.0
    # meant for another process (we inherited the environment): not ours to ping
    assert notify.watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert notify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert notify.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


@given(st.text(max_size=200))
def test_any_socket_value_is_safe(value: str) -> None:
    addr = notify.socket_address(value)
    assert addr is None or isinstance(addr, (str, bytes))


async def test_run_sends_ready_after_join_then_pings(
    systemd: tuple[socket.socket, str], autojump_clock: trio.testing.MockClock
) -> None:
    s, path = systemd
    n = notify.Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    joined = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: n.run(
                joined=joined.is_set,
                join_wait=30.0,
                status=lambda: "0 peers",
                status_interval=5.0,
                task_status=task_status,
            )
        )
        await trio.sleep(2.5)  # still waiting for a peer: pings, but no READY yet
        before = _messages(s)
        assert ["WATCHDOG=1"] in before and all("READY=1" not in m for m in before)
        joined.set()
        await trio.sleep(0.1)
        assert _messages(s)[0] == ["READY=1", "STATUS=0 peers"]
        await trio.sleep(6.0)
        after = _messages(s)
        assert after.count(["WATCHDOG=1"]) >= 5 and ["STATUS=0 peers"] in after
        nursery.cancel_scope.cancel()


async def test_run_gives_up_waiting_for_peers(
    systemd: tuple[socket.socket, str], autojump_clock: trio.testing.MockClock
) -> None:
    s, path = systemd
    n = notify.Notifier({"NOTIFY_SOCKET": path})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: n.run(joined=lambda: False, join_wait=5.0, status=lambda: "alone")
        )
        await trio.sleep(4.9)
        assert _messages(s) == []
        await trio.sleep(0.2)
        assert _messages(s) == [["READY=1", "STATUS=alone"]]
        nursery.cancel_scope.cancel()
