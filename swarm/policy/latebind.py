"""Late binding (Sparrow, Ousterhout et al. 2013): a task waits for the first free
node among a few, instead of being committed to one node's queue on stale load.

A task that finds no room at its home (every slot busy, or every core) is *held* there
and reservations for it go to `d` peers sampled from the view. A node with room pulls
the task behind its oldest reservation; the home gives it to the first puller (one
handoff, the usual protocol) and cancels the other reservations. The home's own room
counts too: when a slot frees there, its oldest held task starts at home. A task that
nobody pulls within `hold` is released to the home's run queue, so nothing waits on
a reservation forever.

Why: with heavy-tailed service, two choices on gossip a second old put a task behind
a long one at a node that looked light; an omniscient join-shortest-queue never does.
Late binding learns which node is free from the node itself, at the moment it is
free, for d reservations, one pull and its answer, and d - 1 cancels per held task
(tasks placed at a home with room cost no messages at all). `swarm sim load`
measures both its response time and its messages against the other policies.

`LateBinding` is one node's two sides (the holder of its own held tasks and the
keeper of other homes' reservations), pure: time, reports, the view and an rng in,
messages out. The simulator and the agent carry them.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import attrs

from swarm import wire
from swarm.model import LoadReport, NodeId, TaskId

from .load import report_load
from .placement import Needs, refusal
from .view import PeerInfo, sample_peers


@attrs.frozen
class LateConfig:
    """`d` reservations per held task; `hold` how long a task may wait for a puller."""

    d: int = 4
    sample: int = 4  # peers read from the view; the d least loaded of them are reserved
    # > 0: of the d, those whose report says they have room are reserved first, the
    # others only if the task is still held `stage` later (time for a pull to come)
    stage: float = 0.0
    hold: float = 3.0
    pull_timeout: float = 1.0  # a granted pull whose task has not arrived by then is over
    max_held: int = 4096  # held tasks per home; past it a task is placed as usual
    max_reservations: int = 4096  # kept per node; the oldest go first

    def __attrs_post_init__(self) -> None:
        if self.d < 1:
            raise ValueError("late binding: d must be >= 1")
        if not self.hold > 0 or not self.pull_timeout > 0:
            raise ValueError("late binding: hold and pull_timeout must be > 0")
        if self.max_held < 1 or self.max_reservations < 1:
            raise ValueError("late binding: max_held and max_reservations must be >= 1")


def has_room(r: LoadReport) -> bool:
    """A task handed to this node now starts at once on a core of its own: a slot is
    free, nothing waits for it, and (when the node reports its CPUs) a core is idle."""
    if r.queued > 0 or r.running >= r.slots:
        return False
    return r.cpus <= 0 or r.running + 1 <= r.cpus


# ------------------------------------------------------------------ messages


@attrs.frozen
class Reserve:
    """Holder -> peer: pull `task_id` from me when you have room."""

    peer: NodeId
    task_id: TaskId


@attrs.frozen
class Cancel:
    """Holder -> peer: the reservation for `task_id` is void (taken, started, released)."""

    peer: NodeId
    task_id: TaskId


@attrs.frozen
class Pull:
    """Peer -> holder: I have room; give me `task_id`. The holder answers with
    `on_pull`'s verdict and, when it gives, hands the task over."""

    holder: NodeId
    task_id: TaskId


@attrs.frozen
class Give:
    """Holder: hand the held task `task_id` to `peer` (the handoff protocol)."""

    peer: NodeId
    task_id: TaskId


@attrs.frozen
class StartHere:
    """Holder: the held task `task_id` goes to the local run queue (room here, or its
    hold ran out)."""

    task_id: TaskId


Action = Reserve | Cancel | Pull | Give | StartHere


@attrs.frozen
class LateStats:
    held: int = 0  # tasks held with reservations out
    given: int = 0  # pulled by a peer
    started_here: int = 0  # started at home because the home had room first
    released: int = 0  # hold ran out: queued at home
    reserves: int = 0
    cancels: int = 0
    pulls: int = 0
    pulls_refused: int = 0  # a pull for a task already gone (answered, counted at the holder)

    @property
    def messages(self) -> int:
        """Messages sent for late binding: reservations, cancels, pulls and answers."""
        return self.reserves + self.cancels + 2 * self.pulls


