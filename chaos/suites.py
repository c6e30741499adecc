"""The scenarios of each suite. `full` (make chaos) takes about 23 minutes on 2 cores;
`smoke` (make chaos-smoke, part of make test) about 40 s; `canary` is the self-test's."""

from __future__ import annotations

from typing import Any

from .schedule import Scenario

SHIM = "drop=0.05,delay=0.005:0.03,dup=0.05,reorder=0.1"


def _full(name: str, **kw: Any) -> Scenario:
    """Full-suite defaults: 5 agents with 2 slots each, tasks of 0.2-2 s and bursts that
    build queues, so faults hit running and queued work and transfers happen."""
    base: dict[str, Any] = {
        "nodes": 5, "duration": 40.0, "tasks": 110, "slots": 2,
        "task_seconds": (0.2, 2.0), "bursts": 4,
    }  # fmt: skip
    return Scenario(name, **{**base, **kw})


# Elastic pools (issue 25): every agent carries `[scale.chaos]` (chaos.elastic: min 1
# node, max-step 1, scale-in window 4 s, in-cooldown 8 s, lease 2 s) whose hooks only
# record their calls; a light workload (a few short tasks at once) keeps utilisation
# far below the scale-in threshold, so the pool scales in every cooldown from a few
# seconds in, while one split (16-20 s, from 4-6 s) cuts the cluster in two and each
# side elects its own actor. No harness drains: they would count as an operator's.
ELASTIC = Scenario(
    "elastic", nodes=5, duration=34.0, tasks=45, slots=2, task_seconds=(0.2, 1.0),
    bursts=0, globals=2, drains=False, elastic=True, faults=("split",),
    hold=(16.0, 20.0), gap=(40.0, 40.0), settle=60.0,
    description="elastic pool scaling in (recording hooks, max-step 1) while a split "
    "cuts the cluster in two: nothing lost, at most max-step x sides nodes removed per "
    "in-cooldown, no victim busy when its hook ran",
)  # fmt: skip

# Home failover (issue 19): one node is lost for good with its tasks (every process in
# its namespace killed, never restarted) 12-14 s in, once bursts of 1-4 s tasks have
# built queues on the runners, while a second lane kills
# and restarts other nodes; agents adopt a dead home's tasks after 5 s (--home-grace).
# Every task the lost node had handed to a surviving node must end there, once; those
# still at the lost node are lost with it until replicas exist (counted, stated).
HOME_LOSS = _full(
    "home-loss", faults=("lose",), hold=(25.0, 25.0), gap=(40.0, 40.0), warmup=12.0,
    task_seconds=(1.0, 4.0), bursts=6, faults2=("kill",), drains=False, home_grace=5.0,
    settle=90.0,
    description="one node lost for good with its tasks (never restarted) while others "
    "are killed and restarted: what it had handed out is taken over and ends once",
)  # fmt: skip

