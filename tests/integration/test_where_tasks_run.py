"""Where a task may run (issue 21), end to end on five loopback agents.

One module-scoped cluster of five agents with different labels and sizes serves every
test here (starting it costs several seconds); each test waits for the cluster to be
idle first and cancels what it leaves running, so none depends on another's order.

    node  slots  labels                         else
    w1    16     rack=r1 pool=a node=w1
    w2     4     rack=r1 pool=b node=w2         own mount namespace: <root>/priv/only-w2
    w3     8     rack=r2 pool=a node=w3         own mount namespace: <root>/priv/only-w3
    w4    12     rack=r2 pool=b node=w4 gpu=h100
    w5    10     rack=r3 pool=a node=w5         holds data set "imagenet"

The eligible node sets below are written out by hand: an oracle independent of
swarm.policy.constraints, which the agents use.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
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

from swarm.client import RequestFailed
from swarm.localcluster import LocalAgent
from tests.conftest import TEST_AGENT_ARGS
from tests.integration.test_cluster import LOOP, all_see, wait_for

NODES: dict[str, tuple[int, str]] = {
    "w1": (16, "rack=r1,pool=a,node=w1"),
    "w2": (4, "rack=r1,pool=b,node=w2"),
    "w3": (8, "rack=r2,pool=a,node=w3"),
    "w4": (12, "rack=r2,pool=b,gpu=h100,node=w4"),
    "w5": (10, "rack=r3,pool=a,node=w5"),
}
RACK = {"w1": "r1", "w2": "r1", "w3": "r2", "w4": "r2", "w5": "r3"}
PRIVATE = ("w2", "w3")  # each in its own mount namespace (when unshare works here)
HOLDER = "w5"  # holds the data set "imagenet"
ALL = frozenset(NODES)

# (constraints, the nodes that satisfy them)
MIX: list[tuple[list[str], frozenset[str]]] = [
    (["pool=a"], frozenset({"w1", "w3", "w5"})),
    (["rack in r1,r2"], frozenset({"w1", "w2", "w3", "w4"})),
    (["!gpu"], frozenset({"w1", "w2", "w3", "w5"})),
    (["pool!=a", "rack notin r3"], frozenset({"w2", "w4"})),
    (["node~^w[45]$"], frozenset({"w4", "w5"})),
    (["rack=r2", "pool=a"], frozenset({"w3"})),
    (["gpu=h100"], frozenset({"w4"})),
    ([], ALL),
]


# ------------------------------------------------------------------ the cluster


@attrs.define
class Where:
    agents: dict[str, LocalAgent]
    root: Path
    private: Path | None  # where each PRIVATE node's namespace has a tmpfs, with only-<name>/

    def __getitem__(self, name: str) -> LocalAgent:
        return self.agents[name]

    def idle(self, timeout: float = 60) -> None:
        """Wait until no agent runs or queues anything (what an earlier test left)."""

        def quiet() -> bool:
            for a in self.agents.values():
                with a.client() as c:
                    info = c.info()
                if info["running"] or info["queued"]:
                    return False
            return True

        wait_for(quiet, timeout, "the cluster to be idle")


def _private_python(root: Path) -> str | None:
    """A `python` that runs in a new mount namespace with a tmpfs on $SWARM_TEST_PRIVATE
    holding the directory $SWARM_TEST_ONLY; None where unshare is missing or may not
    mount here. The agent and the tasks it starts see that directory; nobody else."""
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return None
    wrapper = root / "pyns"
    wrapper.write_text(
        "#!/bin/sh\n"
        "exec unshare --mount --propagation private /bin/sh -c '"
        'mount -t tmpfs tmpfs "$SWARM_TEST_PRIVATE"'
        ' && mkdir -p "$SWARM_TEST_PRIVATE/$SWARM_TEST_ONLY"'
        ' && exec "$0" "$@"\''
        f' {shlex.quote(sys.executable)} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with tempfile.TemporaryDirectory(prefix="sw-") as d:
        root = Path(d)
        private = root / "priv"
        private.mkdir()
        wrapped = _private_python(root)
        # The migration test compares nodes by their tasks per core; the machine's load
        # average, which every agent here shares, reached 8 per core under make test
        # and made every target look as slow as w1 (stop 40): each reports 0 instead.
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            SWARM_TEST_PRIVATE=str(private),
            SWARM_TEST_MODE="1",
            SWARM_TEST_LOAD_PER_CORE="0",
        )
        env.pop("SWARM_TEST_BREAK", None)
        env.pop("SWARM_TEST_CLOCK_SKEW", None)
        agents: dict[str, LocalAgent] = {}
        try:
            seed: list[str] = []
            for name, (slots, labels) in NODES.items():
                args = [*TEST_AGENT_ARGS, *LOOP, "--slots", str(slots), "--labels", labels]
                if name == HOLDER:
                    args += ["--data-keys", "imagenet"]
                py = wrapped if name in PRIVATE and wrapped else sys.executable
                own = dict(env, SWARM_TEST_ONLY=f"only-{name}")
                a = LocalAgent(root, name, [*args, *seed], env=own, python=py)
                agents[name] = a
                a.start()
                if not seed:
                    seed = ["--seeds", f"127.0.0.1:{a.port}"]
            every = list(agents.values())
            wait_for(lambda: all_see(every, set(agents)), 60, "5 agents to converge")
            # every node's labels are in every view before a test relies on them
            wait_for(lambda: all(_labels_seen(a) for a in every), 30, "labels gossiped")
            yield Where(agents, root, private if wrapped else None)
        finally:
            for a in agents.values():
                a.stop(timeout=15)


def _labels_seen(a: LocalAgent) -> bool:
    p = a.cli("nodes", "--json", timeout=30)
    if p.returncode != 0:
        return False
    for n in json.loads(p.stdout):
        labels = dict((n.get("load") or {}).get("labels") or [])
        if labels.get("node") != n["node"]:
            return False
    return len(json.loads(p.stdout)) == len(NODES)


def wait_tasks(a: LocalAgent, ids: list[str], timeout: float = 120) -> list[dict[str, Any]]:
    out = []
    deadline = time.monotonic() + timeout
    with a.client(timeout=timeout + 10) as c:
        for tid in ids:
            left = max(1.0, deadline - time.monotonic())
            r = c.call("wait", id=tid, timeout=left)
            assert not r["timed_out"], r["task"]
            out.append(r["task"])
    return out


def ran_on(t: dict[str, Any]) -> list[str]:
    """Every node the task's record says it started running on."""
    return [h["node"] for h in t["history"] if h["dst"] == "running"]


