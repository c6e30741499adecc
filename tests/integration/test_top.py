"""`swarm top` in a real terminal (tmux), and its pure frame renderer."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid

import pytest

from swarm import top
from tests.conftest import AgentFactory


def test_render_fits_the_terminal_and_shows_nodes_and_tasks() -> None:
    info = {"node": "a1", "running": 1, "queued": 2, "uptime": 75.0}
    load = {"shares": 1024, "reserved_shares": 0, "weight_sum": 3.0, "running": 1, "queued": 2}
    nodes = [
        {
            "node": "a1",
            "self": True,
            "state": "alive",
            "load_age": 0.4,
            "load": {
                **load,
                "slots": 4,
                "cpu_util": 0.5,
                "mem_available": 2 << 30,
                "isolation": "cgroup1",
            },
        },
        {"node": "a2", "self": False, "state": "suspect", "load_age": None, "load": None},
        {
            "node": "a3",
            "self": False,
            "state": "alive",
            "load_age": 3.0,
            "load": {**load, "shares": 0, "slots": 2},
        },
    ]
    tasks = [
        {
            "spec": {"id": f"t{i:016x}", "user": "alice", "argv": ["sleep", str(i)]},
            "state": "failed" if i == 3 else "running",
            "node": "a1",
            "exit_code": 3 if i == 3 else None,
            "signal": None,
            "created_at": 1000.0 + i,
            "started_at": 1000.0 + i,
            "finished_at": None,
        }
        for i in range(40)
    ]
    lines = top.render(info, nodes, tasks, width=90, height=20, now=1100.0)
    assert len(lines) <= 20 and all(len(ln) <= 90 for ln in lines)
    text = "\n".join(lines)
    assert "node a1" in lines[0] and "2/3 nodes alive" in lines[0]
    assert "a1 *" in text and "[####++++++++....]" in text and "cgroup1" in text
    assert "suspect" in text and "drain" in text  # a3 has no shares
    assert f"t{39:016x}" in text and "RECENT TASKS (40)" in text  # newest first
    assert top.load_bar(2, 6, 4, width=8) == "[####++++]"
    err = top.render(None, [], [], width=60, height=10, now=0.0, error="cannot reach")
    assert err[1] == "! cannot reach"


def test_once_prints_a_frame_of_the_live_agent(make_agent: AgentFactory) -> None:
    a = make_agent("top1")
    tid = a.cli("submit", "--", "sleep", "30").stdout.strip()
    p = a.cli("top", "--once")
    assert p.returncode == 0, p.stderr
    assert "top1 *" in p.stdout and tid in p.stdout and "sleep 30" in p.stdout
    a.cli("cancel", tid)
    gone = a.cli("--socket", str(a.socket) + ".nope", "top", "--once")
    assert gone.returncode == 69 and "cannot reach the swarm agent" in gone.stdout


def _tmux(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=20)


def test_live_view_in_a_terminal_redraws_and_quits_on_q(make_agent: AgentFactory) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make sysdeps installs it)")
    a = make_agent("top2")
    session = f"swarmtop-{uuid.uuid4().hex[:8]}"
    swarm = f"{sys.executable} -m swarm --socket {a.socket}"
    cmd = f"{swarm} top --interval 0.2; echo TOP-EXIT=$?; sleep 30"
    r = _tmux("new-session", "-d", "-s", session, "-x", "110", "-y", "30", cmd)
    assert r.returncode == 0, r.stderr
    try:

        def screen() -> str:
            return _tmux("capture-pane", "-p", "-t", session).stdout

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "top2 *" not in screen():
            time.sleep(0.1)
        assert "top2 *" in screen() and "RECENT TASKS (0)" in screen(), screen()
        tid = a.cli("submit", "--", "sleep", "30").stdout.strip()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and tid not in screen():
            time.sleep(0.1)
        shown = screen()
        assert tid in shown and "RECENT TASKS (1)" in shown, shown
        assert "Traceback" not in shown
        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "TOP-EXIT=" not in screen():
            time.sleep(0.1)
        assert "TOP-EXIT=0" in screen(), screen()
        a.cli("cancel", tid)
    finally:
        _tmux("kill-session", "-t", session)
