"""The journal's fsync thread (swarm/runtime/syncthread.py): a call's value or its
exception comes back; a cancelled caller still waits for its call to end (it must not
believe a write synced that was not); one call at a time; the idle thread ends and a
later call starts another."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from swarm.runtime import syncthread
from swarm.runtime.syncthread import SyncThread


def test_value_and_exception_come_back_from_the_thread() -> None:
    st = SyncThread("t")
    where: list[str] = []

    def call() -> int:
        where.append(threading.current_thread().name)
        return 41 + 1

    def fail() -> None:
        raise OSError(5, "injected")

    async def main() -> None:
        assert await st.run(call) == 42
        with pytest.raises(OSError, match="injected"):
            await st.run(fail)
        assert await st.run(call) == 42  # the thread survived the exception

    try:
        trio.run(main)
    finally:
        st.close()
    assert where == ["t", "t"]
    assert st.calls == 3


def test_a_cancelled_caller_waits_for_its_call() -> None:
    st = SyncThread("t")
    release = threading.Event()
    ended: list[str] = []

    def slow() -> str:
        release.wait(5)
        ended.append("call")
        return "done"

    async def main() -> None:
        got: list[str] = []

        async def caller() -> None:
            got.append(await st.run(slow))
            ended.append("caller")

        async with trio.open_nursery() as n:
            n.start_soon(caller)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()  # the caller is shielded: it goes on waiting
            await trio.sleep(0)
            assert ended == []
            release.set()
        assert got == ["done"]

    try:
        trio.run(main)
    finally:
        st.close()
    assert ended == ["call", "caller"]


def test_one_call_at_a_time() -> None:
    st = SyncThread("t")
    release = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(st.run, lambda: release.wait(5))
            await trio.sleep(0.05)
            with pytest.raises(RuntimeError, match="one call at a time"):
                await st.run(lambda: None)
            release.set()

    try:
        trio.run(main)
    finally:
        st.close()


def test_an_idle_thread_ends_and_the_next_call_starts_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(syncthread, "IDLE_EXIT", 0.05)
    st = SyncThread("t")
    idents: list[int] = []

    def who() -> None:
        idents.append(threading.get_ident())

    async def main() -> None:
        await st.run(who)
        first = st._thread
        assert first is not None
        deadline = time.monotonic() + 5
        while first.is_alive() and time.monotonic() < deadline:
            await trio.sleep(0.01)
        assert not first.is_alive()
        assert st._thread is None
        await st.run(who)
        assert st._thread is not None and st._thread is not first

    try:
        trio.run(main)
    finally:
        st.close()
    assert len(idents) == 2
    assert st._thread is None and st._efd is None