def _transferred(h: dict[str, Any]) -> bool:
    """A queued task moved on by transfer ("moving from A to B"), not its home's handoff."""
    return str(h["cause"]).startswith("moving from")


def explain(a: LocalAgent, tid: str) -> list[dict[str, Any]]:
    with a.client() as c:
        return list(c.call("explain", id=tid)["decisions"])


def cancel_all(a: LocalAgent, ids: list[str]) -> None:
    with a.client() as c:
        for tid in ids:
            try:
                c.cancel(tid)
            except RequestFailed:
                pass  # finished already


# ------------------------------------------------------------------ 1. constraints


def test_a_thousand_constrained_tasks_run_only_where_they_may(where: Where) -> None:
    where.idle()
    entries = [where["w2"], where["w4"]]  # two homes; one (w2) is outside most sets
    per_entry: list[list[tuple[str, frozenset[str]]]] = [[], []]
    errors: list[BaseException] = []

    def submit_from(i: int) -> None:
        try:
            with entries[i].client() as c:
                for k in range(500):
                    cons, ok = MIX[(k + i) % len(MIX)]
                    # half of them long enough that queues form and transfer moves some
                    argv = ["sleep", "2"] if k % 2 == 0 else ["true"]
                    extra: dict[str, Any] = {"constraints": cons} if cons else {}
                    per_entry[i].append((c.submit(argv, cwd="/", **extra), ok))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=submit_from, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    submitted = time.monotonic() - t0
    tasks: list[tuple[dict[str, Any], frozenset[str]]] = []
    for a, sub in zip(entries, per_entry, strict=True):
        got = wait_tasks(a, [tid for tid, _ in sub], timeout=150)
        tasks += list(zip(got, [ok for _, ok in sub], strict=True))
    took = time.monotonic() - t0
    assert len(tasks) == 1000
    bad_state = [t["spec"]["id"] for t, _ in tasks if t["state"] != "succeeded"]
    assert not bad_state, bad_state[:5]
    violations = [
        (t["spec"]["id"], t["spec"].get("constraints"), n)
        for t, ok in tasks
        for n in ran_on(t)
        if n not in ok
    ]
    assert violations == [], violations[:10]
    # a task handed on after its home is queued at its target: that node must fit too
    queued_off = [
        (t["spec"]["id"], h["node"])
        for t, ok in tasks
        for h in t["history"]
        if h["dst"] == "queued" and h["node"] not in ok and h["node"] != t["spec"]["home"]
    ]
    assert queued_off == [], queued_off[:10]
    where_ran = Counter(ran_on(t)[-1] for t, _ in tasks)
    moved = sum(1 for t, _ in tasks if any(_transferred(h) for h in t["history"]))
    reruns = sum(1 for t, _ in tasks if len(ran_on(t)) > 1)
    print(
        f"1000 tasks: submitted in {submitted:.1f}s, all done in {took:.1f}s;"
        f" ran {dict(sorted(where_ran.items()))}; {moved} transferred while queued;"
        f" {reruns} ran more than once; 0 violations"
    )
    assert set(where_ran) == ALL, where_ran


