"""One real agent process, driven through the real CLI and socket."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import struct
import time
from pathlib import Path

import msgpack
import psutil

from swarm import wire
from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory


def _wait_all(agent: LocalAgent, ids: list[str], timeout: float = 120) -> dict[str, dict]:
    out = {}
    with agent.client(timeout=timeout) as c:
        for tid in ids:
            out[tid] = c.wait(tid, timeout=timeout)
    return out


def test_submit_wait_propagates_exit_codes(make_agent: AgentFactory) -> None:
    a = make_agent()
    ok = a.cli("submit", "--wait", "--", "true")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().startswith("t")
    three = a.cli("submit", "--wait", "--", "sh", "-c", "exit 3")
    assert three.returncode == 3
    sig = a.cli("submit", "--wait", "--", "sh", "-c", "kill -TERM $$")
    assert sig.returncode == 128 + signal.SIGTERM
    missing = a.cli("submit", "--wait", "--", "/no/such/program")
    assert missing.returncode == 127
    st = a.cli("status", three.stdout.strip())
    assert st.returncode == 0 and "failed" in st.stdout and "exited 3" in st.stdout


def test_submit_prints_only_the_id(make_agent: AgentFactory) -> None:
    a = make_agent()
    p = a.cli("submit", "--name", "x", "--", "echo", "hi")
    assert p.returncode == 0
    assert p.stdout.count("\n") == 1 and p.stdout.strip().startswith("t")


def test_logs_and_follow(make_agent: AgentFactory) -> None:
    a = make_agent()
    script = "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.2; done"
    tid = a.cli("submit", "--", "sh", "-c", script).stdout.strip()
    followed = a.cli("logs", "-f", tid)
    assert followed.returncode == 0
    assert followed.stdout.split() == [f"out{i}" for i in range(1, 6)]
    err = a.cli("logs", "--stderr", tid)
    assert err.stdout.split() == [f"err{i}" for i in range(1, 6)]
    plain = a.cli("logs", tid)
    assert plain.stdout == followed.stdout


def test_env_cwd_and_task_id_reach_the_process(make_agent: AgentFactory, short_tmp: Path) -> None:
    a = make_agent()
    p = a.cli(
        "submit",
        "--wait",
        "--env",
        "GREETING=hello",
        "--cwd",
        str(short_tmp),
        "--",
        "sh",
        "-c",
        'echo "$GREETING $SWARM_TASK_ID $(pwd)"',
    )
    assert p.returncode == 0, p.stderr
    tid = p.stdout.strip()
    out = a.cli("logs", tid).stdout.split()
    assert out == ["hello", tid, str(short_tmp)]


def test_cancel_kills_the_whole_process_tree(make_agent: AgentFactory, short_tmp: Path) -> None:
    a = make_agent()
    pids = short_tmp / "pids"
    script = (
        f"sleep 300 & echo $! >> {pids}; (sleep 300; true) & echo $! >> {pids}; "
        f"echo $$ >> {pids}; wait"
    )
    tid = a.cli("submit", "--", "sh", "-c", script).stdout.strip()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 3):
        time.sleep(0.05)
    procs = [int(x) for x in pids.read_text().split()]
    assert all(psutil.pid_exists(p) for p in procs)
    c = a.cli("cancel", tid)
    assert c.returncode == 0 and "cancelled" in c.stdout
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(p) for p in procs):
        time.sleep(0.05)
    assert not any(_running(p) for p in procs)
    w = a.cli("wait", tid)
    assert w.returncode == 128 + signal.SIGTERM
    again = a.cli("cancel", tid)
    assert again.returncode == 1 and "already cancelled" in again.stderr


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cancel_queued_task(make_agent: AgentFactory) -> None:
    a = make_agent("a1", "--slots", "1")
    blocker = a.cli("submit", "--", "sleep", "30").stdout.strip()
    queued = a.cli("submit", "--", "true").stdout.strip()
    assert a.cli("cancel", queued).returncode == 0
    assert "cancelled" in a.cli("status", queued).stdout
    a.cli("cancel", blocker)


def test_thousand_submissions_through_the_cli_all_complete(make_agent: AgentFactory) -> None:
    a = make_agent("a1", "--slots", "8")

    def submit(i: int) -> str:
        p = a.cli("submit", "--name", f"n{i}", "--", "true")
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(submit, range(1000)))
    assert len(set(ids)) == 1000
    results = _wait_all(a, ids)
    assert all(t["state"] == "succeeded" for t in results.values())
    ps = a.cli("ps", "--all", "--limit", "5000", "--json")
    import json

    listed = {t["spec"]["id"] for t in json.loads(ps.stdout)}
    assert set(ids) <= listed


def test_bad_bytes_get_an_error_and_the_agent_keeps_serving(make_agent: AgentFactory) -> None:
    a = make_agent()

    def raw(payload: bytes) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(a.socket))
            s.sendall(payload)
            dec = wire.FrameDecoder()
            while True:
                data = s.recv(65536)
                assert data, "agent closed without an error reply"
                got = dec.feed(data)
                if got:
                    return got[0]

    garbage = raw(struct.pack(">I", 5) + b"\xc1\xff\x00\x01\x02")
    assert garbage["ok"] is False and garbage["error"] == "malformed"
    huge = raw(struct.pack(">I", 200 * 1024 * 1024))
    assert huge["ok"] is False and huge["error"] == "frame_too_large"
    not_a_map = raw(wire.encode_frame([1, 2, 3]))
    assert not_a_map["ok"] is False and "map" in not_a_map["message"]
    unknown = raw(wire.encode_frame({"v": 1, "op": "explode"}))
    assert unknown["error"] == "unknown_op"
    bad_field = raw(wire.encode_frame({"v": 1, "op": "submit", "argv": "ls"}))
    assert bad_field["error"] == "invalid" and "argv" in bad_field["message"]
    extra = raw(wire.encode_frame({"v": 1, "op": "submit", "argv": ["true"], "uid": 0}))
    assert extra["error"] == "invalid" and "uid" in extra["message"]
    old = raw(wire.encode_frame({"v": 99, "op": "info"}))
    assert old["error"] == "version"
    # half a frame, then hang up
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(a.socket))
        s.sendall(struct.pack(">I", 100) + msgpack.packb({"v": 1}))
    # the CLI's own validation errors exit 2
    assert a.cli("submit", "--weight", "-1", "--", "true").returncode == 2
    assert a.cli("status", "no-such-task").returncode == 1
    assert a.cli("submit", "--wait", "--", "true").returncode == 0
    assert a.alive()


def test_unreachable_agent_exits_69(short_tmp: Path) -> None:
    a = LocalAgent(short_tmp, "ghost")
    p = a.cli("ps")
    assert p.returncode == 69
    assert str(a.socket) in p.stderr


def test_kill9_with_queued_and_running_tasks_loses_nothing(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    a = make_agent("a1", "--slots", "2")
    marks = short_tmp / "marks"
    marks.mkdir()
    # each task appends its pid, sleeps, then marks completion
    script = "echo $$ >> {d}/$SWARM_TASK_ID.pids; sleep 1.5; echo done > {d}/$SWARM_TASK_ID.done"
    ids = [
        a.cli("submit", "--", "sh", "-c", script.format(d=marks)).stdout.strip() for _ in range(6)
    ]
    nr = a.cli("submit", "--no-retry", "--", "sleep", "30").stdout.strip()
    assert all(ids) and nr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(list(marks.glob("*.pids"))) < 2:
        time.sleep(0.05)
    first_pids = {p.stem.split(".")[0]: int(p.read_text().split()[0]) for p in marks.glob("*.pids")}
    assert first_pids, "no task started before the kill"
    a.kill(signal.SIGKILL)
    a.start()
    # orphans of the dead agent were killed before their tasks were re-queued
    for pid in first_pids.values():
        assert not _running(pid) or _wait_gone(pid)
    results = _wait_all(a, ids)
    assert all(t["state"] == "succeeded" for t in results.values()), results
    for tid in ids:
        assert (marks / f"{tid}.done").exists()
    with a.client() as c:
        nr_state = c.status(nr)
    if nr_state["state"] == "running":  # it had not started before the kill
        a.cli("cancel", nr)
    else:
        assert nr_state["state"] == "failed" and "no-retry" in nr_state["reason"]


def _wait_gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_requeues_running_tasks_for_the_next_start(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    a = make_agent("a1", "--slots", "1")
    marker = short_tmp / "count"
    tid = a.cli("submit", "--", "sh", "-c", f"echo x >> {marker}; sleep 2").stdout.strip()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.05)
    assert a.stop() == 0
    assert "agent.stopped" in a.log_text()
    a.start()
    with a.client() as c:
        t = c.wait(tid, timeout=30)
    assert t["state"] == "succeeded"
    assert marker.read_text().count("x") == 2
    causes = [h["cause"] for h in t["history"]]
    assert any("shutdown" in c for c in causes)


def test_second_agent_on_the_same_socket_refuses(make_agent: AgentFactory) -> None:
    a = make_agent()
    b = LocalAgent(a.dir.parent, "a1b", a.args, env=a.env)
    b.socket = a.socket
    b.state_dir = a.dir / "state2"
    b.start(wait=False)
    assert b.proc is not None
    rc = b.proc.wait(30)
    assert rc == 1
    assert "already listening" in b.log_text()
    assert a.cli("submit", "--wait", "--", "true").returncode == 0


def test_permissions_of_the_socket(make_agent: AgentFactory) -> None:
    a = make_agent()
    assert oct(os.stat(a.socket).st_mode & 0o777) == "0o660"