@attrs.define
class _Held:
    deadline: float
    peers: tuple[NodeId, ...]  # reserved
    later: tuple[NodeId, ...] = ()  # to reserve at the second wave, if still held


@attrs.define
class _Pulling:
    holder: NodeId
    task_id: TaskId
    until: float  # granted: waiting for the task until then; asked: the answer's timeout
    granted: bool = False


class LateBinding:
    """One node's late binding state (no I/O; deterministic given the rng)."""

    def __init__(self, node: NodeId, cfg: LateConfig | None = None) -> None:
        self.node = node
        self.cfg = cfg or LateConfig()
        self.stats = LateStats()
        self._held: OrderedDict[TaskId, _Held] = OrderedDict()  # oldest first
        self._waves: OrderedDict[TaskId, float] = OrderedDict()  # second waves due
        self._resv: OrderedDict[tuple[NodeId, TaskId], float] = OrderedDict()  # -> expiry
        self._pulling: _Pulling | None = None

    def _count(self, **inc: int) -> None:
        s = self.stats
        self.stats = attrs.evolve(s, **{k: getattr(s, k) + v for k, v in inc.items()})

    # ------------------------------------------------------------ inspection

    @property
    def held(self) -> tuple[TaskId, ...]:
        return tuple(self._held)

    def is_held(self, task_id: TaskId) -> bool:
        return task_id in self._held

    @property
    def reservations(self) -> int:
        return len(self._resv)

    def next_wave(self) -> float | None:
        """When the oldest pending second wave is due (None: none pending)."""
        return next(iter(self._waves.values()), None)

    def next_deadline(self) -> float | None:
        """When `expire` next has something to do (a second wave, a hold's end)."""
        times = [h.deadline for h in self._held.values()][:1]
        wave = self.next_wave()
        return min([*times, wave]) if wave is not None else (times[0] if times else None)

    # ------------------------------------------------------------ holder side

    def hold(
        self,
        now: float,
        task_id: TaskId,
        needs: Needs,
        local: LoadReport,
        view: Mapping[NodeId, PeerInfo],
        rng: random.Random,
    ) -> list[Action]:
        """A task arrives at its home. [] means: do not hold it (the home has room, the
        book is full, or no peer could take it); place it as usual. Otherwise the
        reservations to send; the task stays here until pulled or released."""
        if has_room(local) or task_id in self._held or len(self._held) >= self.cfg.max_held:
            return []

        def verdict(_node: NodeId, entry: PeerInfo) -> str | None:
            why = refusal(entry.report, needs)
            return None if why is None else why.text

        cfg = self.cfg
        peers = sample_peers(view, max(cfg.d, cfg.sample), rng, verdict, skip=self.node).chosen
        if len(peers) > cfg.d:
            peers = tuple(sorted(peers, key=lambda p: report_load(view[p].report))[: cfg.d])
        if not peers:
            return []
        first: tuple[NodeId, ...] = tuple(peers)
        later: tuple[NodeId, ...] = ()
        if cfg.stage > 0:
            free = tuple(p for p in peers if has_room(view[p].report))
            if free and len(free) < len(peers):
                first, later = free, tuple(p for p in peers if p not in free)
                self._waves[task_id] = now + cfg.stage
        self._held[task_id] = _Held(now + cfg.hold, first, later)
        self._count(held=1, reserves=len(first))
        return [Reserve(p, task_id) for p in first]

    def _drop(self, task_id: TaskId, keep: NodeId | None = None) -> list[Action]:
        h = self._held.pop(task_id)
        self._waves.pop(task_id, None)
        out: list[Action] = [Cancel(p, task_id) for p in h.peers if p != keep]
        self._count(cancels=len(out))
        return out

    def on_pull(self, now: float, pull_from: NodeId, task_id: TaskId) -> list[Action]:
        """A peer with room asks for a held task: give it to the first asker that holds
        a reservation for it; [] means "gone" (taken, started, released or never held)."""
        h = self._held.get(task_id)
        if h is None or pull_from not in h.peers:
            self._count(pulls_refused=1)
            return []
        self._count(given=1)
        return [Give(pull_from, task_id), *self._drop(task_id, keep=pull_from)]

    def room_here(self, now: float, local: LoadReport) -> list[Action]:
        """The home has room: its oldest held task starts here (before any peer's)."""
        if not self._held or not has_room(local):
            return []
        task_id = next(iter(self._held))
        self._count(started_here=1)
        return [StartHere(task_id), *self._drop(task_id)]

    def forget(self, task_id: TaskId) -> list[Action]:
        """The held task left by another way (cancelled by its submitter): cancels."""
        return self._drop(task_id) if task_id in self._held else []

    def expire(self, now: float) -> list[Action]:
        """Second waves that are due (the peers that did not look free are reserved
        too), and holds past their deadline (the tasks go to the home's run queue)."""
        out: list[Action] = []
        while self._waves:
            task_id, at = next(iter(self._waves.items()))
            if at > now:
                break
            del self._waves[task_id]
            h = self._held[task_id]
            out += [Reserve(p, task_id) for p in h.later]
            self._count(reserves=len(h.later))
            h.peers, h.later = h.peers + h.later, ()
        while self._held:
            task_id, h = next(iter(self._held.items()))
            if h.deadline > now:
                break
            self._count(released=1)
            out += [StartHere(task_id), *self._drop(task_id)]
        return out

    # ------------------------------------------------------------ reserver side

    def on_reserve(self, now: float, holder: NodeId, task_id: TaskId) -> None:
        if holder == self.node:
            return
        key = (holder, task_id)
        self._resv.pop(key, None)
        self._resv[key] = now + self.cfg.hold
        while len(self._resv) > self.cfg.max_reservations:
            self._resv.popitem(last=False)

    def on_cancel(self, holder: NodeId, task_id: TaskId) -> None:
        self._resv.pop((holder, task_id), None)

    def want_pull(self, now: float, local: LoadReport) -> Pull | None:
        """This node has room and no pull under way: ask for the task behind the oldest
        live reservation (at most one pull at a time, so room is never promised twice)."""
        p = self._pulling
        if p is not None:
            if now < p.until:
                return None
            self._pulling = None
        if not has_room(local):
            return None
        while self._resv:
            (holder, task_id), expiry = self._resv.popitem(last=False)
            if expiry >= now:
                self._pulling = _Pulling(holder, task_id, now + self.cfg.pull_timeout)
                self._count(pulls=1)
                return Pull(holder, task_id)
        return None

    def on_pull_answer(self, now: float, holder: NodeId, task_id: TaskId, granted: bool) -> None:
        """The holder answered. Given: wait for the task (until it arrives or
        `pull_timeout`); gone: free to pull the next one."""
        p = self._pulling
        if p is None or (p.holder, p.task_id) != (holder, task_id) or p.granted:
            return
        if granted:
            self._pulling = _Pulling(holder, task_id, now + self.cfg.pull_timeout, True)
        else:
            self._pulling = None

    def arrived(self, task_id: TaskId) -> None:
        """A task arrived here: if it is the one pulled, room may be asked for again."""
        p = self._pulling
        if p is not None and p.task_id == task_id:
            self._pulling = None


# ------------------------------------------------------------------- wire

RESERVE, CANCEL, PULL = "reserve", "cancel", "pull"
KINDS = (RESERVE, CANCEL, PULL)


def msg_to_wire(kind: str, task_id: TaskId) -> dict[str, Any]:
    return {"v": wire.PROTOCOL_VERSION, "kind": kind, "task_id": task_id}


def msg_from_wire(obj: Any) -> tuple[str, TaskId]:
    """Strict decode of a `late` request: (kind, task id); raises wire.WireError only.
    Who sent it is the authenticated peer, never a field."""
    wire.check_version(obj, "late")
    f = wire.Fields(obj, "late", ignore=("v",))
    kind = f.str("kind", required=True, max_len=8)
    if kind not in KINDS:
        raise wire.SchemaError(f"late: kind must be reserve, cancel or pull, got {kind!r:.20}")
    task_id = f.task_id("task_id", required=True)  # a task id, never a path
    f.done()
    return kind, task_id
