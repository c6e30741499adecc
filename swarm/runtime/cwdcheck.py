"""Does a task's working directory exist here, for its user? (issue 21)

A task's `cwd` comes from the host it was submitted on. On another host the path may
not exist; running there anyway in $HOME or / would make a relative path in the
command read or write the wrong place, so the node refuses the task and placement
tries another one (`--cwd-any` opts into the old fallback).

The agent runs as root, so "exists" must mean "exists for the task's user": a path
under a directory the user cannot search is reported exactly like a missing one, so
a local user cannot learn through placement what exists in, say, /root. The walk
checks the search (x) bit of every ancestor and the directory itself, along the path
as written and along every symlink's resolution, against the user's uid, gid and
groups from the mode bits (ACLs are not read: a directory an ACL
opens for the user is refused here and fails the same way everywhere).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection


def cwd_refusal(
    cwd: str | None, node: str, uid: int | None, gids: Collection[int] = ()
) -> str | None:
    """None when `cwd` is a directory the user `uid` (None: the agent's own user, no
    switching) can enter on this node, else the one line the submitter will read."""
    if not cwd:
        return None
    missing = f"working directory {cwd} does not exist on node {node}"
    if not os.path.isabs(cwd):
        return missing
    if uid == 0:  # root searches every directory: whether it is one is all there is
        return None if os.path.isdir(cwd) else missing
    if uid is None:
        return None if os.path.isdir(cwd) and os.access(cwd, os.X_OK) else missing
    # As the kernel walks it: every prefix of the path as written, each resolved
    # (symlinks followed, then ".."), must be a chain of directories the user may
    # search; judging a symlink by its target alone would let a link under the user's
    # home say whether something exists below /root.
    real = os.path.realpath(cwd)
    if real == os.path.normpath(cwd) and ".." not in cwd.split("/"):
        # no symlink and no "..": the path as written is the one the kernel walks (the
        # common case, on the submit-to-start path: one walk, not one per prefix)
        return None if _chain_searchable(real, uid, gids) else missing
    prefix = ""
    for part in ["", *(p for p in cwd.split("/") if p)]:
        prefix = f"{prefix}/{part}" if part else "/"
        if not _chain_searchable(os.path.realpath(prefix), uid, gids):
            return missing
    return None


def _chain_searchable(real: str, uid: int, gids: Collection[int]) -> bool:
    """Is every directory of the resolved path `real`, from / down, one `uid` may
    search?"""
    here = "/"
    for part in ["", *(p for p in real.split("/") if p)]:
        here = os.path.join(here, part) if part else "/"
        try:
            st = os.stat(here)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or not _searchable(st, uid, gids):
            return False
    return True


def _searchable(st: os.stat_result, uid: int, gids: Collection[int]) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)
