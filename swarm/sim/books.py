"""The simulator's nodes and tasks, and the books every part of a run shares.

`SimNode` is one node: its `ShareLedger`, run queue, running set under processor
sharing, and an empty `GpuAllocator` (the cluster engine models no GPUs; `gpusim` does).
`Books` is the base of `engine.ClusterSim`: the event heap, the counters, and what
happens on a node (a task queued, taken away, started, finished). Starting goes
through the agent's own start gate, `node.gate.can_start` (shares, reservations,
drain, GPU slice). A task arriving at a node (placed, pushed, stolen, migrated) goes
through the agent's admission, `node.decide.admission_refusal`, with no Flex
measurements: the simulator models none (P = 1, no usage, no capacity).
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections import deque
from typing import Any, cast

from swarm.cluster.handoff import GuestSide
from swarm.model import LoadReport, NodeId, Task, TaskId, TaskSpec
from swarm.node.gate import can_start
from swarm.policy import migration as mig
from swarm.policy.gpu import GpuAllocator
from swarm.policy.latebind import LateBinding
from swarm.policy.placement import Needs, PlacementRetry
from swarm.policy.shares import ShareLedger
from swarm.policy.transfer import QueuedTask, TransferPolicy
from swarm.policy.view import LoadView, PeerInfo

from .simconfig import Board, Fresh, SimConfig, SimError
from .workloads import NodeSpec

FRONT_ID = "frontend"
FRONT_REPORT = LoadReport(FRONT_ID, 1, shares=0)  # drained: never a candidate
GPU_POLICY = "binpack"  # the agent's default (Settings.gpu_policy); no GPUs here anyway

# Event kinds (indices into ClusterSim's handler table).
(
    ARRIVE,
    DONE,
    PUBLISH,
    VIEWPUT,
    BOARD,
    HANDOFF,
    REFUSED,
    RETRY,
    STEP,
    PROBE,
    REPLY,
    STEAL,
    MOVE,
    MIGTICK,
    MIGARRIVE,
    RESET,
    RESERVE,
    CANCEL,
    PULL,
    PULLREP,
    LATEGIVE,
    LATEEXP,
) = range(22)


class _Settled:
    """The guest side of every simulated node. The simulator has no handoff protocol:
    a task handed to a node (placed, pushed, stolen or migrated there) is settled on
    arrival, its admission there being the handoff, so the gate's "handoff not
    settled" check always passes."""

    def may_run(self, _task_id: TaskId) -> bool:
        return True


SETTLED = cast(GuestSide, _Settled())


class SimTask:
    __slots__ = (
        "arrival",
        "arrived_at",
        "finish_vt",
        "first_start",
        "idx",
        "last_move",
        "moves",
        "needs",
        "node",
        "origin",
        "qt",
        "rec",
        "reserved",
        "retry",
        "spec",
        "started",
        "waited",
        "work_left",
    )

    def __init__(self, idx: int, spec: TaskSpec, arrival: float, work: float) -> None:
        self.idx = idx
        self.spec = spec
        self.rec = Task(spec)  # the record the agent's start gate reads
        self.arrival = arrival
        self.work_left = work
        self.arrived_at = arrival
        self.finish_vt = 0.0
        self.first_start = -1.0
        self.started = False
        self.moves = 0
        self.last_move: float | None = None
        self.needs: Needs | None = None
        self.qt: QueuedTask | None = None
        self.node: SimNode | None = None
        self.origin: SimNode | None = None
        self.retry: PlacementRetry | None = None
        self.waited = False
        self.reserved = spec.reserve_shares > 0


