"""A hand-started agent's state is private (issue #17, item 9).

Started by hand (outside the systemd unit, whose UMask=0077 hid this), the agent made
its state dir 0755 and its journal, WAL and task logs 0644: any local user read every
task's argv, env and output. The agent now sets its own umask (0077; tasks still get
0022), keeps the state dir 0711 (task users reach their own task-state dir below it,
and can list nothing), its logs dir 0700, its files 0600, and tightens what an older
agent left looser when it starts.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm.client import Client
from swarm.localcluster import LocalAgent
from tests.security.conftest import SOCKET_GROUP, ChildError, User, as_user

pytestmark = pytest.mark.root

AgentStarter = Callable[..., LocalAgent]

SECRET = "swsec-private-state-secret"


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _run_a_task(a: LocalAgent) -> str:
    with a.client() as c:
        tid = c.submit(["sh", "-c", f"echo {SECRET}-out; echo {SECRET}-err >&2"], env={"S": SECRET})
        task = c.wait(tid, timeout=30)
    assert task["state"] == "succeeded", task
    return str(tid)


def _reads_as(user: User, paths: list[Path]) -> dict[str, str]:
    """What `user` gets trying to read each file (or list each dir)."""

    def attempt(p: Path) -> str:
        def go() -> str:
            if p.is_dir():
                return "listed " + ",".join(os.listdir(p))
            return "read " + p.read_bytes()[:64].hex()

        try:
            return str(as_user(user, go))
        except ChildError as e:
            return str(e)

    return {str(p): attempt(p) for p in paths}


def _private_files(a: LocalAgent, tid: str) -> tuple[list[Path], list[Path]]:
    state = a.state_dir
    journal = [state / "journal.db", state / "journal.db-wal", state / "journal.db-shm"]
    logs = [state / "logs" / f"{tid}.out", state / "logs" / f"{tid}.err"]
    for p in journal + logs:
        assert p.exists(), p
    return journal, logs


def test_hand_started_agent_state_is_unreadable_to_other_users(
    root_agent: AgentStarter, sec_users: tuple[User, User, User]
) -> None:
    """Finding 9, fresh and after an older agent's loose modes: another user can
    neither list the state or logs dir nor read the journal, WAL or task logs."""
    _, b, _ = sec_users
    old = os.umask(0o022)  # started by hand from a usual shell
    try:
        a = root_agent("p1")
        tid = _run_a_task(a)
        for round in ("fresh", "tightened"):
            journal, logs = _private_files(a, tid)
            state = a.state_dir
            got = _reads_as(b, [state, state / "logs", *journal, *logs])
            leaked = {p: r for p, r in got.items() if not r.startswith("PermissionError")}
            assert not leaked, f"{round}: readable by {b.name}: {leaked}"
            assert _mode(state) == 0o711, round
            assert _mode(state / "logs") == 0o700, round
            for p in journal + (logs if round == "fresh" else []):
                assert _mode(p) == 0o600, (round, p)  # old logs: private by their dir
            if round == "tightened":
                assert "event=agent.state_tightened" in a.log_text()
            if round == "fresh":
                # what an older agent left: 0755 dirs, 0644 files (a crash leaves the
                # WAL and shm behind too); a restart tightens it
                a.kill()
                for p in (state, state / "logs"):
                    p.chmod(0o755)
                for p in journal + logs:
                    p.chmod(0o644)
                a.start()
                _run_a_task(a)  # the journal's WAL and shm exist again
    finally:
        os.umask(old)


def test_the_private_umask_keeps_the_socket_reachable_to_its_group(
    make_agent: Callable[..., LocalAgent], short_tmp: Path, sec_users: tuple[User, User, User]
) -> None:
    """The agent's umask (0077) must not make a socket dir it creates itself (no
    systemd RuntimeDirectory) unreachable to the submitters of its socket group."""
    a_user = sec_users[0]
    os.chmod(short_tmp, 0o755)
    a = make_agent("p2", "--socket-group", SOCKET_GROUP, start=False)
    a.socket = a.dir / "run" / "swarm.sock"  # a directory the agent makes
    a.start()
    sock = a.socket

    def info() -> str:
        with Client(sock, timeout=10) as c:
            return str(c.info()["node"])

    assert as_user(a_user, info) == "p2"
