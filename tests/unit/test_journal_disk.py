"""The journal on a small or full disk, and its files' modes (issue #17, items 9, 11).

A full disk is simulated with sqlite's own limit (`PRAGMA max_page_count` on the
writer connection fails growth with SQLITE_FULL, the error a full filesystem gives),
so these run anywhere; tests/security/test_small_disk.py does it on a real 2 MB
filesystem with a real agent.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from swarm.runtime import journal as jmod
from swarm.runtime.journal import Journal, JournalError, PutKV


@asynccontextmanager
async def _running(path: Path) -> AsyncIterator[Journal]:
    j = Journal(path, node="n1")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.run)
            yield j
            nursery.cancel_scope.cancel()
    finally:
        j.close()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _pages(j: Journal) -> int:
    return int(j._wconn.execute("PRAGMA page_count").fetchone()[0])


def _full(j: Journal) -> None:
    """No page may be added to the database any more: what a full disk does."""
    j._wconn.execute(f"PRAGMA max_page_count={_pages(j)}")


def _room(j: Journal) -> None:
    j._wconn.execute("PRAGMA max_page_count=1073741823")


async def test_journal_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        async with _running(tmp_path / "journal.db") as j:
            await j.commit([PutKV("k", 1)])
            for name in ("journal.db", "journal.db-wal", "journal.db-shm"):
                assert _mode(tmp_path / name) == 0o600, name
    finally:
        os.umask(old)


def test_an_older_agents_loose_files_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES(1)")  # the WAL and shm stay while it is open
    files = [tmp_path / n for n in ("journal.db", "journal.db-wal", "journal.db-shm")]
    for p in files:
        p.chmod(0o644)
    try:
        j = Journal(path, node="n1")
        j.close()
    finally:
        conn.close()
    for p in files:
        if p.exists():
            assert _mode(p) == 0o600, p


@pytest.mark.parametrize(
    ("fs_bytes", "pages"),
    [
        (2 << 20, 64),  # a 2 MB state filesystem: a 256 KiB WAL
        (1 << 20, 32),  # never below WAL_MIN_PAGES
        (16 << 20, 512),
        (32 << 20, 1000),  # from 32 MB up: sqlite's own checkpoint rate
        (1 << 40, 1000),
    ],
)
def test_the_wal_takes_a_small_share_of_a_small_disk(fs_bytes: int, pages: int) -> None:
    assert jmod.wal_pages(fs_bytes, 4096) == pages


def test_the_writer_checkpoints_at_the_wal_budget(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.db", node="n1")
    try:
        c = j._wconn
        assert c.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == j.wal_pages
        assert c.execute("PRAGMA journal_size_limit").fetchone()[0] == j.wal_pages * 4096
        st = os.statvfs(tmp_path)
        assert j.wal_pages == jmod.wal_pages(st.f_blocks * st.f_frsize, 4096)
    finally:
        j.close()


async def test_a_full_disk_wedges_the_journal_until_a_write_lands(tmp_path: Path) -> None:
    async with _running(tmp_path / "journal.db") as j:
        await j.commit([PutKV("before", b"x" * 1000)])
        assert j.wedged is None
        _full(j)
        with pytest.raises(JournalError, match="no space left for the journal in") as ei:
            await j.commit([PutKV("big", b"x" * 200_000)])
        assert str(tmp_path) in str(ei.value)
        w = j.wedged
        assert w is not None and w.disk_full and w.failures >= 1
        assert "no space left" in w.error
        assert j.full_checkpoints >= 1  # a TRUNCATE checkpoint was tried before giving up
        # state records that must land are kept and retried; nothing is lost
        j.enqueue([PutKV("state", b"y" * 200_000)])
        await trio.sleep(0.05)
        assert j.wedged is not None
        _room(j)  # space returns
        with trio.fail_after(5):
            while j.wedged is not None:  # the retry (or a probe) lands, within a second
                await trio.sleep(0.05)
        await j.commit([PutKV("after", b"x" * 200_000)])
        kv = j.recover().kv
        assert set(kv) >= {"before", "state", "after"} and "big" not in kv


async def test_a_submission_is_not_refused_for_the_size_of_what_waits_for_retry(
    tmp_path: Path,
) -> None:
    """After a full disk, state records waiting to land again go in their own
    transaction: a small submission that fits lands even when they do not, and a
    newer record of the same key supersedes the one waiting."""
    async with _running(tmp_path / "journal.db") as j:
        _full(j)
        j.enqueue([PutKV("state", b"old" * 100_000), PutKV("other", b"y" * 300_000)])
        await trio.sleep(0.05)
        assert set(j._retry) == {"kv:state", "kv:other"}
        j._wconn.execute(f"PRAGMA max_page_count={_pages(j) + 4}")  # room for a little
        await j.commit([PutKV("small", 1), PutKV("state", b"new")])
        assert set(j._retry) == {"kv:other"}  # "state" was superseded, not rewritten
        _room(j)
        with trio.fail_after(5):
            while j._retry:
                await trio.sleep(0.05)
        kv = j.recover().kv
        assert kv["state"] == b"new" and kv["small"] == 1 and len(kv["other"]) == 300_000


async def test_a_wedged_journal_with_nothing_to_retry_clears_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a submission failed (nothing must land): a probe clears the wedge once
    space returns, so `swarm info` does not report a full disk forever."""
    monkeypatch.setattr(jmod, "PROBE_INTERVAL", 0.2)
    async with _running(tmp_path / "journal.db") as j:
        _full(j)
        with pytest.raises(JournalError):
            await j.commit([PutKV("big", b"x" * 200_000)])
        assert j.wedged is not None
        _room(j)
        with trio.fail_after(5):
            while j.wedged is not None:
                await trio.sleep(0.05)
        assert j.commits >= 1


async def test_a_full_write_is_tried_again_after_a_truncate_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLITE_FULL once (the WAL held the space): the TRUNCATE checkpoint runs and the
    same write lands, so the submitter never sees the error."""
    async with _running(tmp_path / "journal.db") as j:
        real = j._write_sync
        calls: list[int] = []

        def once_full(ops: list[jmod.Op]) -> None:
            calls.append(len(ops))
            if len(calls) == 1:
                err = sqlite3.OperationalError("database or disk is full")
                err.sqlite_errorcode = jmod.SQLITE_FULL  # type: ignore[attr-defined]
                raise err
            real(ops)

        monkeypatch.setattr(j, "_write_sync", once_full)
        await j.commit([PutKV("k", 1)])
        assert calls == [1, 1] and j.full_checkpoints == 1 and j.wedged is None
        assert j.recover().kv["k"] == 1
