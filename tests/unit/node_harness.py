"""A fake runtime for NodeState: carries out instructions in memory, and a fake
network that delivers handoff requests between several NodeStates.

What a real driver does with I/O (journal, processes, RPCs) is reduced to lists and
dicts, so a test states an incident as a list of stimuli and reads the outcome.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from swarm import model as m
from swarm.cluster import handoff as h
from swarm.cluster.succession import GONE
from swarm.node import events as ev
from swarm.node.arrays import MARK
from swarm.node.records import TaskRecords
from swarm.node.recovery import GUEST, REPLICA, REPLICAS, STRAYS, interrupted_offers
from swarm.node.restart import restart_plan, restore_journal
from swarm.node.state import NodeState, Settings
from swarm.policy import gpu as gpupol
from swarm.policy import shares as sh

S = m.TaskState


class FakeNode:
    def __init__(
        self,
        name: str,
        shares: int = 1024,
        gpu_devices: tuple[gpupol.GpuDevice, ...] = (),
        breaks: tuple[str, ...] = (),
        settings: Settings | None = None,
    ) -> None:
        self.name = name
        self.shares, self.gpu_devices = shares, gpu_devices
        self.settings = settings or Settings(breaks=frozenset(breaks))
        self.queue: deque[m.TaskId] = deque()
        self.running: set[m.TaskId] = set()
        self.state = self._new_state(TaskRecords(), 0.0)
        self.kv: dict[str, Any] = {}
        # the journal, for restarts: what landed, and what was written since the last
        # durable write (a crash keeps a prefix of it: the journal writes in order)
        self.landed_kv: dict[str, Any] = {}
        self.landed_tasks: dict[m.TaskId, m.Task] = {}
        self.unsynced: list[tuple[str, Any, Any]] = []
        self.restarts = 0
        self.outbox: deque[h.Send] = deque()
        self.placements: list[m.TaskId] = []
        self.outcomes: list[tuple[m.TaskId, bool, str]] = []
        self.finals: dict[m.TaskId, int] = {}  # terminal records journaled, per task
        self.home_finals: dict[m.TaskId, int] = {}  # ... those journaled as its home
        self.stopped: list[m.TaskId] = []
        self.preempted: list[ev.Preempt] = []
        self.logs: list[str] = []
        self.retry_failed_offers = False
        self.notices_out: list[ev.SendNotices] = []
        self.replica_out: list[ev.SendReplica] = []
        self.forgotten: list[m.TaskId] = []
        self.asks: list[ev.AskLease] = []
        self.renewals: list[ev.RenewLease] = []

    # ------------------------------------------------------------ driver

    def run(self, instrs: list[ev.Instruction]) -> None:
        for i in instrs:
            if isinstance(i, ev.Record):
                if i.task.state.terminal:
                    self.finals[i.task.id] = self.finals.get(i.task.id, 0) + 1
                    if i.task.spec.home == self.name:  # as its home (adopted: since)
                        self.home_finals[i.task.id] = self.home_finals.get(i.task.id, 0) + 1
                self.journal(("task", i.task.id, i.task), i.durable)
            elif isinstance(i, ev.Forget):
                self.forgotten.append(i.task_id)
                self.journal(("forget", i.task_id, None))
            elif isinstance(i, ev.Persist):
                for op in i.ops:
                    if isinstance(op, ev.Put):
                        self.kv[op.key] = op.value
                    else:
                        self.kv.pop(op.key, None)
                # one write, all or nothing (the journal commits each enqueued list
                # in one transaction)
                self.journal(("ops", None, i.ops), i.durable)
            elif isinstance(i, ev.Enqueue):
                if i.front:
                    self.queue.appendleft(i.task_id)
                else:
                    self.queue.append(i.task_id)
            elif isinstance(i, ev.Requeue):
                self.queue.appendleft(i.task_id)
            elif isinstance(i, ev.Dequeue):
                if i.task_id in self.queue:
                    self.queue.remove(i.task_id)
            elif isinstance(i, ev.StopRun):
                self.stopped.append(i.task_id)
            elif isinstance(i, ev.Preempt):
                self.preempted.append(i)
            elif isinstance(i, ev.SendHandoff):
                self.outbox.append(i.send)
            elif isinstance(i, ev.Place):
                self.placements.append(i.task_id)
            elif isinstance(i, ev.PlaceMany):
                self.placements.extend(i.task_ids)
            elif isinstance(i, ev.OfferOutcome):
                self.outcomes.append((i.task_id, i.ok, i.reason))
                if not i.ok and self.retry_failed_offers:
                    self.placements.append(i.task_id)  # the waiting placement retries
            elif isinstance(i, ev.Log):
                self.logs.append(i.event)
            elif isinstance(i, ev.SendNotices):
                self.notices_out.append(i)
            elif isinstance(i, ev.SendReplica):
                self.replica_out.append(i)
            elif isinstance(i, ev.AskLease):
                self.asks.append(i)
            elif isinstance(i, ev.RenewLease):
                self.renewals.append(i)
            elif isinstance(i, ev.Later):
                self.run(list(i.instructions))

    def _new_state(self, records: TaskRecords, wall: float) -> NodeState:
        self.ledger = sh.ShareLedger(self.shares)
        return NodeState(
            self.name,
            ledger=self.ledger,
            records=records,
            settings=self.settings,
            gpu_devices=self.gpu_devices,
            queued=self.queue,
            running=self.running,
            wall=wall,
        )

    # ------------------------------------------------------------ journal

    def journal(self, op: tuple[str, Any, Any], durable: bool = False) -> None:
        self.unsynced.append(op)
        if durable:
            self.sync()

    def sync(self, keep: int | None = None) -> None:
        """What was written lands (`keep`: only its first so many writes, each a
        record or a Persist's ops; the rest is lost, as in a crash before the journal
        wrote them)."""
        for kind, key, value in self.unsynced[:keep]:
            if kind == "task":
                self.landed_tasks[key] = value
            elif kind == "forget":
                self.landed_tasks.pop(key, None)
            else:
                for op in value:
                    if isinstance(op, ev.Put):
                        self.landed_kv[op.key] = op.value
                    else:
                        self.landed_kv.pop(op.key, None)
        self.unsynced.clear()

    def restart(
        self,
        keep: int,
        members: tuple[tuple[m.NodeId, m.MemberState], ...],
        now: float,
        wall: float,
        outlive: bool = True,
    ) -> None:
        """The agent is killed (the first `keep` ops written since the last durable
        write land, the rest are lost; its processes run on under their supervisor,
        or, `outlive` False, die with it: a host's reboot) and starts again from its
        journal, as runtime/recovery.py `recover` and runtime/driver.py `restore` and
        `run` bring it back (node/restart.py)."""
        self.sync(keep)
        self.restarts += 1
        self.kv = dict(self.landed_kv)
        self.outbox.clear()
        self.replica_out.clear()
        self.notices_out.clear()
        self.queue.clear()
        records = TaskRecords()
        active = sorted(
            (t for t in self.landed_tasks.values() if not t.state.terminal),
            key=lambda t: (t.created_at, t.id),
        )
        owed_keys = (GUEST, REPLICAS, STRAYS, MARK, REPLICA)  # as runtime/journalreads.py
        owed = {k.split(":", 1)[1] for k in self.kv if k.startswith(owed_keys)}
        for t in self.landed_tasks.values():
            if not t.state.terminal or t.id in owed:
                records.store(t)
        # a process outlives the agent under its supervisor; one whose RUNNING record
        # did not land is killed at the restart (recovery.py: nobody would watch it)
        outlived = {t.id for t in active if t.state is S.RUNNING and t.node == self.name}
        self.running.intersection_update(outlived if outlive else ())
        self.state = self._new_state(records, wall)
        alive_at, instrs = restore_journal(self.state, self.kv, wall)
        self.run(instrs)
        plan = restart_plan(self.name, active, self.state.handoffs.guest.entries, self.running)
        # one not watched again (its guest record forgotten: the task moved on, or was
        # yielded and its stop had not landed) is killed, as runtime/recovery.py does
        # (stop 54: the copies walks finished such a process with no record to end)
        self.running.intersection_update(plan.watch)
        st = self.state
        for tid in plan.forget:
            st.records.forget(tid)
            self.journal(("forget", tid, None))
        for tid in plan.watch:
            self.ledger.add(st.records.active[tid].spec)
        for tid in plan.fail:
            t = st.records.apply(tid, S.FAILED, wall, "agent restarted (--no-retry)")
            self.run([ev.Record(t)])
        for tid in plan.requeue:
            t = st.records.apply(tid, S.QUEUED, wall, "agent restarted", node=self.name)
            self.run([ev.Record(t)])
        for tid in plan.enqueue:
            self.ledger.add(st.records.active[tid].spec)
            self.queue.append(tid)
        # driver.run: the timers, offers a crash cut short, the restart's doubt, then
        # each task of ours: an array goes on from its progress, one waiting for its
        # parents is judged again (groupio.py `resume_group`), a queued one is placed
        self.run(st.start_timers(now))
        for tid in interrupted_offers(st.records.active, st.handoffs):
            t = st.records.apply(tid, S.QUEUED, wall, "offer interrupted", node=self.name)
            self.run([ev.Record(t)])
        self.run(st.restarted_after(now, wall, alive_at))
        self.placements = []
        for t in list(st.records.active.values()):
            mine = t.spec.home == self.name and t.node == self.name and not t.spec.is_global
            if mine and t.spec.after and t.state is S.QUEUED and t.id not in self.ledger:
                self.run(st.handle(ev.DepsSubmitted(now, wall, f"{t.id}/deps", t.id)))
            elif mine and t.spec.array:
                self.run(st.handle(ev.ArraySubmitted(now, wall, f"{t.id}/array", t.id)))
            elif mine and t.state is S.QUEUED and t.id not in self.ledger:
                self.placements.append(t.id)
        # then the view it rejoins (runtime/failoverio.py `_members_seen`: a holder of
        # our tasks that died while we were down is dead in it, with no event)
        sid = f"{self.name}/restart{self.restarts}"
        stimuli: list[ev.Event] = [ev.MembersSeen(now, wall, sid, members)]
        for node, state in members:
            if node != self.name and state in GONE and st.holds_at(node):
                stimuli.append(ev.NodeDead(now, wall, f"{sid}/{node}", node))
        self.run(st.handle(*stimuli))

    # ------------------------------------------------------- what a runner does

    def submit(self, spec: m.TaskSpec, wall: float = 0.0) -> m.TaskSpec:
        spec = m.TaskSpec(**{**_fields(spec), "home": self.name})
        task = m.new_task(spec, wall, self.name)
        self.state.records.store(task)
        self.journal(("task", task.id, task), durable=True)  # before the answer
        return spec

    def run_here(self, tid: m.TaskId, now: float = 0.0) -> None:
        t = self.state.records.active[tid]
        self.run(self.state.enqueue_local(t, now))

    def try_start(self, tid: m.TaskId, now: float = 0.0, wall: float = 0.0) -> str | None:
        """The runner's dispatch of one queued task: gate, then start."""
        t = self.state.records.active[tid]
        why, instrs = self.state.can_start(t, None, now)
        self.run(instrs)
        if why is not None:
            return why
        self.queue.remove(tid)
        self.running.add(tid)
        started = self.state.records.apply(tid, S.RUNNING, wall, "started", node=self.name)
        self.journal(("task", tid, started))
        self.run(self.state.on_started(started, now, wall))
        return None

    def finish(self, tid: m.TaskId, code: int = 0, now: float = 0.0, wall: float = 0.0) -> None:
        self.running.discard(tid)
        dst = S.SUCCEEDED if code == 0 else S.FAILED
        done = self.state.records.apply(tid, dst, wall, f"exit {code}", exit_code=code)
        self.run([ev.Record(done, durable=True)])
        self.run(self.state.on_ended(done, now, wall))


class OneHome:
    """One node that homes its tasks and runs them itself, for the single-node
    stateful tests (arrays, dependencies across restarts): mixed into a hypothesis
    state machine, whose __init__ calls `init_home`."""

    node: FakeNode
    now: float

    def init_home(self, slots: int = 3) -> None:
        self.node = FakeNode("A", settings=Settings(slots=slots))
        self.node.run(self.node.state.start_timers(0.0))
        self.now = 0.0

    @property
    def ns(self) -> NodeState:
        return self.node.state

    def wall(self) -> float:
        return 1000.0 + self.now

    def record(self, tid: m.TaskId) -> m.Task | None:
        """As `swarm status` reads it: memory, else the journal (a finished record is
        not read back into memory at a restart)."""
        return self.ns.records.get_cached(tid) or self.node.landed_tasks.get(tid)

    def place_here(self) -> None:
        """The home places what it was told to: here (it is the only node)."""
        node = self.node
        while node.placements:
            tid = node.placements.pop(0)
            t = self.ns.records.active.get(tid)
            if t is None or t.state is not S.QUEUED or tid in node.queue or tid in self.ns.ledger:
                continue
            node.run_here(tid, self.now)

    def restart_home(self, keep: int, outlive: bool) -> tuple[int, set[m.TaskId]]:
        """`FakeNode.restart` of the home alone: (the writes lost, the tasks whose
        process died with the agent)."""
        node = self.node
        lost = len(node.unsynced) - keep
        running = set(node.running)
        node.restart(keep, (("A", m.MemberState.ALIVE),), self.now, self.wall(), outlive)
        return lost, running - node.running


def gossip(*nodes: FakeNode, at: float = 0.0) -> None:
    """Every node learns every other node's current report."""
    for n in nodes:
        for other in nodes:
            if other is not n:
                n.state.view.upsert(other.state.local_report(at), at)


def busy(node: FakeNode, count: int) -> None:
    """`count` tasks queued at `node` (its load rises by as many)."""
    for i in range(count):
        spec = node.submit(m.TaskSpec(id=f"{node.name}-busy{i}", argv=("x",)))
        node.run_here(spec.id)


def _fields(spec: m.TaskSpec) -> dict[str, Any]:
    import attrs

    return attrs.asdict(spec, recurse=False)


class FakeNet:
    """Delivers each node's handoff sends to their destination, one at a time."""

    def __init__(self, *nodes: FakeNode) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.dead: set[str] = set()

    def pending(self) -> list[tuple[str, h.Send]]:
        return [(n.name, s) for n in self.nodes.values() for s in n.outbox]

    def deliver(self, src: str, lose: bool = False, now: float = 0.0, wall: float = 0.0) -> bool:
        """Deliver the oldest send of `src` (lost, or to a dead node: no reply)."""
        node = self.nodes[src]
        if not node.outbox or src in self.dead:
            return False
        s = node.outbox.popleft()
        reply: h.Reply | None = None
        if not lose and s.dest not in self.dead and s.dest in self.nodes:
            dest = self.nodes[s.dest]
            # as the driver does: an offer is admitted on the target's fresh state
            r = s.request
            refusal = dest.state.admission_refusal(r.spec) if isinstance(r, h.Offer) else None
            reply, instrs = dest.state.on_request(src, r, now, wall, refusal=refusal)
            dest.run(instrs)
        node.run(node.state.on_reply(s.dest, s.request, reply, now, wall))
        return True

    def settle(self, now: float = 0.0, wall: float = 0.0, limit: int = 200) -> None:
        """Deliver everything (and what that causes) until quiet."""
        for _ in range(limit):
            moved = False
            for name in list(self.nodes):
                while self.deliver(name, now=now, wall=wall):
                    moved = True
            if not moved:
                return

    def kill(self, name: str, now: float = 0.0, wall: float = 0.0) -> None:
        """A node is gone for good: every other node's membership declares it dead."""
        self.dead.add(name)
        for other in self.nodes.values():
            if other.name not in self.dead:
                other.run(other.state.on_node_dead(name, now, wall))


def long_walks(
    make: Callable[[], Any],
    step: Callable[[Any, random.Random], None],
    walks: int,
    steps: int,
    checks: Callable[[Any], None] = lambda mch: None,
) -> dict[str, int]:
    """Long seeded walks of a stateful test (hypothesis favours short runs): walk
    `seed` in range(walks) takes `steps` steps of `step` from `make()`, `checks`
    after each, then its teardown; what the walks' `seen` counted, summed."""
    seen: dict[str, int] = {}
    for seed in range(walks):
        rng = random.Random(seed)
        mch = make()
        for _ in range(steps):
            step(mch, rng)
            checks(mch)
        mch.teardown()
        for k, v in mch.seen.items():
            seen[k] = seen.get(k, 0) + v
    return seen
