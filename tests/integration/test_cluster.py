"""Real agent processes on loopback forming a cluster: discovery, views, failure, keys."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from swarm.localcluster import LocalAgent
from tests.conftest import AgentFactory

LOOP = ["--bind", "127.0.0.1"]


def nodes_of(a: LocalAgent) -> list[dict]:
    p = a.cli("nodes", "--json", timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def all_see(agents: list[LocalAgent], names: set[str]) -> bool:
    for a in agents:
        view = {n["node"]: n for n in nodes_of(a)}
        for name in names:
            n = view.get(name)
            if n is None or n["state"] != "alive" or n["load"] is None:
                return False
    return True


def test_ten_agents_join_by_seeds_and_see_a_kill(make_agent: AgentFactory) -> None:
    first = make_agent("s1", *LOOP)
    seed = f"127.0.0.1:{first.port}"
    agents = [first] + [make_agent(f"s{i}", *LOOP, "--seeds", seed) for i in range(2, 11)]
    names = {a.name for a in agents}
    took = wait_for(lambda: all_see(agents, names), 60, "10 agents to see each other")
    print(f"converged in {took:.1f}s")
    # `swarm nodes` shows every member with its load fields and the age of its report
    table = agents[3].cli("nodes")
    assert table.returncode == 0
    for name in names:
        assert name in table.stdout
    assert "REPORT AGE" in table.stdout
    victim = agents[4]
    victim.kill(signal.SIGKILL)
    others = [a for a in agents if a is not victim]

    def all_dead() -> bool:
        for a in others:
            view = {n["node"]: n["state"] for n in nodes_of(a)}
            if view.get(victim.name) != "dead":
                return False
        return True

    took = wait_for(all_dead, 60, f"{victim.name} declared dead everywhere")
    print(f"dead everywhere in {took:.1f}s")


def test_ten_agents_find_each_other_by_zeroconf(make_agent: AgentFactory) -> None:
    agents = [
        make_agent(f"z{i}", *LOOP, "--mdns", "--mdns-interfaces", "127.0.0.1") for i in range(1, 11)
    ]
    names = {a.name for a in agents}
    took = wait_for(lambda: all_see(agents, names), 90, "10 agents to discover each other")
    print(f"discovered in {took:.1f}s")
    assert any("cluster.discovered" in a.log_text() for a in agents)


def keyfile(tmp: Path, name: str) -> Path:
    p = tmp / name
    text = subprocess.run(
        [sys.executable, "-m", "swarm", "keygen"], capture_output=True, text=True, check=True
    ).stdout
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_a_node_with_the_wrong_key_is_never_admitted(
    make_agent: AgentFactory, short_tmp: Path
) -> None:
    good = keyfile(short_tmp, "good.key")
    bad = keyfile(short_tmp, "bad.key")
    secure = ["--no-insecure", "--keyring", str(good), *LOOP]
    a1 = make_agent("k1", *secure)
    seed = f"127.0.0.1:{a1.port}"
    a2 = make_agent("k2", *secure, "--seeds", seed)
    a3 = make_agent("k3", *secure, "--seeds", seed)
    intruder = make_agent("evil", "--no-insecure", "--keyring", str(bad), *LOOP, "--seeds", seed)
    wait_for(lambda: all_see([a1, a2, a3], {"k1", "k2", "k3"}), 60, "the keyed cluster")
    time.sleep(3)
    for a in (a1, a2, a3):
        assert "evil" not in {n["node"] for n in nodes_of(a)}
    assert {n["node"] for n in nodes_of(intruder)} == {"evil"}
    assert "reason=decrypt" in a1.log_text()
    assert "cluster.packets_refused" in a1.log_text()


def test_agent_without_a_key_refuses_to_start(short_tmp: Path) -> None:
    a = LocalAgent(short_tmp, "nokey", ["--no-mdns", "--port", "0"])
    a.start(wait=False)
    assert a.proc is not None
    assert a.proc.wait(30) == 2
    assert "--insecure" in a.log_text() and "keyring" in a.log_text()


def test_key_rotation_by_sighup_without_downtime(make_agent: AgentFactory, short_tmp: Path) -> None:
    from swarm.crypto import generate_key

    k1, k2 = generate_key(), generate_key()
    files = [short_tmp / "r1.key", short_tmp / "r2.key"]

    def write_all(*keys: str) -> None:
        for f in files:
            f.write_text("".join(k + "\n" for k in keys))
            f.chmod(0o600)

    write_all(k1)
    a1 = make_agent("r1", "--no-insecure", "--keyring", str(files[0]), *LOOP)
    a2 = make_agent(
        "r2", "--no-insecure", "--keyring", str(files[1]), *LOOP, "--seeds", f"127.0.0.1:{a1.port}"
    )
    wait_for(lambda: all_see([a1, a2], {"r1", "r2"}), 60, "two keyed agents")
    # the documented procedure: add the new key second everywhere, make it first, drop the old
    for step in ((k1, k2), (k2, k1), (k2,)):
        write_all(*step)
        for a in (a1, a2):
            assert a.proc is not None
            a.proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert all_see([a1, a2], {"r1", "r2"}), f"lost contact after rotation step {len(step)}"
    assert "agent.keyring_reload" in a1.log_text() and "result=ok" in a1.log_text()
    # a newcomer with only the new key joins
    k2file = short_tmp / "new.key"
    k2file.write_text(k2 + "\n")
    k2file.chmod(0o600)
    a3 = make_agent(
        "r3", "--no-insecure", "--keyring", str(k2file), *LOOP, "--seeds", f"127.0.0.1:{a1.port}"
    )
    wait_for(lambda: all_see([a1, a2, a3], {"r1", "r2", "r3"}), 60, "newcomer with the new key")
    # a bad file keeps the old keys
    files[0].write_text("not a key\n")
    assert a1.proc is not None
    a1.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert "kept the old keys" in a1.log_text()
    assert a1.alive()
