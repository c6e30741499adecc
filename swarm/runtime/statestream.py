"""A task's state directory and its stream between nodes: the mechanics of a move.

The source scans the directory (parents first; fifos and other special files are
skipped) and streams it over the encrypted transport: entries, then chunks with a
sha256 each, then an end frame with the digest of the digests (cluster/migrate.py
holds the messages and the receiver's checks). Reading the next chunk, in a worker
thread, overlaps sending the current one.

The target writes into a fresh staging directory (below `.incoming` in the state
root) while it receives, refuses a stream larger than its free disk (less a reserve),
and only once everything verified: fsyncs, gives the tree to the task's user (bottom
up, lchown) and renames it in place of the task's state directory. A stream that
breaks or does not verify leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import trio

from .. import wire
from ..cluster import migrate as mx
from .clock import Clock
from .net import FramedStream, TransportError, collapse_single_group
from .peers import ClusterNode

INCOMING_DIR = ".incoming"
STREAM_TIMEOUT = 15.0  # seconds one state frame may take to go out or come in
DISK_RESERVE = 256 << 20  # bytes a target keeps free when accepting state

Entry = mx.Dir | mx.File | mx.Link


class MigrationError(Exception):
    """A step of a migration failed; the task stays (or restarts) at the source."""


# ------------------------------------------------------------------ files


def dir_size(root: Path) -> int:
    """Bytes of regular files under `root` (symlinks not followed); 0 if absent."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def has_state(root: Path) -> bool:
    try:
        with os.scandir(root) as it:
            return any(True for _ in it)
    except OSError:
        return False