class SimNode:
    __slots__ = (
        "area",
        "area_at",
        "bucket",
        "busy",
        "cores",
        "gpus",
        "held",
        "hold_until",
        "id",
        "idx",
        "lb",
        "ledger",
        "mig_here",
        "queue",
        "rate",
        "rep",
        "repv",
        "res_area",
        "running",
        "shares",
        "slots",
        "speed",
        "touched",
        "tp",
        "ver",
        "vt",
        "vt_at",
    )

    def __init__(self, idx: int, spec: NodeSpec) -> None:
        self.idx = idx
        self.id: NodeId = f"n{idx:05d}"
        self.shares = spec.shares
        self.cores = float(spec.cores)
        self.slots = int(spec.slots)
        self.speed = float(spec.speed)
        self.ledger = ShareLedger(spec.shares)
        self.gpus = GpuAllocator(())  # no devices: tasks here request no GPU
        self.queue: deque[SimTask] = deque()
        self.running: list[SimTask] = []
        self.vt = 0.0  # work done by each running task since the epoch (virtual time)
        self.vt_at = 0.0
        self.hold_until = 0.0  # the CPU runs protocol overhead (probes) until then
        self.rate = 0.0  # per-task progress rate now
        self.ver = 0  # bumps on every reschedule; stale completion events are dropped
        self.rep: LoadReport | None = None
        self.repv = 0
        self.touched = False
        self.tp: TransferPolicy | None = None
        self.lb: LateBinding | None = None
        self.held: dict[TaskId, SimTask] = {}  # late binding: tasks held here, not queued
        self.bucket: mig.TokenBucket | None = None
        self.mig_here = 0  # migrations in flight from or to this node
        self.area = 0.0  # integral of weight_sum over time (statistics)
        self.res_area = 0.0  # integral of reserved shares over time
        self.area_at = 0.0
        self.busy = 0.0  # integral of the busy fraction of its cores

    def report(self) -> LoadReport:
        """This node's fresh LoadReport (rebuilt only after a change)."""
        r = self.rep
        if r is None:
            led = self.ledger
            k = len(self.running)
            self.repv += 1
            per_core = k / self.cores
            r = LoadReport(
                self.id,
                self.repv,
                shares=led.shares,
                reserved_shares=led.reserved,
                weight_sum=led.weight_sum,
                queued=led.queued,
                running=k,
                slots=self.slots,
                cpus=self.cores,
                cpu_util=per_core if per_core < 1.0 else 1.0,
                load_per_core=per_core,
            )
            self.rep = r
        return r


def any_peer(_node: NodeId, _entry: PeerInfo) -> str | None:
    return None


def _no_acc(_n: SimNode) -> None:
    """Stands in for Books._acc when per-node statistics are off."""


