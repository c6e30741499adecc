"""The chaos harness itself: teardown on failure, the leftover sweep, the faults'
start/heal on a live namespace LAN."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chaos import faults as fl
from chaos import netns
from chaos.cluster import ChaosCluster

ROOT_OK, WHY = netns.namespaces_usable()
needs_root = pytest.mark.skipif(not ROOT_OK, reason=f"network namespaces: {WHY}")


def _mine(run_id: str) -> list[str]:
    return [ns for ns in netns.list_namespaces() if ns.startswith(f"{netns.PREFIX}-{run_id}-")]


@pytest.mark.root
@needs_root
def test_teardown_after_a_failure_leaves_nothing_behind(short_tmp: Path) -> None:
    run_id = secrets.token_hex(3)
    pids: list[int] = []
    with (
        pytest.raises(RuntimeError, match="boom"),
        ChaosCluster(2, short_tmp, run_id=run_id, mode="netns", tmpfs_nodes={1: 8}) as cl,
    ):
        assert len(_mine(run_id)) == 3  # hub + 2 nodes
        pids = [a.proc.pid for a in cl.agents if a.proc is not None]
        cl.agents[1].pause()  # a frozen agent must not block the teardown
        raise RuntimeError("boom")
    assert _mine(run_id) == []
    assert not (netns.RUN_DIR / f"{run_id}.pid").exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert str(short_tmp / "n1" / "state") not in Path("/proc/self/mounts").read_text()


@pytest.mark.root
@needs_root
def test_the_sweep_removes_dead_runs_and_spares_live_ones() -> None:
    dead, live = secrets.token_hex(3), secrets.token_hex(3)
    netns.RUN_DIR.mkdir(parents=True, exist_ok=True)
    (netns.RUN_DIR / f"{dead}.pid").write_text("2147483647")  # no such process
    netns.claim_run(live)
    try:
        for run_id in (dead, live):
            netns.run(["ip", "netns", "add", f"{netns.PREFIX}-{run_id}-n1"])
        ns = f"{netns.PREFIX}-{dead}-n1"
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
        # the sweep kills what is inside the namespace: wait until the sleeper is in it
        # (under load `ip netns exec` takes a moment to enter; sweeping before it does
        # left the sleeper running, a race of this test, not of the sweep)
        deadline = time.monotonic() + 10
        while not subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True
        ).stdout.strip():
            assert time.monotonic() < deadline, "the sleeper never entered the namespace"
            time.sleep(0.05)
        swept = netns.sweep_leftovers()
        assert f"{netns.PREFIX}-{dead}-n1" in swept
        assert _mine(dead) == [] and _mine(live) == [f"{netns.PREFIX}-{live}-n1"]
        assert sleeper.wait(10) == -signal.SIGKILL  # processes inside were killed
        assert not (netns.RUN_DIR / f"{dead}.pid").exists()
    finally:
        netns.run(["ip", "netns", "del", f"{netns.PREFIX}-{live}-n1"], check=False)
        netns.run(["ip", "netns", "del", f"{netns.PREFIX}-{dead}-n1"], check=False)
        netns.release_run(live)


def _reach(cl: ChaosCluster, src: int, dst: int) -> bool:
    """Whether a TCP connect from node src's namespace reaches node dst's agent."""
    assert cl.lan is not None
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(1.0)\n"
        f"sys.exit(0 if s.connect_ex(('{cl.lan.addr(dst)}', 7946)) == 0 else 1)\n"
    )
    p = subprocess.run([*cl.lan.exec_prefix(src), "python3", "-c", code], timeout=10)
    return p.returncode == 0


@pytest.mark.root
@needs_root
def test_network_faults_cut_and_heal(short_tmp: Path) -> None:
    with ChaosCluster(3, short_tmp, run_id=secrets.token_hex(3), mode="netns") as cl:
        assert _reach(cl, 1, 2) and _reach(cl, 2, 1)
        iso = fl.Isolate(targets=(1,))
        iso.start(cl)
        assert not _reach(cl, 1, 2) and not _reach(cl, 3, 1) and _reach(cl, 2, 3)
        iso.heal(cl)
        assert _reach(cl, 1, 2) and _reach(cl, 3, 1)
        one = fl.OneWay(targets=(2,))  # 2's frames to the others are dropped
        one.start(cl)
        assert not _reach(cl, 2, 1)  # a connect needs both ways
        one.heal(cl)
        assert _reach(cl, 2, 1)
        bw = fl.Bandwidth(targets=(3,))
        bw.start(cl)
        assert cl.lan is not None
        qd = netns.run(["ip", "netns", "exec", cl.lan.ns(3), "tc", "qdisc", "show", "dev", "eth0"])
        assert "tbf" in qd
        bw.heal(cl)
        qd = netns.run(["ip", "netns", "exec", cl.lan.ns(3), "tc", "qdisc", "show", "dev", "eth0"])
        assert "tbf" not in qd


def test_a_loopback_cluster_runs_without_namespaces(short_tmp: Path) -> None:
    with ChaosCluster(2, short_tmp, run_id=secrets.token_hex(3), mode="loopback") as cl:
        assert cl.wait_agree(30) is not None
        k = fl.Kill(targets=(2,))
        k.start(cl)
        assert not cl.agents[1].alive()
        k.heal(cl)
        assert cl.wait_agree(30) is not None
        assert not cl.agents[1].died()  # the harness's own kill is no crash
