"""A submitter can never act as anyone else (issue #17, items 1, 2, 4, 5 and 8).

A root agent with a socket group, submitters that are real unprivileged users created
for the run (tests/security/conftest.py). Each test is one finding of the issue, done
the way it was found.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarm import codec, wire
from swarm import model as m
from swarm.client import Client, RequestFailed
from swarm.cluster import handoff
from swarm.localcluster import LocalAgent
from tests.security.conftest import ChildError, User, as_user

pytestmark = pytest.mark.root

AgentStarter = Callable[..., LocalAgent]


def _submit_wait(sock: Path, argv: list[str], **kw: Any) -> Callable[[], dict[str, Any]]:
    def go() -> dict[str, Any]:
        with Client(sock, timeout=60) as c:
            tid = c.submit(argv, **kw)
            task = c.wait(tid)
            out = b"".join(c.logs(tid)).decode(errors="replace")
            err = b"".join(c.logs(tid, stderr=True)).decode(errors="replace")
        return {"id": tid, "task": task, "out": out, "err": err}

    return go


# ------------------------------------------------------------ 1. the loader


EVIL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    const char *out = getenv("EVIL_OUT");
    if (!out) return;
    FILE *f = fopen(out, "a");
    if (!f) return;
    fprintf(f, "%d\n", (int)getuid());
    fclose(f);
}
"""


