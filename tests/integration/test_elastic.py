"""Elastic fleets (issue 25), end to end on loopback agents with a fake cloud.

Every agent runs the same `[scale.burst]` table (written to one config file): min 2,
max 5 nodes, max-step 2, short windows. The hooks are tests/programs/scale_hook.py: a
scale-out starts new agents (same arguments, same config, seeded to the running
ones), a scale-in SIGTERMs the named ones; it logs each call (the SWARM_SCALE_*
values it was given, its wall times) and keeps the inventory of agent processes.

One test, in the order an operator would see it:

1. two agents, idle: the pool's actor holds at 2, no hook runs;
2. a burst of 500 short tasks: the pool grows to 5 and never beyond, one action
   adding at most 2 nodes (the hook's own log, `swarm scale status --json`, and the
   agent processes counted every 0.2 s);
3. the load over, the same actor (the common path: it grew the pool, it shrinks it)
   waits a scale-in window, then drains and removes nodes, at most 2 at a time, back
   to 2 and no lower;
4. the acting node is SIGKILLed (it holds no work then: every task is recorded at its
   home, another node): the pool is below min-nodes, so a scale-out is due; another
   node takes the seat within the bound stated at HANDOVER and runs it;
5. no task lost or run twice: each task writes "s ID" when it starts and "e ID" when
   it ends to one shared file; all 500 are `succeeded`, each started exactly once.

The actor is killed at min-nodes, not while a scale-in is due at 5 nodes: killing it
there would leave the shrink to a node that launched nothing, and step 3 is what
found a bug (nodes its own scale-out launched counted as booting again once removed,
so it shrank the pool below min-nodes; fixed in node/scaling.py).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from swarm.client import AgentUnreachable, Client, ClientError
from swarm.cluster.actor import rendezvous_weight
from swarm.localcluster import LocalAgent
from tests.conftest import TEST_AGENT_ARGS
from tests.integration.test_cluster import LOOP, all_see, wait_for

POOL = "burst"
MIN, MAX, STEP = 2, 5, 2
TTL = 2.0  # lease-ttl; the seat's grace is one ttl (node/scaling.py)
IN_WINDOW = 5.0  # scale-in-window
COOLDOWN = 2.0  # out- and in-cooldown
SLOTS = 2
TASKS = 500
TASK_SECONDS = 0.3
HOOK = Path(__file__).resolve().parents[1] / "programs" / "scale_hook.py"

# The hand-over bound. The dead actor stays the rendezvous owner for everyone while
# SWIM still counts it live (alive or suspect), so nobody else may claim until it is
# declared dead; then the new owner waits for the dead holder's lease to run out on
# its own clock: its last renewal's receipt + ttl + grace (grace = ttl, as the holder
# is no longer live), claims, and acts one tick later (a tick is ttl/6). So
#   hand-over <= max(SWIM's time to declare it dead, 2 ttl) + 2 ticks,
# and we assert the looser sum ttl + grace + SWIM + 2 ticks + 1 s of polling and
# scheduling on a loaded machine. SWIM (the "local" profile): the dead node is probed
# within a second (probe_interval 0.2 s, its timeout 0.1 s), then suspected for at
# most suspicion_max_timeout_mult (6) x suspicion_mult (4) x probe_interval (0.2 s)
# x max(1, log10 n) = 4.8 s for up to 10 members (with one other member left, as
# here, no confirmation is awaited: the minimum, 0.8 s, applies).
# Lower bound: the seat must not be taken before the dead holder's lease plus grace
# ran out. Its renewals come every ttl/3, so that is at least grace (= ttl) after the
# kill unless three renewals in a row were lost (then the lease had lapsed anyway).
SWIM_DEAD = 1.0 + 6 * 4 * 0.2
HANDOVER = TTL + TTL + SWIM_DEAD + 2 * TTL / 6 + 1.0
HANDOVER_MIN = TTL

CONFIG = """\
[scale.{pool}]
min-nodes = {min}
max-nodes = {max}
max-step = {step}
target-utilisation = 0.7
tolerance = 0.1
scale-out-window = 0
scale-in-window = "{in_window}s"
out-cooldown = "{cooldown}s"
in-cooldown = "{cooldown}s"
max-view-age = "10s"
slots-per-node = {slots}
scale-out-command = "{cmd}"
scale-in-command = "{cmd}"
hook-timeout = "90s"
hook-retries = 0
drain-grace = "30s"
boot-timeout = "60s"
lease-ttl = "{ttl}s"
"""


def _free_port() -> int:
    """A port free for both UDP and TCP on loopback right now."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("127.0.0.1", 0))
            port = int(t.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port


def _running(pid: int, name: str) -> bool:
    """Is `pid` still the agent `name` (not exited, not a zombie, not a reused pid)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return False
    return "--node-id" in argv and argv[argv.index("--node-id") + 1 :][:1] == [name]


# ------------------------------------------------------------------ the fleet


@attrs.define
class Fleet:
    base: Path
    agents: dict[str, LocalAgent]  # the two the test started
    samples: list[tuple[float, tuple[str, ...]]] = attrs.field(factory=list)  # wall, alive
    stop_sampling: threading.Event = attrs.field(factory=threading.Event)

    @property
    def root(self) -> Path:
        return self.base / "agents"

    def inventory(self) -> dict[str, Any]:
        path = self.base / "agents.json"  # replaced atomically by the hook
        return json.loads(path.read_text()) if path.exists() else {}

    def calls(self) -> list[dict[str, Any]]:
        path = self.base / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def alive(self) -> list[str]:
        """Every agent process of the fleet still running, by name."""
        return sorted(n for n, e in self.inventory().items() if e["pid"] and _running(e["pid"], n))

    def client(self, name: str, timeout: float = 10) -> Client:
        return Client(self.root / name / "sock", timeout=timeout)

    def scale_status(self, name: str) -> dict[str, Any] | None:
        """The pool as `name` sees it (`swarm scale status --json`'s pool); None if
        the agent does not answer."""
        try:
            with self.client(name) as c:
                pools = c.call("scale")["pools"]
        except (AgentUnreachable, ClientError, OSError):
            return None
        assert [p["pool"] for p in pools] == [POOL], pools
        return dict(pools[0])

    def actors(self) -> dict[str, dict[str, Any]]:
        """The nodes that say they act for the pool now, with their status."""
        out = {}
        for n in self.alive():
            asked = time.time()
            st = self.scale_status(n)
            if st is not None and st["acting"]:
                out[n] = {**st, "asked": asked}  # (for when its view was taken)
        return out

    def sample(self) -> None:
        while not self.stop_sampling.wait(0.2):
            try:
                names = tuple(self.alive())
            except (OSError, ValueError):  # a read racing the hook's rename
                continue
            if not self.samples or self.samples[-1][1] != names:
                self.samples.append((time.time(), names))

    def peak(self) -> int:
        return max(len(names) for _, names in self.samples)


def _write_inventory(base: Path, agents: dict[str, LocalAgent]) -> None:
    inv = {
        a.name: {"pid": a.pid, "port": a.port, "by": "test", "stopped": None}
        for a in agents.values()
    }
    (base / "agents.json").write_text(json.dumps(inv, indent=1))


def _stop_everything(fleet: Fleet) -> None:
    for a in fleet.agents.values():
        a.stop(timeout=15)
    hooked = {n: e["pid"] for n, e in fleet.inventory().items() if e.get("by") == "hook"}
    for n, pid in hooked.items():
        if pid and _running(pid, n):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for n, pid in hooked.items():
        while pid and _running(pid, n) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid and _running(pid, n):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="sw-") as d:
        base = Path(d)
        cmd = f"{sys.executable} {HOOK} {base}"
        assert '"' not in cmd and "\\" not in cmd, cmd  # written into a TOML string
        config = base / "agent.toml"
        config.write_text(
            CONFIG.format(
                pool=POOL,
                min=MIN,
                max=MAX,
                step=STEP,
                in_window=IN_WINDOW,
                cooldown=COOLDOWN,
                slots=SLOTS,
                cmd=cmd,
                ttl=TTL,
            )
        )
        args = [*TEST_AGENT_ARGS, *LOOP, "--slots", str(SLOTS), "--config", str(config)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("SWARM_CONFIG", None)
        (base / "hook.json").write_text(
            json.dumps({"python": sys.executable, "args": args, "env": env})
        )
        fleet = Fleet(base, {})
        sampler = threading.Thread(target=fleet.sample, daemon=True)
        try:
            # both at once, n2 seeded to n1's port chosen here: each agent's seat listens
            # one lease ttl before claiming, and an actor that saw only itself would
            # (rightly) scale a pool below min-nodes out at once
            port = _free_port()
            n1 = LocalAgent(fleet.root, "n1", [*args, "--port", str(port)], env=env)
            n2 = LocalAgent(fleet.root, "n2", [*args, "--seeds", f"127.0.0.1:{port}"], env=env)
            fleet.agents = {"n1": n1, "n2": n2}
            for a in (n1, n2):
                a.start(wait=False)
            for a in (n1, n2):
                a.wait_ready(60)
            _write_inventory(base, fleet.agents)
            sampler.start()
            yield fleet
        finally:
            fleet.stop_sampling.set()
            _stop_everything(fleet)
            if sampler.is_alive():
                sampler.join(5)


# ------------------------------------------------------------------ helpers


def _task_script(log: Path) -> list[str]:
    line = (
        f'echo "s $SWARM_TASK_ID" >> {log}; sleep {TASK_SECONDS}; echo "e $SWARM_TASK_ID" >> {log}'
    )
    return ["sh", "-c", line]


def _active(fleet: Fleet, home: str) -> int:
    with fleet.client(home, timeout=30) as c:
        return len(c.list())


def _cli(fleet: Fleet, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    sock = str(fleet.root / name / "sock")
    cmd = [sys.executable, "-m", "swarm", "--socket", sock, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _ran_on(t: dict[str, Any]) -> list[str]:
    return [h["node"] for h in t["history"] if h["dst"] == "running"]


def _members_alive(fleet: Fleet, name: str) -> set[str]:
    with fleet.client(name) as c:
        nodes = c.call("nodes")["nodes"]
    return {n["node"] for n in nodes if n["state"] in ("alive", "suspect")}


# ------------------------------------------------------------------ the test


def test_a_burst_grows_the_pool_to_max_it_shrinks_back_and_a_killed_actor_hands_over(
    fleet: Fleet,
) -> None:
    t_start = time.monotonic()
    n1, n2 = fleet.agents["n1"], fleet.agents["n2"]
    key = f"scale.{POOL}"
    # the tasks' home: the original node that hashes lower, so never the actor while
    # the other one lives (the acting node is killed later; the records stay whole)
    home = min(("n1", "n2"), key=lambda n: rendezvous_weight(key, n))
    wait_for(lambda: all_see([n1, n2], {"n1", "n2"}), 60, "n1 and n2 to see each other")

    def holding(name: str) -> bool:
        """`name` acts and holds the pool at min-nodes: nothing booting or draining."""
        st = fleet.scale_status(name)
        if st is None or not st["acting"] or st["decision"] is None:
            return False
        d, v = st["decision"], st["view"]
        return (
            d["action"] == "none"
            and d["desired"] == MIN
            and v["nodes"] == MIN
            and v["booting"] == 0
            and v["draining"] == 0
            and st["pending"] is None
        )

    # 1. idle at min-nodes: one actor holds at 2, and no hook ran
    wait_for(lambda: len(fleet.actors()) == 1, 60, "an actor")
    first_actor = next(iter(fleet.actors()))
    wait_for(lambda: holding(first_actor), 30, "the actor to hold the pool at 2")
    assert fleet.calls() == [], fleet.calls()
    assert fleet.alive() == ["n1", "n2"]

    # 2. the burst
    ran_log = fleet.base / "ran.log"
    t_burst = time.time()
    with fleet.client(home, timeout=60) as c:
        ids = [c.submit(_task_script(ran_log), cwd="/") for _ in range(TASKS)]
    submitted = time.time() - t_burst
    statuses: dict[str, dict[str, Any]] = {}  # the latest status of each node that acted
    cli_status: dict[str, Any] | None = None  # `swarm scale status --json` at the peak
    # when the actor's newest view that held demand for 5 nodes was taken, at the
    # earliest: the status was asked for at `asked` and answered later, and says how
    # long before its answer the view was taken (`view_ago`); so no loaded machine's
    # late tick can make it look newer than it was
    t_high = 0.0
    deadline = time.monotonic() + 300
    while _active(fleet, home) > 0:
        assert time.monotonic() < deadline, "the burst did not finish in 300 s"
        acts = fleet.actors()
        statuses.update(acts)
        if len(acts) == 1:
            (st,) = acts.values()
            v = st["view"]
            # 5 nodes of 2 slots: the recommendation is 5 while demand >= 5
            if v is not None and v["running"] + v["queued"] >= MAX:
                t_high = max(t_high, st["asked"] - st["view_ago"])
            at_max = len(fleet.alive()) == MAX and st["pending"] is None
            if cli_status is None and at_max and len(st["hooks"]) == len(fleet.calls()):
                # the pool at its max: the actor's own account of its scale-outs
                p = _cli(fleet, next(iter(acts)), "scale", "status", "--json")
                assert p.returncode == 0, p.stderr
                cli_status = json.loads(p.stdout)
        time.sleep(0.25)
    t_done = time.time()
    peak_during_burst = fleet.peak()
    with fleet.client(home, timeout=60) as c:
        done = {t["spec"]["id"]: t for t in c.list(all=True, limit=5000)}
    tasks = [done[i] for i in ids]

    # 3. the load over, the same actor shrinks the pool back to min-nodes (after its
    # scale-in window), max-step nodes at a time, and then holds there
    actor = first_actor
    wait_for(lambda: holding(actor) and len(fleet.alive()) == MIN, 90, "the pool back at 2")
    t_shrunk = time.time()
    shrunk_to = fleet.alive()
    wait_for(
        lambda: all(_members_alive(fleet, n) == set(shrunk_to) for n in shrunk_to),
        30,
        "the nodes left to see only each other",
    )
    calls_before_kill = fleet.calls()
    low_before_kill = min(len(names) for _, names in fleet.samples)

    # 4. the acting node is SIGKILLed (it has no work left; every task is recorded at
    # `home`): the pool is below min-nodes, so a scale-out is due, and only the node
    # that takes the seat can run it
    before = fleet.scale_status(actor)
    assert before is not None and before["acting"], before
    assert actor != home
    pid = fleet.inventory()[actor]["pid"]
    t_kill = time.time()
    if actor in fleet.agents:
        fleet.agents[actor].kill(signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
    others = [n for n in fleet.alive() if n != actor]
    # hand-over: the first poll that finds another node acting in a newer epoch; the
    # seat was taken after the last poll of that node that found it not acting (asked at
    # `not_yet[n]`) and before the answer that found it acting
    not_yet = {n: t_kill for n in others}
    new_actor = None
    while new_actor is None:
        took = time.time() - t_kill
        assert took < HANDOVER + 10, f"no hand-over after {took:.1f} s"
        for n in others:
            asked = time.time()
            now_st = fleet.scale_status(n)
            if now_st is None:
                continue
            if now_st["acting"] and now_st["epoch"] > before["epoch"]:
                new_actor, after = n, now_st
                break
            not_yet[n] = asked
        else:
            time.sleep(0.05)
    handover = time.time() - t_kill
    handover_lo = not_yet[new_actor] - t_kill
    wait_for(
        lambda: holding(new_actor) and len(fleet.alive()) == MIN,
        60,
        "the new actor to bring the pool back to 2",
    )
    t_restored = time.time()
    n_calls = len(fleet.calls())
    human = _cli(fleet, new_actor, "scale", "status")
    assert human.returncode == 0, human.stderr
    assert "  decision (view taken " in human.stdout, human.stdout  # the actor's decision
    final = {n: fleet.scale_status(n) for n in fleet.alive()}
    fleet.stop_sampling.set()
    calls = fleet.calls()
    assert len(calls) == n_calls, calls[n_calls:]
    outs = [k for k in calls_before_kill if k["env"]["SWARM_SCALE_ACTION"] == "out"]
    ins = [k for k in calls_before_kill if k["env"]["SWARM_SCALE_ACTION"] == "in"]
    after_kill = calls[len(calls_before_kill) :]
    envs_after = [k["env"] for k in after_kill]
    timeline = [(round(t - t_burst, 1), len(n)) for t, n in fleet.samples]

    def rel(t: float) -> str:
        return f"{t - t_burst:.1f}"

    print(
        f"\n{TASKS} tasks submitted in {submitted:.1f}s, all done at +{rel(t_done)}s;"
        f" nodes (s since the burst, count): {timeline}"
    )
    for k in calls:
        e = k["env"]
        print(
            f"  hook {e['SWARM_SCALE_ACTION']} {e['SWARM_SCALE_COUNT']}"
            f" [{e['SWARM_SCALE_NODES']}] desired {e['SWARM_SCALE_DESIRED']}"
            f" by {e['SWARM_SCALE_ACTOR']} epoch {e['SWARM_SCALE_EPOCH']}"
            f" at +{rel(k['t0'])}s ({k['t1'] - k['t0']:.1f}s) started {k.get('started')}"
            f" stopped {k.get('stopped')} ok={k['ok']}"
        )
    print(
        f"  back at {MIN} {shrunk_to} at +{rel(t_shrunk)}s ({t_shrunk - t_done:.1f}s after"
        f" the load; demand for 5 last seen at +{rel(t_high)}s); killed actor {actor}"
        f" (epoch {before['epoch']}) at +{rel(t_kill)}s; {new_actor} acts"
        f" (epoch {after['epoch']}) {handover_lo:.2f}-{handover:.2f}s later (bound"
        f" [{HANDOVER_MIN:g}, {HANDOVER:.1f}] s); back at {MIN} {fleet.alive()} at"
        f" +{rel(t_restored)}s; test {time.monotonic() - t_start:.1f}s"
    )
    print("  " + human.stdout.replace("\n", "\n  ").rstrip())

    # every hook call succeeded at its first attempt; one actor per epoch, and never
    # two hooks at once (one actor at a time, one hook at a time)
    assert all(k["ok"] and k["env"]["SWARM_SCALE_ATTEMPT"] == "0" for k in calls), calls
    actor_of: dict[str, str] = {}
    for k in calls:
        e = k["env"]
        assert (
            actor_of.setdefault(e["SWARM_SCALE_EPOCH"], e["SWARM_SCALE_ACTOR"])
            == (e["SWARM_SCALE_ACTOR"])
        ), calls
    by_start = sorted(calls, key=lambda k: k["t0"])
    assert all(a["t1"] <= b["t0"] for a, b in itertools.pairwise(by_start)), by_start

    # growth: from 2 to the max, never beyond, at most max-step per action
    assert peak_during_burst == MAX, timeline
    assert fleet.peak() <= MAX, timeline
    assert outs and all(1 <= int(k["env"]["SWARM_SCALE_COUNT"]) <= STEP for k in outs), outs
    assert all(len(k["started"]) == int(k["env"]["SWARM_SCALE_COUNT"]) for k in outs)
    assert all(int(k["env"]["SWARM_SCALE_DESIRED"]) <= MAX for k in calls)
    assert sum(len(k["started"]) for k in outs) == MAX - 2, outs
    # ... and as `swarm scale status --json` of the nodes that acted shows it
    assert cli_status is not None, "the pool never settled at its max during the burst"
    (peak_pool,) = cli_status["pools"]
    assert [(h["action"], h["count"]) for h in reversed(peak_pool["hooks"])] == [
        ("out", int(k["env"]["SWARM_SCALE_COUNT"]))
        for k in outs
        if k["env"]["SWARM_SCALE_ACTOR"] == cli_status["node"]
    ], (peak_pool["hooks"], outs)
    seen_hooks = [h for st in [*statuses.values(), peak_pool] for h in st["hooks"]]
    assert all(st["max_step"] == STEP and st["max_nodes"] == MAX for st in statuses.values())
    assert all(1 <= h["count"] <= STEP and h["ok"] for h in seen_hooks), seen_hooks

    # shrink: by the actor that grew the pool (it counts the nodes it launched as
    # booting until they join: once joined and removed, they are not booting again),
    # no earlier than a scale-in window after its view last held demand for 5 nodes,
    # at most max-step nodes at a time, never the actor itself, down to min and no lower
    assert ins and sum(int(k["env"]["SWARM_SCALE_COUNT"]) for k in ins) == MAX - MIN, ins
    assert low_before_kill == MIN, timeline
    # (t_high is when that view was taken, at the earliest: 0.1 s of slack for the
    # agent's monotonic clock against this wall clock. It was the time of the poll, with
    # 1 s of slack for a late tick, until the CI run of stop 44 failed this test under
    # make test's load; its assertion was cut from the log, and this margin, 0.2-0.5 s
    # beyond the slack in 9 runs, was the narrowest)
    assert min(k["t0"] for k in ins) >= t_high - 0.1 + IN_WINDOW, (ins, t_high)
    for k in ins:
        e = k["env"]
        removed = e["SWARM_SCALE_NODES"].split()
        assert 1 <= len(removed) <= STEP and len(removed) == int(e["SWARM_SCALE_COUNT"]), e
        assert e["SWARM_SCALE_ACTOR"] == actor and actor not in removed, e
        assert k["stopped"] == removed, k
    assert actor in shrunk_to and len(shrunk_to) == MIN, shrunk_to

    # hand-over within the bound; the new actor ran the due scale-out (the pool is back
    # at min-nodes), in a newer epoch
    assert handover_lo >= HANDOVER_MIN and handover <= HANDOVER, (handover_lo, handover)
    assert new_actor != actor and new_actor in fleet.alive()
    done_after = [(e["SWARM_SCALE_ACTION"], int(e["SWARM_SCALE_COUNT"])) for e in envs_after]
    assert done_after == [("out", MIN - 1)], after_kill
    (replace,) = after_kill
    assert replace["env"]["SWARM_SCALE_ACTOR"] == new_actor, replace
    assert int(replace["env"]["SWARM_SCALE_EPOCH"]) > before["epoch"], replace
    assert replace["t0"] >= not_yet[new_actor], (replace, not_yet)
    assert sorted([new_actor, *replace["started"]]) == fleet.alive()
    for n, fst in final.items():
        assert fst is not None and fst["draining"] == [] and fst["pending"] is None, (n, fst)

    # no task lost or run twice
    assert Counter(t["state"] for t in tasks) == {"succeeded": TASKS}
    twice = [t["spec"]["id"] for t in tasks if len(_ran_on(t)) != 1]
    assert twice == [], twice[:5]
    lines = Counter(ran_log.read_text().split("\n"))
    lines.pop("", None)
    expected = Counter({f"{p} {i}": 1 for i in ids for p in "se"})
    assert lines == expected, (lines - expected, expected - lines)
    where = Counter(_ran_on(t)[0] for t in tasks)
    print(f"  tasks ran on {dict(sorted(where.items()))}")
    assert len(where) > 2, where  # the nodes the hook added took work
