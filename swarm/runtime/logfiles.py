"""Per-task output files, created ahead of need.

Creating a file allocates an inode, and on ext4 that costs anywhere from 20 us to
about a millisecond (cold block-group bitmaps, a busy journal: measured on this
project's build VM, see docs/benchmarks.md). A task start needs two, right between
the submission's commit and the process start. Renaming a file within the same
filesystem costs ~20 us whatever the block group, so the agent keeps a few empty
files ready (and open) in `<log dir>/.spare/`, refilled by a worker thread when they
run low, and a task start renames two of them into place and hands their descriptors
to the process. A task whose files already exist (a retry, a migrated task) appends
to them; with no spare left, a file is created as before. Nothing here is durable
state: a spare is an empty file, adopted again after a restart.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections import deque
from pathlib import Path

import trio

from .executor import LOG_FLAGS, OpenLogs, open_log, open_logs

SPARE_DIR = ".spare"


class LogFiles:
    def __init__(self, log_dir: Path, *, keep: int = 16) -> None:
        self.log_dir = log_dir
        self.spare_dir = log_dir / SPARE_DIR
        self._log_dir_s = os.fspath(log_dir)
        self._spare_dir_s = os.fspath(self.spare_dir)
        self.keep = keep  # refill up to this many; below half, refill
        self.spares: deque[tuple[str, int]] = deque()  # name, open descriptor
        self.created = 0  # spare files made by the refiller
        self.used = 0  # task files that were spares renamed into place
        self._names = itertools.count()
        self._token = secrets.token_hex(4)  # spare names never repeat across restarts
        self._low = trio.Event()
        self._adopt()

    def _adopt(self) -> None:
        """Take over the empty spares a previous run left; other files there go."""
        try:
            self.spare_dir.mkdir(parents=True, exist_ok=True)
            entries = list(os.scandir(self.spare_dir))
        except OSError:
            return
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False) and e.stat().st_size == 0:
                    self.spares.append((e.name, os.open(e.path, LOG_FLAGS)))
                else:
                    os.unlink(e.path)
            except OSError:
                pass

    def open(self, path: Path) -> int:
        """`path` opened for appending (a descriptor); a new file is a spare renamed
        into place."""
        if len(self.spares) <= self.keep // 2:
            self._low.set()
        # (os.path on strings: pathlib's objects were ~2 % of a busy runner's loop)
        p = os.fspath(path)
        if self.spares and os.path.dirname(p) == self._log_dir_s and not os.path.exists(p):
            name, fd = self.spares.popleft()
            try:
                os.rename(os.path.join(self._spare_dir_s, name), p)
            except OSError:
                os.close(fd)  # gone or unusable: create the file below
            else:
                self.used += 1
                return fd
        return open_log(path)

    def open_pair(self, stdout: Path, stderr: Path) -> OpenLogs:
        return open_logs(stdout, stderr, self.open)

    async def keep_filled(self) -> None:
        """Background: top the spares up whenever they run low, in a worker thread (the
        point is to keep inode allocation away from the event loop)."""
        while True:
            if len(self.spares) > self.keep // 2:
                await self._low.wait()
            self._low = trio.Event()
            want = self.keep - len(self.spares)
            if want <= 0:
                continue
            names = [f"{self._token}-{next(self._names)}" for _ in range(want)]
            made = await trio.to_thread.run_sync(self._create, names)
            self.spares.extend(made)
            self.created += len(made)
            if len(made) < len(names):
                await trio.sleep(5.0)  # cannot create (disk full?): try again later

    def _create(self, names: list[str]) -> list[tuple[str, int]]:
        made = []
        for name in names:
            try:
                fd = os.open(self.spare_dir / name, LOG_FLAGS | os.O_EXCL, 0o666)
            except OSError:
                break
            made.append((name, fd))
        return made

    def close(self) -> None:
        """Close the spares' descriptors (the files stay, for the next run)."""
        while self.spares:
            os.close(self.spares.popleft()[1])