class Books:
    """The state of one run that every part reads, and the node books."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 7919 + 17)
        self.now = 0.0
        self.nodes = [SimNode(i, s) for i, s in enumerate(cfg.nodes)]
        self.by_id: dict[NodeId, SimNode] = {n.id: n for n in self.nodes}
        self.view = LoadView()
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self._jobs_left = True
        self._outstanding = 0
        self._queued = 0  # tasks waiting in node queues, cluster-wide
        self._placing = 0  # tasks arrived but not yet accepted by a node
        self.finished = bytearray()
        self.times = array("d")
        self._res_flags = array("b")
        self.events = 0
        self.placements = 0
        self.handoffs = 0  # placements handed to another node than the deciding one
        self.refusals = 0
        self.transfers = 0
        self.migrations = 0
        self.reserved_tasks = 0
        self.reserved_waited = 0
        self._mig_cluster = 0
        self._touched: list[SimNode] = []
        self._stat_t0 = 0.0
        self._measure_from = cfg.warmup
        if not cfg.node_stats:
            self._acc = _no_acc  # type: ignore[method-assign,assignment]
        self._fresh = isinstance(cfg.staleness, Fresh) or (
            isinstance(cfg.staleness, Board) and cfg.staleness.period <= 0
        )
        # Supermarket statistics: ge[i] = nodes with >= i tasks, area[i] its integral.
        self._levels = cfg.levels
        nl = cfg.max_levels + 2
        self._ge = [0] * nl
        self._ge[0] = len(self.nodes)
        self._ge_area = [0.0] * nl
        self._ge_at = [0.0] * nl

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _touch(self, n: SimNode) -> None:
        n.rep = None
        if self._fresh and not n.touched:
            n.touched = True
            self._touched.append(n)

    def _waited(self, t: SimTask) -> None:
        """A reserved task had to wait for shares: no node had room, its target refused
        it, or it was passed over at start with a slot free. Counted once per task."""
        if t.reserved and not t.waited:
            t.waited = True
            if t.arrival >= self._measure_from:
                self.reserved_waited += 1

    def _acc(self, n: SimNode) -> None:
        now = self.now
        dt = now - n.area_at
        if dt > 0:
            n.area += n.ledger.weight_sum * dt
            n.res_area += n.ledger.reserved * dt
        n.area_at = now

    def _level(self, n: SimNode, before: int, after: int) -> None:
        lvl = max(before, after)
        if lvl >= len(self._ge):
            return
        now = self.now
        self._ge_area[lvl] += self._ge[lvl] * (now - self._ge_at[lvl])
        self._ge_at[lvl] = now
        self._ge[lvl] += 1 if after > before else -1

    def _enqueue(
        self, n: SimNode, task: SimTask, *, front: bool = False, in_ledger: bool = False
    ) -> None:
        if not in_ledger:
            self._acc(n)
            n.ledger.add(task.spec)
            if self._levels:
                k = len(n.ledger)
                self._level(n, k - 1, k)
        task.node = n
        task.arrived_at = self.now
        task.qt = None
        self._queued += 1
        if front:
            n.queue.appendleft(task)
        else:
            n.queue.append(task)
        self._touch(n)
        self._try_start(n)

    def _unqueue(self, n: SimNode, task: SimTask) -> None:
        """Take a queued task off node n (it moves away)."""
        n.queue.remove(task)
        self._queued -= 1
        self._acc(n)
        n.ledger.remove(task.spec.id)
        if self._levels:
            k = len(n.ledger)
            self._level(n, k + 1, k)
        task.node = None
        self._touch(n)

    def _advance(self, n: SimNode) -> None:
        now = self.now
        # Tasks make no progress while the CPU is held by protocol overhead.
        dt = now - (n.vt_at if n.vt_at >= n.hold_until else n.hold_until)
        if dt > 0 and n.running:
            n.vt += dt * n.rate
            k = len(n.running)
            n.busy += dt * (k / n.cores if k < n.cores else 1.0)
        n.vt_at = now

    def _reschedule(self, n: SimNode) -> None:
        n.ver += 1
        running = n.running
        k = len(running)
        if k == 0:
            n.rate = 0.0
            return
        rate = n.speed if k <= n.cores else n.speed * n.cores / k
        n.rate = rate
        fmin = min(t.finish_vt for t in running)
        dt = (fmin - n.vt) / rate
        start = self.now if self.now >= n.hold_until else n.hold_until
        self._push(start + (dt if dt > 0 else 0.0), DONE, n, n.ver)

    def _try_start(self, n: SimNode, changed: bool = False) -> None:
        """Start queued tasks while slots are free: FIFO, but a task the agent's start
        gate holds back (its reservation does not fit the free shares now, the node is
        drained) is passed over (and counted as waiting). The gate takes the shares of
        a task it lets through."""
        queue = n.queue
        running = n.running
        led = n.ledger
        if queue and len(running) < n.slots:
            self._acc(n)  # a start may change the reserved shares
        nid = n.id
        gpus = n.gpus
        while queue and len(running) < n.slots:
            pick: SimTask | None = None
            for t in queue:
                why, _ = can_start(t.rec, nid, SETTLED, led, gpus, GPU_POLICY)
                if why is not None:
                    self._waited(t)
                    continue
                pick = t
                break
            if pick is None:
                break
            if queue[0] is pick:
                queue.popleft()
            else:
                queue.remove(pick)
            self._queued -= 1
            if not changed:
                self._advance(n)
                changed = True
            pick.finish_vt = n.vt + pick.work_left
            if not pick.started:
                pick.started = True
                pick.first_start = self.now
            running.append(pick)
        if changed:
            self._touch(n)
            self._reschedule(n)

    def _on_done(self, n: SimNode, ver: int) -> None:
        if ver != n.ver:
            return
        self._advance(n)
        vt = n.vt + 1e-9 * (1.0 + abs(n.vt))
        running = n.running
        done = [t for t in running if t.finish_vt <= vt]
        if not done:  # rounding: not quite there yet
            self._reschedule(n)
            return
        self._acc(n)
        led = n.ledger
        now = self.now
        for t in done:
            running.remove(t)
            led.remove(t.spec.id)
            if self._levels:
                k = len(led)
                self._level(n, k + 1, k)
            self._finish(t, now)
        self._touch(n)
        self._try_start(n, changed=True)
        if n.lb is not None:
            self._room(n)

    def _room(self, n: SimNode) -> None:
        """Room may have appeared on n (late binding's hook)."""

    def _late_hold(self, task: SimTask) -> bool:
        """Late binding's hook at placement: True if it took the task."""
        return False

    def _finish(self, t: SimTask, now: float) -> None:
        i = t.idx
        if self.finished[i]:
            raise SimError(f"task {t.spec.id} finished twice")
        self.finished[i] = 1
        self._outstanding -= 1
        t.node = None
        if t.arrival >= self._measure_from:
            self.times.append(now - t.arrival)
            self._res_flags.append(1 if t.reserved else 0)