def test_transfer_moves_queued_tasks_only_where_they_may_run(where: Where) -> None:
    """Queues of pool=a tasks on w1 and w3 while w5 (the third pool=a node) is drained;
    once it is undrained, transfer moves queued tasks to it, and never to w2 or w4,
    which are idle, and so the most attractive receivers but for the constraint."""
    where.idle()
    w1, w5 = where["w1"], where["w5"]
    eligible = {"w1", "w3", "w5"}
    ids: list[str] = []
    try:
        assert w5.cli("drain").returncode == 0
        wait_for(lambda: _drained_seen(w1, {"w5"}), 20, "w5 drained in w1's view")
        # 24 slots on w1 and w3: 56 of them queue, for ~10 s (with `sleep 3` the queues
        # were gone once before transfer had moved any, under heavier load than make
        # test's: the undrain reached the others late)
        with w1.client() as c:
            ids = [c.submit(["sleep", "5"], cwd="/", constraints=["pool=a"]) for _ in range(80)]
        # every task at a runner (queued, running or done), none left in w1's placement
        # stage: such a one is handed to w5 once it is undrained, not transferred, and
        # under make test's load all five that reached w5 once went that way (stop 43)
        wait_for(lambda: _all_at_runners(w1, [w1, where["w3"]], ids), 30, "queues on w1, w3")
        assert w5.cli("undrain").returncode == 0
        tasks = wait_tasks(w1, ids, timeout=60)
    finally:
        w5.cli("undrain")
        cancel_all(w1, ids)
    assert all(t["state"] == "succeeded" for t in tasks)
    transfers = [h["cause"] for t in tasks for h in t["history"] if _transferred(h)]
    queued_at = [h["node"] for t in tasks for h in t["history"] if h["dst"] == "queued"]
    ran = Counter(n for t in tasks for n in ran_on(t))
    print(f"80 pool=a tasks ran {dict(sorted(ran.items()))}; transfers: {Counter(transfers)}")
    assert set(ran) <= eligible and set(queued_at) <= eligible, (ran, set(queued_at))
    assert transfers and all(c.split()[-1] in eligible for c in transfers), transfers
    assert ran["w5"] > 0, ran


