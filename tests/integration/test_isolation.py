"""Who may submit, as whom, and what a task may use: real agents, real users, real cgroups.

The agent runs as root (as the system service does). Clients run as other users by
forking this test process and dropping privileges in the child (exec'ing the CLI as
another user would need a Python that user can read). The users are the system's
`nobody` and `daemon`; the socket group is `users`, which neither belongs to in
/etc/group: membership is granted per client through its supplementary groups.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarm.client import Client, RequestFailed
from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import LOOP, all_see, wait_for
from tests.users import ChildError, as_user

pytestmark = pytest.mark.root


def _need_users() -> tuple[pwd.struct_passwd, pwd.struct_passwd, int]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent switches users and the test acts as other users")
    try:
        return pwd.getpwnam("nobody"), pwd.getpwnam("daemon"), grp.getgrnam("users").gr_gid
    except KeyError as e:
        pytest.skip(f"needs the system users nobody and daemon and the group users ({e})")


def _agent(make_agent: AgentFactory, short_tmp: Path, *args: str) -> LocalAgent:
    os.chmod(short_tmp, 0o755)  # other users must reach the socket's directory
    return make_agent("i1", "--socket-group", "users", *args)


def test_only_the_socket_group_may_connect(make_agent: AgentFactory, short_tmp: Path) -> None:
    nobody, daemon, users = _need_users()
    a = _agent(make_agent, short_tmp)
    st = os.stat(a.socket)
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == users

    def info() -> str:
        with Client(a.socket, timeout=10) as c:
            return str(c.info()["node"])

    assert as_user(nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid, users], info) == "i1"
    with pytest.raises(ChildError, match=r"AgentUnreachable: .*permission denied"):
        as_user(daemon.pw_uid, daemon.pw_gid, [daemon.pw_gid], info)


def test_a_task_runs_as_its_submitter_and_is_theirs_alone(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    nobody, daemon, users = _need_users()
    a = _agent(make_agent, short_tmp)
    alice = (nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid, users])  # a member
    mallory = (daemon.pw_uid, daemon.pw_gid, [daemon.pw_gid, users])  # another member

    def submit_and_wait() -> tuple[str, str, dict[str, Any]]:
        with Client(a.socket, timeout=60) as c:
            tid = c.submit(["sh", "-c", 'id -un; id -u; id -g; echo "$HOME"; umask'], cwd="/")
            task = c.wait(tid)
            out = b"".join(c.logs(tid)).decode()
        return tid, out, task

    tid, out, task = as_user(*alice, submit_and_wait)
    assert task["state"] == "succeeded", task
    assert out.split() == ["nobody", str(nobody.pw_uid), str(nobody.pw_gid), nobody.pw_dir, "0022"]
    assert task["spec"]["user"] == "nobody" and task["spec"]["uid"] == nobody.pw_uid

    def submit_long() -> str:
        with Client(a.socket, timeout=60) as c:
            return c.submit(["sleep", "60"], cwd="/")

    long = as_user(*alice, submit_long)

    def snoop(op: str, task_id: str) -> Callable[[], str]:
        def go() -> str:
            with Client(a.socket, timeout=30) as c:
                try:
                    if op == "logs":
                        list(c.logs(task_id))
                    else:
                        c.call(op, id=task_id)
                except RequestFailed as e:
                    return f"{e.code}: {e.message}"
            return "allowed"

        return go

    for op in ("status", "logs", "cancel", "wait", "explain"):
        assert as_user(*mallory, snoop(op, long)) == (
            f"permission_denied: task {long} belongs to another user"
        ), op

    def listed() -> list[str]:
        with Client(a.socket, timeout=30) as c:
            return [t["spec"]["id"] for t in c.list(all=True)]

    assert as_user(*mallory, listed) == []  # ps shows others' tasks to nobody but root
    assert set(as_user(*alice, listed)) == {tid, long}
    with a.client() as c:  # root sees and controls everything
        assert {tid, long} <= {t["spec"]["id"] for t in c.list(all=True)}
    assert as_user(*alice, snoop("cancel", long)) == "allowed"
    with a.client() as c:
        assert c.wait(long, timeout=30)["state"] == "cancelled"


def test_root_is_refused_at_submit_unless_allowed(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    _need_users()
    a = _agent(make_agent, short_tmp, "--no-allow-root-tasks")
    p = a.cli("submit", "--", "true")
    assert p.returncode == 1
    assert "tasks may not run as root on node i1 (allow-root-tasks = false)" in p.stderr
    assert a.cli("ps", "--all", "--json").stdout.strip() == "[]"


def _isolation(a: LocalAgent) -> str:
    nodes = json.loads(a.cli("nodes", "--json").stdout)
    me = next(n for n in nodes if n["self"])
    return str(me["load"]["isolation"])


def _need_cgroups(a: LocalAgent) -> str:
    kind = _isolation(a)
    if kind == "none":
        pytest.skip(f"no usable cgroups here: {re.findall(r'detail=(.*?) switch', a.log_text())}")
    return kind


def test_memory_limit_kills_with_a_clear_reason_and_cgroups_go(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    _need_users()
    a = make_agent("m1")
    _need_cgroups(a)
    hog = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
    p = a.cli("submit", "--wait", "--mem", "32M", "--", os.path.realpath(sys.executable), "-c", hog)
    assert p.returncode == 128 + 9, p.stderr
    st = json.loads(a.cli("status", "--json", p.stdout.strip()).stdout)
    assert st["state"] == "failed" and st["signal"] == 9
    assert st["reason"].startswith("out of memory: exceeded its memory limit of 32.0MiB"), st
    # a task under its limit is not blamed
    ok = a.cli("submit", "--wait", "--mem", "64M", "--", "sh", "-c", "exit 3")
    assert ok.returncode == 3
    assert json.loads(a.cli("status", "--json", ok.stdout.strip()).stdout)["reason"] == "exited 3"
    # no task cgroup outlives its task
    groups = re.search(r"event=isolation.ready .*?detail=\"(.*?)\"", a.log_text())
    assert groups is not None
    for d in re.findall(r"(/sys/fs/cgroup/\S+?)(?:,|$)", groups.group(1)):
        assert [p for p in Path(d).iterdir() if p.is_dir()] == [], d


def test_a_process_that_left_the_tasks_group_dies_with_its_cgroup(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    """setsid moves it out of the task's process group (which the executor kills), but
    not out of the task's cgroup: removing the group finds it and kills it."""
    _need_users()
    a = make_agent("s1")
    _need_cgroups(a)
    p = a.cli("submit", "--wait", "--", "sh", "-c", "setsid sleep 300 >/dev/null & echo $!")
    assert p.returncode == 0, p.stderr
    stray = int(a.cli("logs", p.stdout.strip()).stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{stray}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{stray}").exists(), "the stray outlived its task's cgroup"
    groups = re.search(r"event=isolation.ready .*?detail=\"(.*?)\"", a.log_text())
    assert groups is not None
    for d in re.findall(r"(/sys/fs/cgroup/\S+?)(?:,|$)", groups.group(1)):
        assert [p for p in Path(d).iterdir() if p.is_dir()] == [], d
    # and the agent's own threads are all back in the agent's groups
    key = Path(re.findall(r"(/sys/fs/cgroup/\S+?)(?:,|$)", groups.group(1))[0]).name
    for t in Path(f"/proc/{a.pid}/task").iterdir():
        assert key not in (t / "cgroup").read_text(), t


def test_cpu_weight_shows_up_in_the_cgroup(make_agent: AgentFactory, short_tmp: Path) -> None:
    _need_users()
    a = make_agent("w1")
    kind = _need_cgroups(a)
    if kind == "cgroup1":
        script = (
            'p=$(grep -E "^[0-9]+:([^:]*,)?cpu(,[^:]*)?:" /proc/self/cgroup | cut -d: -f3); '
            "cat /sys/fs/cgroup/cpu$p/cpu.shares"
        )
        want = "2560"
    else:
        script = "p=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); cat /sys/fs/cgroup$p/cpu.weight"
        want = "250"
    p = a.cli("submit", "--wait", "--weight", "2.5", "--", "sh", "-c", script)
    assert p.returncode == 0, p.stderr
    assert a.cli("logs", p.stdout.strip()).stdout.strip() == want


def test_a_peer_refuses_an_offer_it_cannot_run_and_says_why(make_agent: AgentFactory) -> None:
    _need_users()
    home = make_agent("h1", *LOOP)
    peer = make_agent("h2", *LOOP, "--seeds", f"127.0.0.1:{home.port}", "--no-allow-root-tasks")
    wait_for(lambda: all_see([home, peer], {"h1", "h2"}), 60, "two agents to converge")
    assert "drained" in home.cli("drain").stdout  # the only other place is h2
    tid = home.cli("submit", "--", "true").stdout.strip()

    def refused() -> bool:
        ex = home.cli("explain", "--json", tid)
        return "h2 refused: tasks may not run as root on node h2" in ex.stdout

    wait_for(refused, 30, "h2's refusal in explain")
    with home.client() as c:
        assert c.status(tid)["state"] == "queued"
        c.cancel(tid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "handoff.refused" not in peer.log_text():
        time.sleep(0.1)
    assert "handoff.refused" in peer.log_text()
