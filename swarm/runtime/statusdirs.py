"""The task supervisors' status directories, reused from one task to the next (issue 23).

Each supervised start needs a directory its shim writes the exit file into
(runtime/shim.py). A fresh one per start cost a runner ~4 % of its CPU on ext4
(perf, stop 43: `ext4_mkdir`'s search for a free inode), and each stayed, with its
exit file, until retention forgot the task (a week by default): two inodes per task.

A directory goes back to the pool once its task's end, and the removal of its process
row (DelProc), are on disk: no journaled row can then point a restarted agent at it,
so the next task may use it, its exit and lease files removed first. When that is not
known (the journal failing, a record that ended another way), it stays out of the pool.

Names start with "_", which no task id does (model.TASK_ID: a letter or digit first),
so they never meet the directories older agents named after their task (which
retention still removes), and carry a per-run prefix, so a new name never meets one a
previous run left. At start the agent removes the "_" directories no journaled process
row names (`sweep`): a crash may leave some, and nothing else will.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path

from . import shim as shimmod

# what a shim or the agent may have left in a directory (runtime/shim.py): the exit
# file; the lease (and its temporary) only where the task had one (--at-most-once)
_LEASE_FILES = (shimmod.LEASE_FILE, shimmod.LEASE_FILE + ".tmp")


class StatusDirs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._root_s = os.fspath(root)  # give_back works on strings (pathlib is slow)
        self.free: list[Path] = []  # exist, empty, named by no journaled row
        self._prefix = "_" + secrets.token_hex(4) + "-"
        self._made = 0
        self.reused = 0  # starts that took a directory from the pool (`swarm info`)

    def take(self) -> tuple[Path, bool]:
        """A directory for a start, and whether it exists and is empty already (from
        the pool); else a new name, which the start creates."""
        if self.free:
            self.reused += 1
            return self.free.pop(), True
        self._made += 1
        return self.root / f"{self._prefix}{self._made}", False

    def give_back(self, d: Path, leased: bool = False) -> bool:
        """Return a directory whose task's end and DelProc are durable (`leased`: its
        task had a lease file there); False when it is not one of ours or cannot be
        emptied (it then stays out of the pool)."""
        ds = os.fspath(d)
        parent, base = os.path.split(ds)
        if parent != self._root_s or not base.startswith("_"):
            return False
        found = False
        for name in (shimmod.EXIT_FILE, *(_LEASE_FILES if leased else ())):
            try:
                os.unlink(os.path.join(ds, name))
                found = True
            except FileNotFoundError:
                pass
            except OSError:
                return False
        # no exit file: the start may have failed before the directory was made
        if not found and not os.path.isdir(ds):
            return False
        self.free.append(d)
        return True

    def sweep(self, keep: Iterable[Path]) -> int:
        """Remove the pool directories no journaled row names (before any start)."""
        kept = {p.name for p in keep if p.parent == self.root}
        removed = 0
        try:
            names = [e.name for e in os.scandir(self.root) if e.name.startswith("_")]
        except FileNotFoundError:
            return 0
        for name in names:
            if name not in kept:
                shutil.rmtree(self.root / name, ignore_errors=True)
                removed += 1
        return removed