FULL: tuple[Scenario, ...] = (
    _full("kill-restart", faults=("kill",), hold=(3.0, 8.0),
          description="kill -9 of one agent, restart from its state dir"),
    _full("pause", faults=("pause",), hold=(3.0, 8.0),
          description="SIGSTOP/SIGCONT: a frozen agent comes back after being declared dead"),
    _full("isolate", faults=("isolate",),
          description="one node cut off from everyone (nftables on the bridge)"),
    _full("split", faults=("split",),
          description="the cluster split in two halves"),
    _full("one-way", faults=("one-way",),
          description="one node's frames to the others dropped; it still hears them"),
    _full("loss-bandwidth", faults=("loss", "bandwidth"),
          description="30% random loss on two nodes (nft numgen) / tbf 256kbit on one"),
    _full("shim", faults=("shim",), shim=SHIM,
          description="every agent under drop/delay/dup/reorder in its transport; "
          "one at a time restarted under a heavier spec"),
    _full("cpu-hog", faults=("cpu-hog",),
          description="busy loops in one node's namespace (the whole host feels them)"),
    _full("disk-full", faults=("disk-full",), tmpfs_node=True, hold=(5.0, 9.0),
          description="node 1's state dir on a 24 MiB tmpfs, filled to ENOSPC"),
    _full("mixed", nodes=6, duration=60.0, tasks=160, bursts=6, tmpfs_node=True,
          faults=("kill", "pause", "shim", "cpu-hog", "disk-full"),
          faults2=("isolate", "split", "one-way", "loss", "bandwidth"),
          description="two overlapping nemesis lanes (process and network faults)"),
    _full("flapping", faults=("kill", "pause"), hold=(1.0, 3.0), gap=(1.0, 2.0),
          description="kills and freezes in quick succession"),
    _full("disk-kill", tmpfs_node=True, faults=("disk-full",), faults2=("kill",),
          hold=(4.0, 8.0), description="a full disk and kills overlapping (restart on ENOSPC)"),
    _full("double-kill", faults=("kill",), faults2=("kill", "isolate"), hold=(3.0, 7.0),
          description="two nodes down at once (homes and executors)"),
    _full("large", nodes=10, tasks=200, bursts=6, faults=("kill", "pause"),
          faults2=("isolate", "split"), description="10 agents, two lanes"),
    # last, so that the seeds of the scenarios above stay what their reports name
    _full("encrypted", encrypted=True, shim=SHIM, faults=("kill", "pause"),
          faults2=("isolate", "one-way"), hold=(3.0, 8.0),
          description="a shared cluster key (AES-GCM, 0600 key file) instead of --insecure: "
          "kills, freezes and cuts, every agent under drop/delay/dup/reorder"),
    # after `encrypted`: appended, so that the seeds of the scenarios above stay
    _full("priority-preempt", priorities=True, bursts=6, globals=0, task_seconds=(2.5, 5.0),
          high_seconds=(0.3, 1.5), faults=("kill",), faults2=("isolate", "split"),
          hold=(3.0, 7.0),
          description="two priority classes: waves of low tasks fill every slot, high "
          "ones preempt them, under kill -9 and cuts (isolate, split)"),
    # after `priority-preempt`: appended, so that the seeds of the scenarios above stay
    _full("constrained", nodes=6, labels=True, faults=("kill", "pause"),
          faults2=("isolate", "split"), hold=(3.0, 7.0),
          description="labelled nodes (rack r1-r3, pool a/b), most tasks with hard "
          "constraints over them (=, !=, in, notin, ~, two at once), under kill -9, "
          "freezes and cuts (isolate, split)"),
    # after `constrained`: appended, so that the seeds of the scenarios above stay
    ELASTIC,
    HOME_LOSS,  # appended, so that the seeds above stay
    # issue 19, appended after home-loss: `systemctl restart`-style restarts while tasks
    # of 1-4 s run (nothing run twice, running tasks re-attached); one node's clock off
    # by 5 s under kills; a home lost for good while the others restart (its replicas
    # among them)
    # (profile `lan`, as deployed: a restart of ~1.5 s is shorter than its suspicion
    # timeout; `local`'s ~0.8 s is not, and a runner declared dead has its tasks placed
    # again: at least once, recorded, but not what a restart should do)
    _full("agent-restart", faults=("restart",), hold=(0.5, 1.0), gap=(2.0, 4.0),
          task_seconds=(1.0, 4.0), keep_tasks="always", profile="lan",
          description="agents restarted (SIGTERM, a new run at once, --keep-tasks always; "
          "profile lan) while their tasks run: nothing run twice, nothing lost"),
    _full("clock-skew", faults=("skew",), faults2=("kill", "pause"), hold=(10.0, 14.0),
          gap=(3.0, 5.0), encrypted=True,
          description="one node's clock 5 s ahead or behind (its agent restarted so), "
          "with kills and freezes on a second lane; a cluster key, so that the sealed "
          "packets' age limit is in play"),
    _full("home-loss-restarts", faults=("lose",), hold=(25.0, 25.0), gap=(40.0, 40.0),
          warmup=12.0, task_seconds=(1.0, 4.0), bursts=6, faults2=("restart",),
          lane2=((0.5, 1.0), (3.0, 5.0)), profile="lan",
          drains=False, home_grace=5.0, settle=90.0, keep_tasks="always",
          description="one node lost for good while the others restart (replicas "
          "included): what it handed out or copied is taken over and ends once"),
    # issue 22, appended: gangs of 3 (strict and non-strict) among the usual workload
    # while agents are killed and nodes cut off; their members beat every 0.2 s
    _full("gangs", faults=("kill", "isolate"), faults2=("pause",), hold=(4.0, 10.0),
          gangs=12, settle=150.0,
          description="gangs of 3 among the workload under kills, cut-off nodes and "
          "freezes: no strict gang runs partly past its lease, every gang ends"),
    # issue 23, appended: arrays (most with a cap) and tasks --after them or after
    # each other, among the usual workload, under kills and splits
    _full("arrays", faults=("kill", "split"), faults2=("pause",), hold=(4.0, 9.0),
          groups=6, settle=150.0,
          description="arrays and --after chains among the workload under kills, "
          "splits and freezes: every element once, no child before its parents"),
    # issue 24, appended: late binding on every agent (2 reservations a held task);
    # bursts at one node fill its slots so that tasks are held and pulled
    _full("late-binding", late_binding=2, slots=2, bursts=8, task_seconds=(0.5, 2.0),
          faults=("kill", "pause"), faults2=("isolate", "split"), hold=(3.0, 8.0),
          description="late binding: busy homes hold tasks, peers with room pull them, "
          "under kills, freezes and cuts: a held task runs on one node, once"),
    # issue 24, appended: --idempotent tasks, a quarter of those on n1 6x slower; a late
    # one gets a backup on another node, and freezes and cuts make runs look late too
    _full("backups", backups=80, task_seconds=(0.5, 2.0), faults=("pause", "kill"),
          faults2=("isolate",), hold=(3.0, 8.0),
          description="speculative backups: --idempotent tasks, slow on one node, under "
          "freezes, kills and cuts: backups only of them, one each, the first to finish "
          "gives the one result"),
    # stop 47, appended: one slot per node and tasks of 3-6 s, so every home keeps a
    # queue of its own (copied elsewhere); kills of 12-16 s outlast the 5 s grace, the
    # copies' holders adopt the queued tasks, and the home comes back in doubt
    # (node/doubt.py): `old-home-waits-after-adoption` is checked here with the rest
    # (seed 1034 at 60 tasks + 6 bursts of 3-6 s: ~120 s of work for 4 slots, and one
    # task, moved from queue to queue, started 110 s after its submission: past settle)
    _full("home-back", nodes=4, slots=1, tasks=40, bursts=4, task_seconds=(2.5, 5.0),
          faults=("kill",), hold=(12.0, 16.0), gap=(6.0, 10.0), warmup=8.0,
          drains=False, home_grace=5.0, settle=240.0,
          description="homes with queues of their own killed for longer than the grace "
          "and restarted: their copies' holders adopt the queued tasks, and a home back "
          "runs none of those again (it waits for the notices)"),
    # stop 53, appended: one of 4 nodes lost for good at 8-10 s (lane 2), then kills of
    # 8-12 s (past the 5 s grace) from 12 s on: two of four nodes down at once, then
    # back. Copies follow the known cluster (a submission gets its copy at the one
    # live peer, `copy-while-a-peer-is-up`; before, none), adopters make theirs, and a
    # node back gets no old home's copy over an adopter's
    _full("copies-after-a-return", nodes=4, slots=2, faults=("kill",), hold=(8.0, 12.0),
          gap=(3.0, 6.0), warmup=12.0, faults2=("lose",), lane2=((60.0, 60.0), (60.0, 60.0)),
          task_seconds=(1.0, 3.0), bursts=4, drains=False, home_grace=5.0, settle=120.0,
          description="one of 4 nodes lost for good, then others killed past the grace "
          "and back: every submission copied while a peer is up, nothing lost, what "
          "was adopted ends once"),
)  # fmt: skip