def test_migration_never_moves_a_task_where_its_constraints_fail(where: Where) -> None:
    """w1 (pool=a) is overloaded with pool=a tasks that may restart elsewhere. While
    the other pool=a nodes are drained, the only targets are idle pool=b nodes: the
    policy must say so and keep the tasks; once they are undrained, a task moves to one
    of them and never to w2 or w4."""
    where.idle()
    w1, w3, w5 = where["w1"], where["w3"], where["w5"]
    eligible = {"w1", "w3", "w5"}
    load: list[str] = []
    movers: list[str] = []
    try:
        for a in (w3, w5):
            assert a.cli("drain").returncode == 0
        wait_for(lambda: _drained_seen(w1, {"w3", "w5"}), 20, "w3 and w5 drained in w1's view")
        with w1.client() as c:
            load = [c.submit(["sleep", "900"], cwd="/", constraints=["node=w1"]) for _ in range(13)]
            # A restart costs the task's age a; the gain is (declared - a) x the slowdown
            # difference (8 per core on w1 against ~1): with 60 s declared the move
            # stops paying at a = 50 s, and a loaded machine reached that (stop 39).
            movers = [
                c.submit(
                    ["sleep", "900"],
                    cwd="/",
                    constraints=["pool=a"],
                    migrate="restart",
                    expected_runtime=600.0,
                )
                for _ in range(3)
            ]
        wait_for(lambda: _running(w1) >= 16, 30, "16 tasks running on w1")
        for tid in movers:
            with w1.client() as c:
                assert c.status(tid)["node"] == "w1"

        def refused_for_constraints() -> bool:
            return any(
                d.get("kind") == "migration" and "does not satisfy it" in d.get("outcome", "")
                for tid in movers
                for d in explain(w1, tid)
            )

        wait_for(refused_for_constraints, 20, "a migration decision naming the constraint")
        for a in (w3, w5):
            assert a.cli("undrain").returncode == 0

        def moved() -> bool:
            with w1.client() as c:
                return any(c.call("status", id=tid)["migrations"] for tid in movers)

        try:
            wait_for(moved, 40, "a constrained task to migrate to w3 or w5")
        except AssertionError as e:  # say why w1 kept them: the figures of its last verdicts
            last = [
                (d.get("code"), d.get("outcome"))
                for tid in movers
                for d in explain(w1, tid)[-2:]
                if d.get("kind") == "migration"
            ]
            raise AssertionError(f"{e}; w1's last migration decisions: {last}") from None
        with w1.client() as c:
            states = {tid: c.call("status", id=tid) for tid in movers}
        decisions = [d for tid in movers for d in explain(w1, tid) if d.get("kind") == "migration"]
        for d in decisions:  # a target is named only when it was weighed (eligible)
            assert d.get("target") in (None, *eligible), d
        migs = [mg for st in states.values() for mg in st["migrations"]]
        assert migs and all(mg["to"] in eligible for mg in migs), migs
        for st in states.values():
            assert set(ran_on(st["task"])) <= eligible, st["task"]["history"]
        print(
            "migrations:",
            [(mg["from"], mg["to"], mg["mode"], mg["outcome"]) for mg in migs],
            "decisions:",
            Counter(d.get("code") for d in decisions),
        )
    finally:
        for a in (w3, w5):
            a.cli("undrain")
        cancel_all(w1, load + movers)


def _drained_seen(a: LocalAgent, names: set[str]) -> bool:
    p = a.cli("nodes", "--json", timeout=30)
    view = {n["node"]: (n.get("load") or {}) for n in json.loads(p.stdout)}
    return all(view.get(n, {}).get("shares", 1) == 0 for n in names)


def _running(a: LocalAgent) -> int:
    with a.client() as c:
        return int(c.info()["running"])


def _all_at_runners(home: LocalAgent, runners: list[LocalAgent], ids: list[str]) -> bool:
    """Is every task of `ids` in a runner's queue, running there, or ended?"""
    at = 0
    for a in runners:
        with a.client() as rc:
            info = rc.info()
        at += int(info["queued"]) + int(info["running"])
    if at >= len(ids):
        return True
    with home.client() as c:
        done = sum(1 for t in ids if c.status(t)["state"] in ("succeeded", "failed"))
    return at + done >= len(ids)


def _queued(a: LocalAgent) -> int:
    with a.client() as c:
        return int(c.info()["queued"])


# ------------------------------------------------------------------ 2. host size


