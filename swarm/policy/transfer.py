"""Adaptive load sharing of queued tasks: sender-, receiver-initiated or both, by load.

After Eager, Lazowska and Zahorjan (1986): sender-initiated transfer (an overloaded
node probes random peers and pushes to the first receiver) works best at low to
moderate load, because receivers are plentiful and probes succeed; at high load its
probes mostly fail and add traffic exactly when nodes are busy, and receiver-initiated
transfer (an idle node probes and steals) works better. Each node estimates the
cluster's load level from gossip and picks the mode (both in between), with
hysteresis on both its own role and the level so that it does not flap.

Only queued tasks move here (running ones are migration's business). A probe is
answered from the target's fresh state; probes per round are bounded by `probe_limit`.
Ping-pong guards: a task that just arrived is not moved again for `task_cooldown`; a
node that just gave work does not take any (and vice versa) for `switch_cooldown`;
one probe round at a time, at most one per `round_interval`.

`TransferPolicy` is a per-node state machine with no I/O: the agent (or simulator)
feeds it time, its fresh report, its queue and the view, and carries out the
returned actions.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from swarm import codec, wire
from swarm.model import DEFAULT_PRIORITY, MAX_PRIORITY, LoadReport, NodeId, TaskId, TaskSpec

from .load import UNIT, report_load
from .placement import Needs, needs_projected, refusal
from .view import PeerInfo, Verdict, indexed_keys, sample_peers

PUSH = "push"
PULL = "pull"
KINDS = (PUSH, PULL)


class Role(enum.Enum):
    SENDER = "sender"
    RECEIVER = "receiver"
    NEUTRAL = "neutral"


class Regime(enum.Enum):
    """Cluster load level, and which side initiates transfers there."""

    LOW = "low"  # sender-initiated
    MID = "mid"  # symmetric
    HIGH = "high"  # receiver-initiated


@attrs.frozen
class TransferConfig:
    """Thresholds are load-index values; `UNIT` is one weight-1 task per 1024 shares.

    Role thresholds are absolute floors, raised relative to the cluster mean M by
    `rel_gap` (sender at >= max(send_enter, M*(1+rel_gap)), receiver below
    max(recv_enter, M*(1-rel_gap)); exits at half the gap), so that a busy cluster
    still balances. Needs recv_enter <= recv_exit <= send_exit <= send_enter.
    """

    probe_limit: int = 3  # Lp
    recv_enter: float = 0.5 * UNIT
    recv_exit: float = 1.0 * UNIT
    send_exit: float = 1.5 * UNIT
    send_enter: float = 2.0 * UNIT
    rel_gap: float = 0.25
    wm_low: float = 0.6 * UNIT  # cluster mean below: sender-initiated only
    wm_high: float = 0.9 * UNIT  # above: receiver-initiated only
    wm_band: float = 0.05 * UNIT  # hysteresis around each watermark
    round_interval: float = 1.0  # seconds between the end of a round and the next
    probe_timeout: float = 0.5  # a round without a yes ends after this
    task_cooldown: float = 30.0  # a task that arrived is not moved again before this
    switch_cooldown: float = 10.0  # after giving, no taking (and vice versa)
    accept_hold: float = 1.0  # after saying yes to a push, refuse further pushes this long
    max_age: float | None = None  # peers with older reports are not probed
    sample_size: int = 64  # peers read for the cluster load estimate
    scan_below: int = 64  # views up to this size are filtered fully when probing

    def __attrs_post_init__(self) -> None:
        if not (self.recv_enter <= self.recv_exit <= self.send_exit <= self.send_enter):
            raise ValueError("transfer: need recv_enter <= recv_exit <= send_exit <= send_enter")
        if not (self.wm_band >= 0 and self.wm_low + self.wm_band <= self.wm_high - self.wm_band):
            raise ValueError("transfer: need wm_low + wm_band <= wm_high - wm_band")
        if self.probe_limit < 1 or self.sample_size < 1:
            raise ValueError("transfer: probe_limit and sample_size must be >= 1")
        if not 0 <= self.rel_gap < 1:
            raise ValueError("transfer: rel_gap must be in [0, 1)")


@attrs.frozen
class Thresholds:
    recv_enter: float
    recv_exit: float
    send_exit: float
    send_enter: float


def thresholds(cfg: TransferConfig, mean: float) -> Thresholds:
    g = cfg.rel_gap
    return Thresholds(
        recv_enter=max(cfg.recv_enter, mean * (1 - g)),
        recv_exit=max(cfg.recv_exit, mean * (1 - g / 2)),
        send_exit=max(cfg.send_exit, mean * (1 + g / 2)),
        send_enter=max(cfg.send_enter, mean * (1 + g)),
    )


def classify(prev: Role, load: float, mean: float, has_movable: bool, cfg: TransferConfig) -> Role:
    """A node's role with hysteresis. A sender needs a movable queued task; a node with
    infinite load (drained, or every share reserved) is a sender when it has one and
    never a receiver."""
    if math.isinf(load):
        return Role.SENDER if has_movable else Role.NEUTRAL
    t = thresholds(cfg, mean)
    if prev is Role.SENDER and has_movable and load >= t.send_exit:
        return Role.SENDER
    if prev is Role.RECEIVER and load < t.recv_exit:
        return Role.RECEIVER
    if has_movable and load >= t.send_enter:
        return Role.SENDER
    if load < t.recv_enter:
        return Role.RECEIVER
    return Role.NEUTRAL


def regime_of(prev: Regime | None, mean: float, cfg: TransferConfig) -> Regime:
    """Cluster load level with hysteresis: a watermark is crossed only by `wm_band`."""
    lo, hi, b = cfg.wm_low, cfg.wm_high, cfg.wm_band
    if prev is None:
        return Regime.LOW if mean < lo else Regime.HIGH if mean > hi else Regime.MID
    if mean > hi + b:
        return Regime.HIGH
    if mean < lo - b:
        return Regime.LOW
    if prev is Regime.LOW:
        return Regime.MID if mean > lo + b else Regime.LOW
    if prev is Regime.HIGH:
        return Regime.MID if mean < hi - b else Regime.HIGH
    return Regime.MID


@attrs.frozen
class ClusterLoad:
    mean: float  # mean finite load index over the nodes read
    nodes: int  # how many nodes (local included) the mean is over
    infinite: int  # nodes read with infinite load (drained or full), not in the mean


def cluster_load(
    local: LoadReport, view: Mapping[NodeId, PeerInfo], rng: random.Random, sample_size: int = 64
) -> ClusterLoad:
    """Mean load index over alive nodes: all of them when the view has at most
    `sample_size` peers, else `sample_size` peers drawn uniformly (with replacement:
    unbiased for the mean and O(sample_size)). Nodes with infinite load are counted
    apart: they take no work, and one of them would make the mean infinite."""
    total = 0.0
    count = 0
    inf = 0
    own = report_load(local)
    if math.isinf(own):
        inf += 1
    else:
        total, count = own, 1
    n = len(view)
    if n <= sample_size:
        reports = [e.report for k, e in view.items() if k != local.node]
    else:
        key_at = indexed_keys(view)
        # One rng.choices call draws every index (uniform, with replacement, as
        # sample_size randrange calls would) at a fraction of the cost: this runs on
        # every node every round, 10,000 times per round in the simulator.
        reports = [view[key_at(i)].report for i in rng.choices(range(n), k=sample_size)]
        reports = [r for r in reports if r.node != local.node]
    for r in reports:
        x = report_load(r)
        if math.isinf(x):
            inf += 1
        else:
            total += x
            count += 1
    return ClusterLoad(total / count if count else 0.0, count, inf)


# ---------------------------------------------------------------------- queue


@attrs.frozen
class QueuedTask:
    """A task queued (not started) on this node, as the transfer policy sees it."""

    id: TaskId
    needs: Needs
    queued_at: float  # when it entered the system: "oldest" means smallest
    arrived_at: float  # when it arrived on this node: the move cooldown starts here
    pinned: bool = False  # may not leave this node
    # its place in the node's start order by class and fair share (issue 20): lower
    # goes first, so stealing and pushing give away urgent work and the work of the
    # users most below their share first; (0, 0) for all: oldest first
    rank: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, spec: TaskSpec, arrived_at: float, *, pinned: bool = False) -> QueuedTask:
        return cls(spec.id, Needs.of(spec), spec.submitted_at, arrived_at, pinned)

    def movable(self, now: float, cooldown: float) -> bool:
        return not self.pinned and not self.needs.is_global and now - self.arrived_at >= cooldown


def movable_tasks(queue: Sequence[QueuedTask], now: float, cooldown: float) -> list[QueuedTask]:
    """Movable queued tasks, by rank (class, then fair share), then oldest first
    (queued_at, then id for determinism)."""
    out = [t for t in queue if t.movable(now, cooldown)]
    out.sort(key=lambda t: (t.rank, t.queued_at, t.id))
    return out


def load_without(r: LoadReport, needs: Needs) -> float:
    """The giver's load after a queued task leaves (queued tasks hold no reservation)."""
    capacity = r.shares - r.reserved_shares
    if capacity <= 0:
        return math.inf
    return max(r.weight_sum - needs.weight, 0.0) / capacity