SMOKE: tuple[Scenario, ...] = (
    Scenario("smoke", nodes=4, duration=30.0, tasks=80, slots=2, bursts=2, faults=("kill",),
             faults2=("isolate",), hold=(3.0, 6.0), gap=(2.0, 4.0), globals=2,
             settle=90.0, description="kill -9 and an isolated node, with drains"),
)  # fmt: skip

# The self-test workload: no faults, a burst on node 1 and a drain of node 1 right after.
CANARY = Scenario(
    "canary",
    nodes=3,
    duration=10.0,
    tasks=20,
    drains=False,
    canary=True,
    globals=1,
    settle=60.0,
    description="broken-build self-test: burst + drain on one node, reserving tasks",
)

# The self-test workload of `constraint-respected`: labelled nodes, no faults, most
# tasks constrained (a build that ignores constraints places some on the wrong nodes).
CANARY_LABELS = Scenario(
    "canary-labels",
    nodes=3,
    duration=10.0,
    tasks=40,
    drains=False,
    globals=0,
    labels=True,
    settle=60.0,
    description="broken-build self-test: labelled nodes, constrained tasks",
)

SUITES: dict[str, tuple[Scenario, ...]] = {
    "full": FULL,
    "smoke": SMOKE,
    "canary": (CANARY,),
    "canary-labels": (CANARY_LABELS,),
}


def find(name: str) -> Scenario:
    for suite in SUITES.values():
        for sc in suite:
            if sc.name == name:
                return sc
    raise KeyError(name)