def scan_state(root: Path) -> list[Entry]:
    """The entries to send, parents first; other file types (fifos...) are skipped."""
    out: list[Entry] = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        keep = []
        for d in sorted(dirnames):
            p = os.path.join(dirpath, d)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out.append(mx.Link(prefix + d, os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(mx.Dir(prefix + d, st.st_mode & 0o7777))
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out.append(mx.Link(prefix + name, os.readlink(p)))
            elif stat.S_ISREG(st.st_mode):
                out.append(mx.File(prefix + name, st.st_mode & 0o7777, st.st_size))
    return out


def _read_chunk(fh: IO[bytes], n: int) -> tuple[bytes, bytes]:
    data = fh.read(n)
    return data, hashlib.sha256(data).digest()


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give a staged state tree to its task's user. Bottom-up, the root last: while a
    path is changed, every directory above it is still the agent's, so the user cannot
    swap a directory on the way for a symlink; lchown never follows the last one."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), uid, gid)
    os.lchown(root, uid, gid)


def install_state(staging: Path, final: Path, owner: tuple[int, int] | None) -> None:
    """Put a verified staging directory in place of `final`, durably."""
    _fsync_tree(staging)
    if owner is not None:
        _chown_tree(staging, *owner)
    final.parent.mkdir(parents=True, exist_ok=True)
    old: Path | None = None
    if os.path.lexists(final):
        old = final.with_name(f"{final.name}.old-{secrets.token_hex(4)}")
        os.rename(final, old)
    os.rename(staging, final)
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_tree(path: Path) -> None:
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


class _Writer:
    """Applies a StateReceiver's actions inside one staging directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fh: IO[bytes] | None = None

    async def apply(self, a: mx.Action) -> None:
        if isinstance(a, mx.MakeDir):
            await trio.to_thread.run_sync(os.mkdir, self.root / a.path, a.mode)
        elif isinstance(a, mx.OpenFile):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = await trio.to_thread.run_sync(os.open, self.root / a.path, flags, a.mode)
            self.fh = os.fdopen(fd, "wb")
        elif isinstance(a, mx.Write):
            assert self.fh is not None
            await trio.to_thread.run_sync(self.fh.write, a.data)
        elif isinstance(a, mx.CloseFile):
            fh, self.fh = self.fh, None
            if fh is not None:
                await trio.to_thread.run_sync(_close_synced, fh)
        elif isinstance(a, mx.MakeLink):
            await trio.to_thread.run_sync(os.symlink, a.target, self.root / a.path)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _close_synced(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


# ------------------------------------------------------------------ sending


async def read_entries(sdir: Path) -> list[Entry]:
    try:
        return await trio.to_thread.run_sync(scan_state, sdir)
    except OSError as e:
        raise MigrationError(f"cannot read the state dir: {e}") from None


async def send_state(
    cluster: ClusterNode,
    target: str,
    begin: mx.Begin,
    sdir: Path,
    entries: list[Entry],
    *,
    timeout: float,
) -> None:
    """Open the state stream to `target` and send the entries; MigrationError unless
    the target verified and installed all of it."""
    try:
        stream = await cluster.open_stream(
            target,
            {"op": "migrate", "kind": "state", "begin": mx.begin_to_wire(begin)},
            timeout=timeout,
        )
    except TransportError as e:
        raise MigrationError(f"cannot reach {target}: {e}") from None
    async with stream:
        try:
            reply = await _stream_entries(stream, sdir, entries, begin.total)
        except TransportError as e:
            raise MigrationError(f"the stream to {target} broke: {e}") from None
        except OSError as e:
            raise MigrationError(f"cannot read the state: {e}") from None
    if not isinstance(reply, dict) or not reply.get("ok"):
        why = reply.get("reason") if isinstance(reply, dict) else "a malformed reply"
        raise MigrationError(f"{target} rejected the state: {why}")


async def _stream_entries(
    stream: FramedStream, sdir: Path, entries: list[Entry], total: int
) -> Any:
    """Send the entries and their data; reading the next chunk (in a thread) overlaps
    sending the current one. Returns the target's answer."""
    send_ch, recv_ch = trio.open_memory_channel[mx.Frame](4)

    async def produce() -> None:
        whole = hashlib.sha256()  # over the chunk digests, in order
        seq = 0
        async with send_ch:
            for e in entries:
                await send_ch.send(e)
                if not isinstance(e, mx.File) or e.size == 0:
                    continue
                fh = await trio.to_thread.run_sync(open, sdir / e.path, "rb")
                try:
                    left = e.size
                    while left > 0:
                        n = min(mx.CHUNK, left)
                        data, sha = await trio.to_thread.run_sync(_read_chunk, fh, n)
                        if not data:
                            raise MigrationError(f"{e.path} shrank while it was sent")
                        whole.update(sha)
                        await send_ch.send(mx.Chunk(seq, data, sha))
                        seq += 1
                        left -= len(data)
                finally:
                    fh.close()
            await send_ch.send(mx.End(len(entries), total, whole.digest()))

    async with collapse_single_group(), trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        async with recv_ch:
            async for fr in recv_ch:
                await stream.send(mx.frame_to_wire(fr), timeout=STREAM_TIMEOUT)
    # the target fsyncs and installs before it answers
    return await stream.receive(timeout=60.0 + total / 20e6)


# ------------------------------------------------------------------ receiving


async def receive_state(
    stream: FramedStream,
    begin: mx.Begin,
    *,
    root: Path,
    final: Path,
    owner: Callable[[], tuple[int, int] | None],
    clock: Clock,
) -> tuple[int, float]:
    """Receive a state stream into a staging directory below `root`, verify it and
    install it as `final`, given to `owner()` (uid, gid; None: the agent's): (bytes
    received, trio time the install began). On any
    failure the staging directory is removed and the error raised."""
    staging = root / INCOMING_DIR / f"{begin.task_id}.{secrets.token_hex(4)}"
    writer = _Writer(staging)
    send_ch, recv_ch = trio.open_memory_channel[mx.Action](8)

    async def write_all() -> None:  # writing overlaps receiving the next frames
        async with recv_ch:
            async for a in recv_ch:
                await writer.apply(a)

    try:
        await trio.to_thread.run_sync(lambda: staging.mkdir(parents=True))
        free = (await trio.to_thread.run_sync(shutil.disk_usage, root)).free
        rx = mx.StateReceiver(begin, max_bytes=max(0, free - DISK_RESERVE))
        async with collapse_single_group(), trio.open_nursery() as nursery:
            nursery.start_soon(write_all)
            async with send_ch:
                while not rx.done:
                    obj = await stream.receive(timeout=STREAM_TIMEOUT)
                    for a in rx.feed(wire.decode_with(mx.frame_from_wire, obj)):
                        await send_ch.send(a)
        writer.close()
        t_install = clock.now()
        await trio.to_thread.run_sync(install_state, staging, final, owner())
    except BaseException:
        writer.close()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(remove_tree, staging)
        raise
    return rx.bytes, t_install
