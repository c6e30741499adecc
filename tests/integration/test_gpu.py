"""GPU slicing with real agents on loopback and declared (fake) GPU inventories."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory
from tests.integration.test_cluster import LOOP, all_see, wait_for


def gpu_config(tmp: Path, name: str, n: int, mem: str = "16GiB") -> Path:
    p = tmp / f"{name}.toml"
    tables = "".join(
        f'[[gpus]]\nindex = {i}\nmemory = "{mem}"\nnvlink_group = "g0"\n\n' for i in range(n)
    )
    p.write_text(tables)
    return p


def start(make_agent: AgentFactory, tmp: Path) -> list[LocalAgent]:
    g1 = make_agent("g1", *LOOP, "--config", str(gpu_config(tmp, "g1", 2)), "--slots", "8")
    seed = f"127.0.0.1:{g1.port}"
    g2 = make_agent(
        "g2", *LOOP, "--config", str(gpu_config(tmp, "g2", 1)), "--seeds", seed, "--slots", "8"
    )
    g3 = make_agent("g3", *LOOP, "--seeds", seed, "--slots", "8")
    agents = [g1, g2, g3]
    wait_for(lambda: all_see(agents, {"g1", "g2", "g3"}), 60, "gpu cluster")
    return agents


def run_env(a: LocalAgent, tid: str) -> str:
    return a.cli("logs", tid).stdout.strip()


def test_gpu_tasks_land_only_where_there_is_room(make_agent: AgentFactory, short_tmp: Path) -> None:
    *_, g3 = start(make_agent, short_tmp)
    nodes = {n["node"]: n for n in json.loads(g3.cli("nodes", "--json").stdout)}
    assert len(nodes["g1"]["load"]["gpus"]) == 2 and nodes["g3"]["load"]["gpus"] == []
    assert "GPU FREE" in g3.cli("nodes").stdout
    show = 'echo "$CUDA_VISIBLE_DEVICES|$SWARM_GPU_CORE|$SWARM_GPU_MEMORY"; sleep 2'
    # three whole GPUs exist (2 on g1, 1 on g2): three whole-GPU tasks at the GPU-less node
    ids = [
        g3.cli("submit", "--gpu", "100", "--", "sh", "-c", show).stdout.strip() for _ in range(3)
    ]
    seen = []
    with g3.client() as c:
        for tid in ids:
            t = c.wait(tid, timeout=90)
            assert t["state"] == "succeeded", t
            assert t["node"] in ("g1", "g2")
            seen.append((t["node"], run_env(g3, tid)))
    uuids = [env.split("|")[0] for _, env in seen]
    assert all(u.startswith("GPU-") for u in uuids)
    assert all(env.split("|")[1] == "100" for _, env in seen)
    # two GPUs in one task: only g1 can
    two = g3.cli("submit", "--gpu", "200", "--", "sh", "-c", show).stdout.strip()
    with g3.client() as c:
        t = c.wait(two, timeout=60)
    assert t["node"] == "g1" and len(run_env(g3, two).split("|")[0].split(",")) == 2
    # more than exists anywhere (every node's capacity is known): refused at submit
    big = g3.cli("submit", "--gpu", "300", "--", "true")
    assert big.returncode == 2 and big.stdout == "", big
    assert "could ever run" in big.stderr and "g1: wants GPU 300%" in big.stderr, big.stderr


def test_invalid_gpu_requests_are_refused_with_the_rule(make_agent: AgentFactory) -> None:
    a = make_agent("v1")
    bad = a.cli("submit", "--gpu", "150", "--", "true")
    assert bad.returncode == 2 and "multiple-of-100" in bad.stderr
    core_only = a.cli("submit", "--gpu-core", "50", "--", "true")
    assert core_only.returncode == 2 and "core-needs-memory" in core_only.stderr
    both = a.cli(
        "submit", "--gpu-core", "50", "--gpu-memory", "1G", "--gpu-memory-ratio", "10", "--", "true"
    )
    assert both.returncode == 2


def test_slices_are_released_on_exit_cancel_and_restart(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    g = make_agent("r1", *LOOP, "--config", str(gpu_config(short_tmp, "r1", 1)), "--slots", "8")
    # sequential whole-GPU tasks all run: each exit frees the device
    ids = [g.cli("submit", "--gpu", "100", "--", "sleep", "0.3").stdout.strip() for _ in range(4)]
    with g.client() as c:
        assert all(c.wait(t, timeout=60)["state"] == "succeeded" for t in ids)
    # a half slice twice fits, a third waits until one is cancelled
    show = 'echo "$CUDA_VISIBLE_DEVICES|$SWARM_GPU_CORE"; sleep 300'
    h1 = g.cli("submit", "--gpu", "50", "--", "sh", "-c", show).stdout.strip()
    h2 = g.cli("submit", "--gpu", "50", "--", "sh", "-c", show).stdout.strip()
    h3 = g.cli("submit", "--gpu", "50", "--", "sh", "-c", show).stdout.strip()

    def state(t: str) -> str:
        return json.loads(g.cli("status", "--json", t).stdout)["state"]

    wait_for(lambda: state(h1) == "running" and state(h2) == "running", 30, "two halves running")
    time.sleep(1.0)
    assert state(h3) == "queued"
    g.cli("cancel", h1)
    wait_for(lambda: state(h3) == "running", 30, "third half after cancel")
    # kill -9 and restart: the running tasks outlive the agent under their supervisor and
    # are re-attached (issue 19), keeping their slices (restored from the journal's
    # gpu:<id> keys): no slice is free, and a new half waits; nothing leaks
    g.kill(signal.SIGKILL)
    g.start()
    wait_for(lambda: state(h2) == "running" and state(h3) == "running", 60, "re-run after restart")
    nodes = json.loads(g.cli("nodes", "--json").stdout)
    free = sum(gd[1] for gd in nodes[0]["load"]["gpus"])
    assert free == 0
    for t in (h2, h3):
        rec = json.loads(g.cli("status", "--json", t).stdout)
        assert rec["attempts"] == 1, rec  # re-attached, not run again
    h4 = g.cli("submit", "--gpu", "50", "--", "sleep", "300").stdout.strip()
    time.sleep(1.5)
    assert state(h4) == "queued"  # the re-attached tasks' slices are not given away
    g.cli("cancel", h4)
    g.cli("cancel", h2)
    g.cli("cancel", h3)
    wait_for(
        lambda: (
            sum(gd[1] for gd in json.loads(g.cli("nodes", "--json").stdout)[0]["load"]["gpus"])
            == 100
        ),
        30,
        "all slices free",
    )