def gains(giver: LoadReport, taker: LoadReport, needs: Needs) -> bool:
    """Moving the task does not invert the imbalance: the taker ends no higher than
    the giver is left (so the same task has no reason to come back)."""
    return needs_projected(taker, needs) <= load_without(giver, needs)


# ------------------------------------------------------------------- messages


@attrs.frozen
class ProbeRequest:
    """Push: "will you take this task?"; pull: "do you have a task for me?".

    Carries the prober's fresh report so the target can check fit and gain itself.
    """

    round: int
    kind: str  # "push" | "pull"
    report: LoadReport  # the prober's, fresh
    task_id: TaskId = ""  # push: the task offered
    needs: Needs | None = None  # push: what it needs

    @property
    def origin(self) -> NodeId:
        return self.report.node


@attrs.frozen
class ProbeReply:
    round: int
    kind: str
    peer: NodeId  # who answers
    ok: bool
    reason: str = ""
    load: float = 0.0  # the answerer's fresh load index


@attrs.frozen
class ProbeFor:
    """Send `request` to `peer` and feed its reply to `on_probe_reply`."""

    peer: NodeId
    request: ProbeRequest

    @property
    def kind(self) -> str:
        return self.request.kind


@attrs.frozen
class PushTask:
    """Hand the queued task `task_id` over to `peer` (via the handoff protocol)."""

    peer: NodeId
    task_id: TaskId