def test_a_16_slot_node_takes_about_4_times_the_work_of_a_4_slot_node(where: Where) -> None:
    """Default shares are 1024 a slot: w1 (16 slots) has 4x the shares of w2 (4), so
    placement keeps their load indexes (weight per share) level by queueing about 4x
    the tasks at w1, which also runs 4 at a time for w2's 1. The ratio is not exactly
    4: the first tasks land while both are empty (two choices on a stale view), the
    last ones while the queues drain, and transfer evens out queues in bursts; [2.5, 6]
    tells "proportional to size" from "even" (1) or "all on the big one" (inf)."""
    where.idle()
    entry = where["w3"]  # a home outside rack r1: it only places
    t0 = time.monotonic()
    with entry.client() as c:
        ids = [c.submit(["sleep", "0.5"], cwd="/", constraints=["rack=r1"]) for _ in range(400)]
    tasks = wait_tasks(entry, ids, timeout=120)
    took = time.monotonic() - t0
    assert all(t["state"] == "succeeded" for t in tasks)
    where_ran = Counter(ran_on(t)[-1] for t in tasks)
    assert set(where_ran) <= {"w1", "w2"}, where_ran
    ratio = where_ran["w1"] / max(1, where_ran["w2"])
    print(f"400 x sleep 0.5 on rack r1 in {took:.1f}s: {dict(where_ran)}, ratio {ratio:.2f}")
    if not 2.5 <= ratio <= 6:
        # say why (a make test at 93cbc40+ saw 0.76 in 31.9 s once, under the other
        # lanes; alone and in its module it gives 4.0): who placed, refused and moved
        moved = Counter(str(h["cause"]) for t in tasks for h in t["history"] if _transferred(h))
        firsts = Counter(
            next((h["node"] for h in t["history"] if h["dst"] == "queued" and h["node"] != "w3"),
                 "?")
            for t in tasks
        )  # fmt: skip
        counters = {}
        for name in ("w1", "w2", "w3"):
            with where[name].client() as c:
                info = c.info()
            co = info["coordinator"]
            counters[name] = {
                k: co.get(k)
                for k in ("placements", "offers_refused", "offers_failed",
                          "transfers_pushed", "transfers_stolen")
            }  # fmt: skip
        sample = [tid for tid, t in zip(ids, tasks, strict=True) if ran_on(t)[-1] == "w2"][:2]
        why = [d.get("outcome") for tid in sample for d in explain(entry, tid)[-3:]]
        raise AssertionError(
            f"ratio {ratio:.2f} {dict(where_ran)} in {took:.1f}s; first queued at"
            f" {dict(firsts)}; transfers {dict(moved.most_common(4))}; counters {counters};"
            f" w3's last decisions on 2 tasks that ran on w2: {why}"
        )


# ------------------------------------------------------------------ 3. working directory


def test_a_working_directory_on_one_node_only(where: Where) -> None:
    if where.private is None:
        pytest.skip("unshare is missing or may not create a mount namespace here")
    where.idle()
    entry = where["w1"]
    only = str(where.private / "only-w3")
    nowhere = str(where.root / "nowhere")
    t0 = time.monotonic()
    with entry.client() as c:
        here = c.submit(["pwd"], cwd=only)
        anyw = c.submit(["pwd"], cwd=nowhere, cwd_any=True)
        # generous: nodes are asked in turn (those that refused stay excluded)
        t_here = c.wait(here, timeout=90)
        t_any = c.wait(anyw, timeout=30)
        out_here = b"".join(c.logs(here)).decode()
        out_any = b"".join(c.logs(anyw)).decode()
    took = time.monotonic() - t0
    # the directory exists only in w3's namespace: the task ran there, in it
    assert t_here["state"] == "succeeded" and t_here["node"] == "w3", t_here
    assert set(ran_on(t_here)) == {"w3"}
    assert out_here.strip() == only, out_here
    # --cwd-any: it runs anyway, in the user's home directory
    assert t_any["state"] == "succeeded", t_any
    assert out_any.strip() == pwd.getpwuid(os.getuid()).pw_dir, out_any
    refused = [d["outcome"] for d in explain(entry, here) if "refused" in d.get("outcome", "")]
    print(f"cwd on w3 only: ran on w3 after {len(refused)} refusal(s), {took:.1f}s for both")


def test_a_working_directory_is_looked_for_on_every_node(where: Where) -> None:
    """A cwd that exists nowhere fails, saying so, within a bound; one that exists only
    on w2, the smallest node (the last choice of every placement), runs there."""
    if where.private is None:
        pytest.skip("unshare is missing or may not create a mount namespace here")
    where.idle()
    entry = where["w1"]
    only = str(where.private / "only-w2")
    nowhere = str(where.root / "nowhere")
    with entry.client() as c:
        missing = c.submit(["pwd"], cwd=nowhere)
        on_w2 = c.submit(["pwd"], cwd=only)
    try:
        deadline = time.monotonic() + 20
        with entry.client(timeout=40) as c:
            r_missing = c.call("wait", id=missing, timeout=20)
            r_w2 = c.call("wait", id=on_w2, timeout=max(1.0, deadline - time.monotonic()))
        t_missing, t_w2 = r_missing["task"], r_w2["task"]
        print(
            f"cwd nowhere: {t_missing['state']} ({t_missing['history'][-1]['cause']});"
            f" cwd on w2 only: {t_w2['state']} on {t_w2.get('node')}"
        )
        assert t_missing["state"] == "failed", t_missing["history"][-3:]
        cause = t_missing["history"][-1]["cause"]
        assert f"working directory {nowhere} does not exist on any node" in cause, cause
        assert ran_on(t_missing) == []
        assert t_w2["state"] == "succeeded" and t_w2["node"] == "w2", t_w2["history"][-3:]
    finally:
        cancel_all(entry, [missing, on_w2])