def test_ld_preload_from_a_submitter_never_runs_as_root(
    root_agent: AgentStarter, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    """Finding 1: the root-side helper (setpriv, the cgroup-join shell) was started
    with the task's environment, so LD_PRELOAD's constructor ran as uid 0. Every
    process that loads the library must be the submitter's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the preloaded library")
    alice = sec_users[0]
    src, lib, out = world_dir / "evil.c", world_dir / "evil.so", world_dir / "uids"
    src.write_text(EVIL_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    os.chmod(lib, 0o755)
    a = root_agent()
    env = {"LD_PRELOAD": str(lib), "EVIL_OUT": str(out)}
    r = as_user(alice, _submit_wait(a.socket, ["sh", "-c", "id -u"], env=env, cwd="/"))
    assert r["task"]["state"] == "succeeded", r
    assert r["out"].split() == [str(alice.uid)]
    # the task's own processes (sh, id) loaded it, and only as the submitter
    uids = out.read_text().split()
    assert uids, "the preloaded library never ran: the test proves nothing"
    assert set(uids) == {str(alice.uid)}, f"constructor ran as uids {sorted(set(uids))}"


# ------------------------------------------------------------ 2. ids that are paths


@pytest.mark.parametrize("bad", [".", "..", "a/b", "../x", "-rf", ".hidden", "a~b", "x" * 65])
def test_ids_that_could_be_paths_are_refused(
    root_agent: AgentStarter, sec_users: tuple[User, User, User], bad: str
) -> None:
    """Finding 2: `..` as an id made the agent chown its own state dir to the
    submitter and put the task in the parent cgroup."""
    a = root_agent()

    def submit() -> str:
        with Client(a.socket, timeout=30) as c:
            return c.submit(["true"], task_id=bad, cwd="/", migrate="checkpoint")

    with pytest.raises(ChildError, match=r"invalid task id"):
        as_user(sec_users[0], submit)
    state = a.state_dir
    # nothing outside the agent's own files changed owner
    assert state.stat().st_uid == 0
    for p in state.rglob("*"):
        if "task-state" in p.parts and p.name != "task-state":
            continue  # a checkpointing task's own dir is its user's
        assert p.lstat().st_uid == 0, p


@pytest.mark.parametrize("bad", [".", "..", "a/b", "../../etc/passwd", ""])
def test_a_peers_task_ids_get_the_same_validation(bad: str) -> None:
    spec = codec.task_spec_to_wire(m.TaskSpec(id="t1", argv=("true",)))
    spec["id"] = bad
    with pytest.raises(wire.WireError, match="id"):
        codec.task_spec_from_wire(spec)
    offer = handoff.request_to_wire(handoff.Commit("t1", 1))
    offer["task_id"] = bad
    with pytest.raises(wire.WireError, match="task_id"):
        handoff.request_from_wire(offer)


# ------------------------------------------------------------ 4. someone else's id


def test_b_can_never_read_or_replace_a_task_of_a(
    root_agent: AgentStarter, sec_users: tuple[User, User, User]
) -> None:
    """Finding 4: after a restart, B submitted with A's id, overwrote A's record and
    read A's output; before it, resubmitting A's argv under A's id answered
    `duplicate: true` to B (an oracle for A's command line)."""
    alice, bob, _ = sec_users
    a = root_agent()
    secret = ["sh", "-c", "echo alice-secret-7731"]
    ra = as_user(alice, _submit_wait(a.socket, secret, task_id="job1", cwd="/"))
    a_id = ra["id"]
    assert a_id == "job1~swseca" and ra["out"].strip() == "alice-secret-7731"

    def bob_tries(restarted: bool) -> None:
        # the same id and argv: a new task of bob's own, never "duplicate" of alice's
        rb = as_user(bob, _submit_wait(a.socket, secret, task_id="job1", cwd="/"))
        assert rb["id"] == "job1~swsecb" and rb["id"] != a_id
        assert rb["task"]["spec"]["user"] == bob.name
        # alice's full id: not his to name at submit, nor to read, wait on or cancel
        for op in ("status", "logs", "wait", "cancel", "explain"):

            def snoop(op: str = op) -> str:
                with Client(a.socket, timeout=30) as c:
                    try:
                        if op == "logs":
                            return b"".join(c.logs(a_id)).decode()
                        c.call(op, id=a_id)
                    except RequestFailed as e:
                        return e.code
                return "allowed"

            assert as_user(bob, snoop) == "permission_denied", (op, restarted)

        def resubmit_as_alice_id() -> str:
            with Client(a.socket, timeout=30) as c:
                return c.submit(["sh", "-c", "echo pwned"], task_id=a_id, cwd="/")

        with pytest.raises(ChildError, match="invalid task id"):
            as_user(bob, resubmit_as_alice_id)

    bob_tries(restarted=False)
    a.stop()
    a.start()
    bob_tries(restarted=True)

    # alice's record and output are hers and unchanged, across the restart
    def alice_reads() -> tuple[dict[str, Any], str]:
        with Client(a.socket, timeout=30) as c:
            return c.status("job1"), b"".join(c.logs(a_id)).decode()

    task, out = as_user(alice, alice_reads)
    assert task["spec"]["id"] == a_id and task["spec"]["argv"] == secret
    assert out.strip() == "alice-secret-7731"

    # her own retry after the restart is found in the journal: a duplicate, or a
    # conflict for another command under the same id (never an upsert)
    def alice_retries(argv: list[str]) -> Any:
        with Client(a.socket, timeout=30) as c:
            try:
                return c.call("submit", argv=argv, id="job1", cwd="/")
            except RequestFailed as e:
                return e.code

    again = as_user(alice, lambda: alice_retries(secret))
    assert again["id"] == a_id and again.get("duplicate") is True
    assert as_user(alice, lambda: alice_retries(["true"])) == "conflict"


# ------------------------------------------------------------ 5. --cwd as root


def test_cwd_under_a_private_parent_fails_as_the_user_would(
    root_agent: AgentStarter, sec_users: tuple[User, User, User], world_dir: Path
) -> None:
    """Finding 5: the child chdir'd before dropping privileges, so a user ran `cat
    secret.txt` in a directory under a 0700 parent they cannot enter; and the
    command-exists check (127 vs 126) was made as root."""
    alice = sec_users[0]
    priv = world_dir / "priv"
    inner = priv / "inner"
    inner.mkdir(parents=True)
    os.chmod(priv, 0o700)
    os.chmod(inner, 0o755)
    (inner / "secret.txt").write_text("root-only-4471\n")
    os.chmod(inner / "secret.txt", 0o644)
    tool = inner / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    os.chmod(tool, 0o755)
    a = root_agent()
    r = as_user(alice, _submit_wait(a.socket, ["cat", "secret.txt"], cwd=str(inner)))
    assert r["task"]["state"] == "failed", r
    assert "root-only-4471" not in r["out"]
    reason = r["task"]["reason"]
    # a directory the user cannot enter counts as missing (issue 21: every node refuses
    # the task for it, so it fails), in the very words of a missing one: whether it
    # exists is not told
    assert reason.startswith(f"working directory {inner} does not exist on any node"), reason
    gone = priv / "nothing"
    rm = as_user(alice, _submit_wait(a.socket, ["true"], cwd=str(gone)))
    assert rm["task"]["state"] == "failed", rm
    assert rm["task"]["reason"].replace(str(gone), "D") == reason.replace(str(inner), "D")

    # whether a file the user cannot see exists is not told: the same answer for both
    reasons = []
    for path in (str(tool), str(inner / "missing")):
        rr = as_user(alice, _submit_wait(a.socket, [path], cwd="/"))
        assert rr["task"]["state"] == "failed", rr
        reasons.append(rr["task"]["reason"].replace(path, "PATH"))
    assert reasons[0] == reasons[1] == "permission denied: PATH", reasons

    # a directory the user can enter still works
    ok = as_user(alice, _submit_wait(a.socket, ["pwd"], cwd=str(world_dir)))
    assert ok["task"]["state"] == "succeeded" and ok["out"].strip() == str(world_dir)


# ------------------------------------------------------------ 8. socket lockout


def _hold_connections(user: User, sock: Path, n: int) -> tuple[int, int]:
    """A child process, as `user`, that opens `n` connections to the agent's socket
    and holds them; returns (pid, how many it holds once it says it is ready)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        held = []
        try:
            import resource

            _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            for _ in range(n):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(str(sock))
                except OSError:
                    s.close()
                    break
                held.append(s)
            os.write(w, f"{len(held)}\n".encode())
            time.sleep(600)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        line = f.readline()
    return pid, int(line or 0)


def test_one_user_holding_2048_connections_locks_nobody_out(
    root_agent: AgentStarter, sec_users: tuple[User, User, User]
) -> None:
    """Finding 8: one member holding 2,048 idle connections locked out every user,
    root included."""
    alice, bob, _ = sec_users
    a = root_agent()
    pid, held = _hold_connections(bob, a.socket, 2048)
    try:
        assert held == 2048  # connect() succeeds; the agent refuses or serves each

        def info() -> str:
            with Client(a.socket, timeout=30) as c:
                return str(c.info()["node"])

        assert as_user(alice, info) == "s1"
        with a.client(timeout=30) as c:
            assert c.info()["node"] == "s1"
        r = as_user(alice, _submit_wait(a.socket, ["echo", "still-served"], cwd="/"))
        assert r["task"]["state"] == "succeeded" and r["out"].strip() == "still-served"

        # bob himself was told why, for connections over his share
        def bob_info() -> str:
            with Client(a.socket, timeout=30) as c:
                try:
                    c.info()
                except RequestFailed as e:
                    return f"{e.code}: {e.message}"
            return "served"

        assert as_user(bob, bob_info).startswith("busy: too many connections from uid")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