@attrs.frozen
class StealFrom:
    """Ask `peer` for a task; it answers with `on_steal(request)` and hands it over."""

    peer: NodeId
    request: ProbeRequest


Action = ProbeFor | PushTask | StealFrom


@attrs.define
class _Round:
    id: int
    kind: str
    deadline: float
    pending: set[NodeId]
    task_id: TaskId = ""


@attrs.frozen
class TransferStats:
    rounds: int = 0
    probes: int = 0
    pushes: int = 0
    steals: int = 0
    refused_probes: int = 0
    timeouts: int = 0


class TransferPolicy:
    """One node's transfer state machine (no I/O; deterministic given the rng)."""

    def __init__(self, node: NodeId, cfg: TransferConfig | None = None) -> None:
        self.node = node
        self.cfg = cfg or TransferConfig()
        self.role = Role.NEUTRAL
        self.regime: Regime | None = None
        self.cluster = ClusterLoad(0.0, 0, 0)
        self.stats = TransferStats()
        self._round: _Round | None = None
        self._seq = 0
        self._next_round_at = -math.inf
        self._last_gave = -math.inf
        self._last_took = -math.inf
        self._accepting_until = -math.inf
        self._offer = 0  # which movable task the next push round offers (rotates on failure)

    # ------------------------------------------------------------ inspection

    @property
    def in_round(self) -> str | None:
        """The kind of the probe round in flight, or None."""
        return None if self._round is None else self._round.kind

    def _count(self, **inc: int) -> None:
        s = self.stats
        self.stats = attrs.evolve(s, **{k: getattr(s, k) + v for k, v in inc.items()})

    # ------------------------------------------------------------------ step

    def step(
        self,
        now: float,
        local: LoadReport,
        queue: Sequence[QueuedTask],
        view: Mapping[NodeId, PeerInfo],
        rng: random.Random,
    ) -> list[Action]:
        """Periodic tick: refresh the level and role, time out a round, maybe probe."""
        cfg = self.cfg
        self.cluster = cluster_load(local, view, rng, cfg.sample_size)
        self.regime = regime_of(self.regime, self.cluster.mean, cfg)
        movable = movable_tasks(queue, now, cfg.task_cooldown)
        load = report_load(local)
        self.role = classify(self.role, load, self.cluster.mean, bool(movable), cfg)

        if self._round is not None:
            if now < self._round.deadline:
                return []
            self._count(timeouts=1)
            self._round_failed(self._round.kind)
            self._end_round(now)
        if now < self._next_round_at:
            return []

        if (
            self.role is Role.SENDER
            and (self.regime is not Regime.HIGH or math.isinf(load))
            and now - self._last_took >= cfg.switch_cooldown
        ):
            task = movable[self._offer % len(movable)]
            return self._start_push(now, local, task, view, rng)
        if (
            self.role is Role.RECEIVER
            and self.regime is not Regime.LOW
            and now - self._last_gave >= cfg.switch_cooldown
        ):
            return self._start_pull(now, local, load, view, rng)
        return []

    def _fresh_enough(self, now: float, entry: PeerInfo) -> bool:
        return self.cfg.max_age is None or now - entry.received_at <= self.cfg.max_age

    def _start_push(
        self,
        now: float,
        local: LoadReport,
        task: QueuedTask,
        view: Mapping[NodeId, PeerInfo],
        rng: random.Random,
    ) -> list[Action]:
        needs = task.needs

        def verdict(node: NodeId, entry: PeerInfo) -> str | None:
            # The stale report is only a hint to skip hopeless probes; the target decides.
            if not self._fresh_enough(now, entry):
                return "stale"
            why = refusal(entry.report, needs)
            if why is not None:
                return why.text
            if not gains(local, entry.report, needs):
                return "no gain"
            return None

        return self._probe(now, PUSH, local, view, rng, verdict, task.id, needs)

    def _start_pull(
        self,
        now: float,
        local: LoadReport,
        load: float,
        view: Mapping[NodeId, PeerInfo],
        rng: random.Random,
    ) -> list[Action]:
        def verdict(node: NodeId, entry: PeerInfo) -> str | None:
            if not self._fresh_enough(now, entry):
                return "stale"
            if entry.report.queued <= 0:
                return "nothing queued"
            if report_load(entry.report) <= load:
                return "not heavier"
            return None

        return self._probe(now, PULL, local, view, rng, verdict, "", None)

    def _probe(
        self,
        now: float,
        kind: str,
        local: LoadReport,
        view: Mapping[NodeId, PeerInfo],
        rng: random.Random,
        verdict: Verdict,
        task_id: TaskId,
        needs: Needs | None,
    ) -> list[Action]:
        cfg = self.cfg
        sample = sample_peers(
            view, cfg.probe_limit, rng, verdict, skip=self.node, scan_below=cfg.scan_below
        )
        if not sample.chosen:
            self._round_failed(kind)
            self._next_round_at = now + cfg.round_interval
            return []
        self._seq += 1
        self._round = _Round(self._seq, kind, now + cfg.probe_timeout, set(sample.chosen), task_id)
        req = ProbeRequest(self._seq, kind, local, task_id, needs)
        self._count(rounds=1, probes=len(sample.chosen))
        return [ProbeFor(peer, req) for peer in sample.chosen]

    def _round_failed(self, kind: str) -> None:
        # Offer another task next time: the oldest may fit nowhere (head-of-line).
        if kind == PUSH:
            self._offer += 1

    def _end_round(self, now: float) -> None:
        self._round = None
        self._next_round_at = now + self.cfg.round_interval

    # --------------------------------------------------------- replies to us

    def on_probe_reply(
        self, now: float, reply: ProbeReply, local: LoadReport, queue: Sequence[QueuedTask]
    ) -> list[Action]:
        """A target answered. The first yes of the round moves one task; late, duplicate
        or foreign replies are ignored."""
        r = self._round
        if r is None or reply.round != r.id or reply.kind != r.kind or reply.peer not in r.pending:
            return []
        r.pending.discard(reply.peer)
        if not reply.ok:
            if not r.pending:
                self._round_failed(r.kind)
                self._end_round(now)
            return []
        self._end_round(now)
        if r.kind == PUSH:
            still = any(t.id == r.task_id and t.movable(now, self.cfg.task_cooldown) for t in queue)
            if not still:
                return []
            self._last_gave = now
            self._offer = 0
            self._count(pushes=1)
            return [PushTask(reply.peer, r.task_id)]
        self._last_took = now
        self._count(steals=1)
        self._seq += 1
        return [StealFrom(reply.peer, ProbeRequest(self._seq, PULL, local))]

    # ------------------------------------------------------ requests from peers

    def on_probe(
        self, now: float, request: ProbeRequest, local: LoadReport, queue: Sequence[QueuedTask]
    ) -> ProbeReply:
        """Answer a peer's probe from this node's fresh state."""
        load = report_load(local)

        def no(reason: str) -> ProbeReply:
            self._count(refused_probes=1)
            return ProbeReply(request.round, request.kind, self.node, False, reason, load)

        if request.origin == self.node:
            return no("that is me")
        if request.kind == PUSH:
            why = self._refuse_push(now, request, local, load)
            if why is not None:
                return no(why)
            self._accepting_until = now + self.cfg.accept_hold
            self._last_took = now
            return ProbeReply(request.round, PUSH, self.node, True, "receiver", load)
        if request.kind == PULL:
            why = self._refuse_give(now, load, queue)
            if why is not None:
                return no(why)
            if self.choose_for_steal(now, request.report, local, queue) is None:
                return no("nothing that fits you")
            return ProbeReply(request.round, PULL, self.node, True, "sender", load)
        return no(f"unknown probe kind {request.kind!r:.20}")

    def _refuse_push(
        self, now: float, request: ProbeRequest, local: LoadReport, load: float
    ) -> str | None:
        needs = request.needs
        if needs is None:
            return "push probe without a task"
        if self._round is not None and self._round.kind == PUSH:
            return "pushing myself"
        if now - self._last_gave < self.cfg.switch_cooldown:
            return "gave work away recently"
        if now < self._accepting_until:
            return "just accepted another push"
        why = refusal(local, needs)
        if why is not None:
            return why.text
        if math.isinf(load_without(request.report, needs)):
            return None  # the giver cannot run it at all (drained or full): any fit helps
        t = thresholds(self.cfg, self.cluster.mean)
        if load >= t.recv_exit:
            return f"not a receiver (load {load:.6g} >= {t.recv_exit:.6g})"
        projected = needs_projected(local, needs)
        if projected >= t.send_enter:
            return f"would become a sender (projected {projected:.6g})"
        if not gains(request.report, local, needs):
            return "no gain"
        return None

    def _refuse_give(self, now: float, load: float, queue: Sequence[QueuedTask]) -> str | None:
        if self._round is not None and self._round.kind == PULL:
            return "pulling myself"
        if now - self._last_took < self.cfg.switch_cooldown:
            return "took work recently"
        cooldown = self.cfg.task_cooldown
        if not any(t.movable(now, cooldown) for t in queue):  # not sorted just to ask
            return "no movable queued task"
        if not math.isinf(load) and load < thresholds(self.cfg, self.cluster.mean).send_exit:
            return f"not a sender (load {load:.6g})"
        return None

    def choose_for_steal(
        self, now: float, thief: LoadReport, local: LoadReport, queue: Sequence[QueuedTask]
    ) -> QueuedTask | None:
        """The oldest movable queued task (not pinned, not global, not just arrived) that
        the thief's report says it can take and whose move does not invert the
        imbalance; None if there is none. A task offered in this node's own push round
        in flight is not given twice."""
        offered = self._round.task_id if self._round is not None else ""
        for t in movable_tasks(queue, now, self.cfg.task_cooldown):
            if t.id == offered:
                continue
            if refusal(thief, t.needs) is None and gains(local, thief, t.needs):
                return t
        return None

    def on_steal(
        self, now: float, request: ProbeRequest, local: LoadReport, queue: Sequence[QueuedTask]
    ) -> TaskId | None:
        """A thief that got our yes asks for the task: re-check on fresh state and name
        the task to hand over (None: nothing to give any more)."""
        if request.origin == self.node or request.kind != PULL:
            return None
        if self._refuse_give(now, report_load(local), queue) is not None:
            return None
        t = self.choose_for_steal(now, request.report, local, queue)
        if t is None:
            return None
        self._last_gave = now
        return t.id


