"""Fixtures for the security regression tests (issue #17).

Every test here runs against a real agent process started as root (as the system
service is), with submitters that are real, unprivileged users created for the test
run by `useradd` and removed afterwards. Clients act as those users by forking this
test process and dropping privileges in the child (`as_user`): exec'ing the CLI as
another user would need a Python that user can read.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.users import ChildError as ChildError
from tests.users import as_user as run_as

SOCKET_GROUP = "swsecgrp"
USER_NAMES = ("swseca", "swsecb", "swsecc")


@attrs.frozen
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, the socket group included
    home: str


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent switches users and the test acts as other users")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


# `make test` runs three pytest processes at once, and both the security lane and the
# integration lane (test_sharing) use these users. Each session registers its pid in a
# shared state file under a lock; the last one out removes what a session created. A
# session that died without tearing down is pruned by pid, so it cannot pin the users.
# (At stop 41 the security lane finished first and removed the group while the other
# lane still used it: its agent's socket stayed root-only, "permission denied".)
STATE_FILE = Path(tempfile.gettempdir()) / "swarm-sec-users.json"
LOCK_FILE = Path(tempfile.gettempdir()) / "swarm-sec-users.lock"


@contextlib.contextmanager
def _users_lock() -> Iterator[dict[str, Any]]:
    """The shared state (holders, what was made), read and written under an flock."""
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state: dict[str, Any] = {"holders": [], "made_users": [], "made_group": False}
            with contextlib.suppress(OSError, ValueError):
                state.update(json.loads(STATE_FILE.read_text()))
            state["holders"] = [p for p in state["holders"] if psutil.pid_exists(p)]
            yield state
            STATE_FILE.write_text(json.dumps(state))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _make_users(state: dict[str, Any]) -> list[User]:
    try:
        grp.getgrnam(SOCKET_GROUP)
    except KeyError:
        _run("groupadd", SOCKET_GROUP)
        state["made_group"] = True
    gid = grp.getgrnam(SOCKET_GROUP).gr_gid
    users = []
    for name in USER_NAMES:
        try:
            pwd.getpwnam(name)
        except KeyError:
            _run("useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name)
            state["made_users"] = sorted(set(state["made_users"]) | {name})
        pw = pwd.getpwnam(name)
        os.chmod(pw.pw_dir, 0o700)
        users.append(User(name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, gid), pw.pw_dir))
    return users


def _remove_made(state: dict[str, Any]) -> None:
    for name in state["made_users"]:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)
    if state["made_group"]:
        subprocess.run(["groupdel", SOCKET_GROUP], capture_output=True)
    state.update(made_users=[], made_group=False)


@pytest.fixture(scope="session")
def sec_users() -> Iterator[tuple[User, User, User]]:
    """Three unprivileged users, all members of the socket group, created for this
    run and removed (with their homes) when the last pytest process using them ends."""
    need_root()
    if subprocess.run(["which", "useradd"], capture_output=True).returncode != 0:
        pytest.skip("needs useradd")
    me = os.getpid()
    with _users_lock() as state:
        state["holders"].append(me)
        try:
            users = _make_users(state)
        except BaseException:
            state["holders"].remove(me)
            if not state["holders"]:
                _remove_made(state)
            raise
    try:
        yield users[0], users[1], users[2]
    finally:
        with _users_lock() as state:
            if me in state["holders"]:
                state["holders"].remove(me)
            if not state["holders"]:
                _remove_made(state)


def as_user(user: User, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a forked child with `user`'s credentials; return its result (or
    raise ChildError with what it raised)."""
    return run_as(user.uid, user.gid, list(user.groups), fn)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every test user can reach and write (like /tmp)."""
    d = Path(tempfile.mkdtemp(prefix="swsec-"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def root_agent(
    make_agent: AgentFactory, short_tmp: Path, sec_users: tuple[User, User, User]
) -> Callable[..., LocalAgent]:
    """A root agent whose socket the test users (socket group members) may use."""
    os.chmod(short_tmp, 0o755)  # other users must reach the socket's directory

    def start(name: str = "s1", *args: str, **kw: Any) -> LocalAgent:
        return make_agent(name, "--socket-group", SOCKET_GROUP, *args, **kw)

    return start