# ------------------------------------------------------------------ 4. spread, anti-affinity


def test_a_job_spreads_evenly_over_racks(where: Where) -> None:
    where.idle()
    entry = where["w2"]
    with entry.client() as c:
        ids = [c.submit(["sleep", "3"], cwd="/", job="j1", spread="rack") for _ in range(30)]
    tasks = wait_tasks(entry, ids, timeout=90)
    assert all(t["state"] == "succeeded" for t in tasks)
    assert all(len(ran_on(t)) == 1 for t in tasks)
    per_rack = Counter(RACK[ran_on(t)[0]] for t in tasks)
    print(f"job j1 spread over racks: {dict(sorted(per_rack.items()))}")
    assert set(per_rack) == {"r1", "r2", "r3"}, per_rack
    assert max(per_rack.values()) - min(per_rack.values()) <= 1, per_rack


def test_anti_affinity_one_per_node(where: Where) -> None:
    where.idle()
    entry = where["w4"]
    with entry.client() as c:
        ids = [c.submit(["sleep", "3"], cwd="/", job="j2", anti_affinity=1) for _ in range(5)]
    tasks = wait_tasks(entry, ids, timeout=60)
    assert all(t["state"] == "succeeded" for t in tasks)
    nodes = [ran_on(t)[0] for t in tasks]
    print(f"job j2 anti-affinity 1: {nodes}")
    assert sorted(nodes) == sorted(ALL), nodes


# ------------------------------------------------------------------ 5. refused at submit


def test_a_constraint_no_node_satisfies_is_refused_at_submit(where: Where) -> None:
    entry = where["w1"]
    with entry.client() as c, pytest.raises(RequestFailed) as e:
        c.submit(["true"], cwd="/", constraints=["rack=r9"])
    assert e.value.code == "unsatisfiable", e.value
    assert "no node of the cluster could ever run this task" in e.value.message
    assert "rack=r9" in e.value.message and "--wait-for-node" in e.value.message
    p = entry.cli("submit", "--constraint", "rack=r9", "--", "true")
    assert p.returncode == 2 and "rack=r9" in p.stderr, (p.returncode, p.stderr)
    # --wait-for-node: accepted, and it waits, saying why
    with entry.client() as c:
        tid = c.submit(["true"], cwd="/", constraints=["rack=r9"], wait_for_node=True)
    try:

        def waiting() -> bool:
            return any("waiting" in d.get("outcome", "") for d in explain(entry, tid))

        wait_for(waiting, 20, "a 'waiting' placement decision")
        with entry.client() as c:
            assert c.status(tid)["state"] == "queued"
        text = json.dumps(explain(entry, tid))
        assert "rack=r9" in text, text
        out = entry.cli("explain", tid)
        assert out.returncode == 0 and "rack=r9" in out.stdout, out.stdout
        print(out.stdout.splitlines()[1:3])
    finally:
        with entry.client() as c:
            c.cancel(tid)
            assert c.wait(tid, timeout=30)["state"] == "cancelled"


# ------------------------------------------------------------------ 6. data locality


def test_tasks_reading_a_data_set_run_where_it_is(where: Where) -> None:
    where.idle()
    entry = where["w1"]
    with entry.client() as c:
        ids = [c.submit(["true"], cwd="/", data=["imagenet"]) for _ in range(10)]
    tasks = wait_tasks(entry, ids, timeout=60)
    assert all(t["state"] == "succeeded" for t in tasks)
    # swarm nodes --labels: only w5 says it holds data
    listed = entry.cli("nodes", "--labels").stdout.splitlines()
    lines = {x.split(":")[0].removesuffix(" *"): x for x in listed}
    assert "rack=r3" in lines[HOLDER] and lines[HOLDER].endswith(" data"), listed
    assert not any(lines[n].endswith(" data") for n in ALL - {HOLDER}), listed
    nodes = Counter(n for t in tasks for n in ran_on(t))
    print(f"data tasks ran on {dict(nodes)}")
    assert set(nodes) == {HOLDER}, nodes
    why = {c["why_not"] for d in explain(entry, ids[0]) for c in d.get("candidates", [])}
    assert "does not hold the task's data (delay scheduling)" in why, why
    out = entry.cli("explain", ids[0])
    assert out.returncode == 0 and "delay scheduling" in out.stdout, out.stdout