# ------------------------------------------------------------------- wire


def needs_to_wire(n: Needs) -> dict[str, Any]:
    return {
        "weight": n.weight,
        "reserve_shares": n.reserve_shares,
        "is_global": n.is_global,
        "cpu": n.cpu,
        "mem": n.mem,
        "gpu": None if n.gpu is None else codec.gpu_request_to_wire(n.gpu),
        "priority": n.priority,
    }


def needs_from_wire(obj: Any) -> Needs:
    f = wire.Fields(obj, "needs")
    n = Needs(
        weight=f.float("weight", 1.0, lo=0.0, hi=1e6),
        reserve_shares=f.int("reserve_shares", 0, lo=0, hi=1 << 31),
        is_global=f.bool("is_global", False),
        cpu=f.float("cpu", lo=0.0, hi=1e6),
        mem=f.int("mem", lo=0),
        gpu=f.nested("gpu", codec.gpu_request_from_wire),
        priority=f.int("priority", DEFAULT_PRIORITY, lo=-MAX_PRIORITY, hi=MAX_PRIORITY),
    )
    f.done()
    return n


def probe_request_to_wire(p: ProbeRequest) -> dict[str, Any]:
    return {
        "v": wire.PROTOCOL_VERSION,
        "round": p.round,
        "kind": p.kind,
        "report": codec.load_report_to_wire(p.report),
        "task_id": p.task_id,
        "needs": None if p.needs is None else needs_to_wire(p.needs),
    }


def probe_request_from_wire(obj: Any) -> ProbeRequest:
    """Strict decode; raises only wire.WireError subclasses."""
    wire.check_version(obj, "probe")
    f = wire.Fields(obj, "probe", ignore=("v",))
    kind = f.str("kind", required=True, max_len=8)
    if kind not in KINDS:
        raise wire.SchemaError(f"probe: kind must be push or pull, got {kind!r:.20}")
    p = ProbeRequest(
        round=f.int("round", required=True, lo=0, hi=(1 << 63) - 1),
        kind=kind,
        report=wire.decode_with(codec.load_report_from_wire, f.map("report", required=True)),
        task_id=f.task_id("task_id", ""),  # a task id, never a path (issue 17)
        needs=f.nested("needs", lambda o: wire.decode_with(needs_from_wire, o)),
    )
    f.done()
    if kind == PUSH and (p.needs is None or not p.task_id):
        raise wire.SchemaError("probe: a push probe needs task_id and needs")
    return p


def probe_reply_to_wire(r: ProbeReply) -> dict[str, Any]:
    return {
        "v": wire.PROTOCOL_VERSION,
        "round": r.round,
        "kind": r.kind,
        "peer": r.peer,
        "ok": r.ok,
        "reason": r.reason,
        "load": None if math.isinf(r.load) else r.load,
    }


def probe_reply_from_wire(obj: Any) -> ProbeReply:
    """Strict decode; an absent load means infinite (drained or full)."""
    wire.check_version(obj, "probe reply")
    f = wire.Fields(obj, "probe reply", ignore=("v",))
    kind = f.str("kind", required=True, max_len=8)
    if kind not in KINDS:
        raise wire.SchemaError(f"probe reply: kind must be push or pull, got {kind!r:.20}")
    r = ProbeReply(
        round=f.int("round", required=True, lo=0, hi=(1 << 63) - 1),
        kind=kind,
        peer=f.str("peer", required=True, max_len=256),
        ok=f.bool("ok", required=True),
        reason=f.str("reason", "", max_len=1024),
        load=f.float("load", math.inf, lo=0.0),
    )
    f.done()
    return r
