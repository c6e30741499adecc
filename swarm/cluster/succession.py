"""Who takes over a task when its home is gone for good (pure): replicas and succession.

Today a task has one authority, its home (the node it was submitted to; docs/handoff.md).
If the home dies for good its tasks are stranded. This module names, for every task,
the nodes that can take the home's role over, and decides when one of them does.

* **Replicas.** A queued task's record is journaled on the home and on `k` more nodes,
  its replicas: the first `k` of the rendezvous order of the task id over the live
  members, the home left out (`replica_of`, the hashing of actor.py). Every node that
  sees the same live set names the same replicas with no message exchanged, and a
  member that joins or leaves changes them only if it ranks among the first `k`.
  `replicas_wanted` is the number of copies (the home's included): the configured
  value, clamped to [1, cluster size] (and 16), else 2 on clusters of 3 or more and 1 below
  (`replicas = 1` is today's behaviour). The chosen replicas are part of the task's
  record; they are not recomputed when membership changes.
* **Successor.** A task's record names its home, its authority `epoch`, its runner (the
  node it was committed to, running it or queued there; None while it is at its home)
  and its replicas, in order. When the home has been SWIM `dead` (or `left`) for at
  least `grace` seconds on this node's clock, and this node is not itself declared
  dead: the runner adopts the task; a replica adopts it only once the home has been
  gone for two graces (REPLICA_WAIT: a home may place a task a moment before it dies,
  before its replica hears of the runner; the runner's claim, made after one grace,
  reaches the replica first), and only if there is no runner (or the runner is the
  home) or the runner too has been gone for `grace`, and every replica before it in
  the record has been gone for `grace`. A node never adopts while
  the home is merely `suspect`: a suspicion is refuted within a probe round or becomes
  a death, and the grace keeps a death that is refuted late (a pause, a short
  partition) from moving the authority. A member this node has never heard of is not
  gone: we wait rather than guess.
* **Epochs and claims.** An adoption's epoch is the largest epoch this node knows for
  the task plus one, so strictly greater than the home's; the caller journals it
  before acting. Two claimants compare by (epoch, node): the larger one is the
  authority (`claim_key`). With one view of membership and every notice delivered, at
  most one node adopts a task per epoch: the runner, or the first replica not gone,
  is the same node on every node.
* **Notices.** An adopter tells every member of its view (`Notice`, out of `step`) of
  the new record, and tells a member again each time it comes back (alive after gone
  in our view, or a new view after `restarted`): a home that returns learns of the
  adoption that way. The receiver's `on_adoption_notice` keeps the larger claim and
  says what to do: an old authority that does not run the task DROPs it (never places
  or runs it again; forwards `status`, `cancel` to the new home); a node that runs the
  task but is not the runner of the new record FORWARDs (reports its attempt to the new
  home and obeys its answer, as handoff's rule 4); a notice smaller than ours is STALE
  (answer it with `notice_for`, so the lower claimant yields). A node named as runner
  or replica in a notice starts holding the record; any other node remembers the
  claim (a bounded, unjournaled table), so that a smaller claim that reaches it later
  by another path (two adopters of one epoch in split views, notices reordered) is
  answered STALE instead of followed. Claims reach every member, and a
  STALE answer carries the larger claim back, so once views converge at most one
  authority per task remains, and every live runner or replica of it holds its record;
  none remains only if no live node is a successor in the record it holds (with one
  replica, never after the loss of a single node).
* **New replicas.** The authority keeps as many replicas as the task had when it took
  it (the home: as many as it was given). When one has been gone for a grace, or an
  adopter saw fewer live members than that, it names live members in their place as
  soon as it sees some (`Rereplicate`: same claim, its `version` + 1, re-told to every
  member). So a task survives the loss of its home and then of its adopter, or a
  replica's loss and then its home's, when the two are a grace and a gossip round
  apart; a second loss inside that window can lose it (with one replica). A home in
  doubt does not re-replicate: it may no longer be the authority.
* **Doubt.** A home that learns it was declared dead, or restarts, is `in_doubt` about
  its tasks for one grace unless a notice comes first: an adopter that can reach it
  tells it as soon as it sees it alive again, well within a grace. A home in doubt
  does not re-replicate. Placement waits on a doubt of its own, node/doubt.py: a home
  that restarted after an absence of a grace or more (how long, by its journal's
  heartbeat) places none of these tasks for max(grace, 10 s); one that merely learns
  of its death places on (it was not down: nobody adopted unless it stayed unheard
  for the grace). An adopter that cannot reach it for longer may have adopted all
  the same; its claim wins when they meet, and the task may have run twice.

What the rules bound, and what they do not. Adoption needs a SWIM death, which needs a
suspicion timeout without a refutation, plus the grace: a node that is alive and
reachable keeps its tasks. A paused or cut-off home that stays unheard for longer than
its suspicion timeout + grace loses them; its copies may then run twice (at-least-once,
each run an attempt in the record; `--at-most-once` fencing is the lease's job, not
this module's). A key holder is the cluster (docs/security.md). It can gossip a false
death (SWIM takes any member's word); the home's refutation undoes it and the grace
starts again each time the home is seen alive, so a false death moves a task only if
the refutation is kept from the successor for a grace, which a key holder on the path
can do. More simply, it can send a forged notice with a larger epoch and so take over
any task, at once. Nothing here stops a key holder.
A network attacker without the key cannot get a membership record or a notice
accepted at all.

Wiring (not here): feed membership events (`on_event`; this node's own death too, when
it learns of it), the records this node holds (`hold`, `release`) and notices
(`on_notice`); call `step` a few times per grace; journal each `Adopt` and
`Rereplicate` before acting, send the task to its new replicas, and send each `Notice`
reliably. A replica must
learn each placement (its runner) before the home commits it, or a replica may adopt a
task that runs elsewhere.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

from .. import wire
from ..model import MemberState, NodeId, TaskId
from .actor import rendezvous_order
from .membership_events import MemberEvent
from .messages import MAX_ID_LEN

MAX_EPOCH = 2**63 - 1
MAX_COPIES = 16
REPLICA_WAIT = 2.0  # graces a replica waits for a dead home (a runner: one)
MAX_SEEN = 65_536  # claims remembered for tasks this node holds no record of
GONE = (MemberState.DEAD, MemberState.LEFT)


# -------------------------------------------------------------------- replicas


def replicas_wanted(cluster_size: int, configured: int | None = None) -> int:
    """Copies of a queued task's record, its home's included: `configured` clamped to
    [1, min(cluster size, MAX_COPIES)]; by default 2 on clusters of 3 or more, else 1."""
    if configured is None:
        return 2 if cluster_size >= 3 else 1
    return max(1, min(configured, cluster_size, MAX_COPIES))


def replica_of(
    task_id: TaskId, home: NodeId, live_members: Iterable[NodeId], k: int = 1
) -> tuple[NodeId, ...]:
    """The `k` nodes other than `home` that keep a copy of the task's record, in
    succession order (fewer when fewer members are live)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    order = rendezvous_order(task_id, (n for n in live_members if n != home))
    return tuple(order[:k])


def claim_key(epoch: int, node: NodeId) -> tuple[int, NodeId]:
    """How two claims to a task's authority compare: the larger one wins."""
    return (epoch, node)


# ---------------------------------------------------------------------- values


@attrs.frozen
class Record:
    """What one node knows of a task's authority."""

    home: NodeId
    epoch: int
    runner: NodeId | None = None
    replicas: tuple[NodeId, ...] = ()
    version: int = 0  # the home's own changes within one claim (new replicas)

    @property
    def key(self) -> tuple[int, NodeId, int]:
        """Claims compare by (epoch, node); one claimant's records by version."""
        return (*claim_key(self.epoch, self.home), self.version)

    def successor_of(self, node: NodeId) -> bool:
        return node != self.home and (node == self.runner or node in self.replicas)


@attrs.frozen
class Adopt:
    """This node is now the task's home: journal (task, epoch, replicas), then act."""

    task_id: TaskId
    from_home: NodeId
    epoch: int
    as_runner: bool  # True: it runs the task; False: a replica, the task is queued here
    replicas: tuple[NodeId, ...]  # the new record's replicas: send them the record
    reason: str = ""


@attrs.frozen
class Rereplicate:
    """This node, the task's authority, names new replicas (a replica was gone for a
    grace, or fewer were live than wanted when it took the task): journal the record
    (task, epoch, version, replicas), then send the task to the `added` ones."""

    task_id: TaskId
    epoch: int
    version: int
    replicas: tuple[NodeId, ...]
    added: tuple[NodeId, ...]
    reason: str = ""


@attrs.frozen
class Notice:
    """Tell `to` that `home` holds the task's authority at `epoch` (with this record)."""

    to: NodeId
    task_id: TaskId
    home: NodeId
    epoch: int
    runner: NodeId | None
    replicas: tuple[NodeId, ...]
    version: int = 0


class NoticeAction(enum.Enum):
    IGNORE = "ignore"  # not ours, or already known
    STALE = "stale"  # older than our record: answer with notice_for(task, sender)
    FOLLOW = "follow"  # record updated; we were not the authority (or we run it on)
    DROP = "drop"  # we were the authority: never place or run it again; send users on
    FORWARD = "forward"  # we run it, the new record does not say so: report to the new home


@attrs.define
class _Member:
    state: MemberState
    since: float  # when it last went from live to gone or back, on this node's clock


# ------------------------------------------------------------------ succession


class Succession:
    """One node's succession state: its membership view and the records it holds."""

    def __init__(self, me: NodeId, grace: float, configured: int | None = None) -> None:
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"grace must be >= 0, got {grace}")
        self.me = me
        self.grace = grace
        self.configured = configured  # the copies configured, the home's own included
        self._members: dict[NodeId, _Member] = {}
        self._known = 1  # members not known to have left, ourselves included (known_size)
        self._held: dict[TaskId, Record] = {}
        self._told: dict[TaskId, dict[NodeId, float]] = {}  # our adoptions: who knows
        self._doubt: dict[TaskId, float] = {}  # home tasks in doubt until
        self._copies: dict[TaskId, int] = {}  # our tasks: replicas wanted besides us
        self._ended: set[TaskId] = set()  # our tasks that ended: no new replicas (ended)
        # the largest claim heard for tasks we hold no record of (insertion order:
        # the oldest goes first past MAX_SEEN), so that a smaller claim delayed behind
        # it is answered STALE rather than followed
        self._seen: dict[TaskId, Record] = {}

    # ---------------------------------------------------------------- inputs

    def on_member(self, node: NodeId, state: MemberState, at: float) -> None:
        """A membership change in this node's view, in the order the membership core
        gave it (it already ordered incarnations). Our own death too, when we learn it."""
        gone = state in GONE
        cur = self._members.get(node)
        since = at if cur is None or (cur.state in GONE) != gone else cur.since
        if node != self.me:  # the known cluster, kept as members change (known_size)
            self._known += (state != MemberState.LEFT) - (
                cur is not None and cur.state != MemberState.LEFT
            )
        self._members[node] = _Member(state, since)
        if node == self.me and gone:
            self._in_doubt_from(at)

    def on_event(self, ev: MemberEvent) -> None:
        self.on_member(ev.member.node, ev.member.state, ev.at)

    def restarted(self, now: float) -> None:
        """This node restarted (its records come from its journal): a fresh membership
        view, every adopter's notice owed again, home tasks in doubt."""
        self._members.clear()
        self._known = 1
        self._seen.clear()  # not journaled: lost with the process
        for told in self._told.values():
            told.clear()
        self._in_doubt_from(now)

    def hold(
        self,
        task_id: TaskId,
        home: NodeId,
        epoch: int = 1,
        runner: NodeId | None = None,
        replicas: Iterable[NodeId] = (),
        version: int = 0,
    ) -> bool:
        """Keep (or update) a task's record; False if older than the one we have. For
        our own tasks the number of replicas given is the number kept from then on."""
        if not 1 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be in [1, {MAX_EPOCH}], got {epoch}")
        if not 0 <= version <= MAX_EPOCH:
            raise ValueError(f"version must be in [0, {MAX_EPOCH}], got {version}")
        rec = Record(home, epoch, runner, tuple(replicas), version)
        old = self._held.get(task_id) or self._seen.get(task_id)
        if old is not None and rec.key < old.key:
            return False
        self._seen.pop(task_id, None)
        self._store(task_id, rec)
        if home == self.me:
            self._copies[task_id] = max(self._copies.get(task_id, 0), len(rec.replicas))
            if epoch > 1 and task_id not in self._told:
                # our adoption, held anew (from the journal, after a restart): every
                # member is owed its notice again, the old home above all. Before stop
                # 52 a restarted adopter told nobody, and an old home that came back
                # later ran the task again after its doubt (the copies stateful test)
                self._told[task_id] = {}
        return True

    def release(self, task_id: TaskId) -> None:
        """Forget a task (finished and acknowledged, or its tombstone expired). Another
        node's adoption is remembered as a claim heard (bounded): before stop 53 a
        node that let it go took a copy from the old home back from the dead, out of
        date, and kept it for ever (`taken_from` refuses it now)."""
        rec = self._held.pop(task_id, None)
        self._told.pop(task_id, None)
        self._doubt.pop(task_id, None)
        self._seen.pop(task_id, None)
        self._copies.pop(task_id, None)
        self._ended.discard(task_id)
        if rec is not None and rec.epoch > 1 and rec.home != self.me:
            self._remember(task_id, rec)

    def ended(self, task_id: TaskId) -> None:
        """Our task (an adoption: its record stays, for the notices) has ended: it
        needs no new replicas. Before stop 54 an adoption that ended was named new
        replicas at every tick (its copies released, its record then named none): a
        durable write, copies and a notice to every member each second per task."""
        self._ended.add(task_id)

    def epoch_of(self, task_id: TaskId, home: NodeId) -> int:
        """`home`'s claim on the task as held or heard here (1 if none known): what a
        runner's record is held at, its guest entry not knowing it."""
        rec = self._held.get(task_id) or self._seen.get(task_id)
        return rec.epoch if rec is not None and rec.home == home else 1

    def on_adoption_notice(
        self,
        task_id: TaskId,
        new_home: NodeId,
        epoch: int,
        runner: NodeId | None = None,
        replicas: Iterable[NodeId] = (),
        version: int = 0,
    ) -> NoticeAction:
        """Another node claims the task's authority; keep the larger claim."""
        if not (1 <= epoch <= MAX_EPOCH and 0 <= version <= MAX_EPOCH):
            return NoticeAction.IGNORE
        new = Record(new_home, epoch, runner, tuple(replicas), version)
        old = self._held.get(task_id)
        if old is None:
            seen = self._seen.get(task_id)
            if seen is not None and new.key < seen.key:
                return NoticeAction.STALE  # a larger claim came first, by another path
            if new.successor_of(self.me):
                self._seen.pop(task_id, None)
                self._store(task_id, new)
                return NoticeAction.FOLLOW
            self._remember(task_id, new)
            return NoticeAction.IGNORE
        if new.key < old.key:
            return NoticeAction.STALE
        if new == old or new_home == self.me:
            return NoticeAction.IGNORE
        if new_home == old.home:
            # a later claim of the home we already hold the task for (it adopted the
            # task, then handed it to us): we stay where its handoff put us; the runner
            # its notice names may be older than that handoff
            self._store(task_id, attrs.evolve(new, runner=new.runner or old.runner))
            return NoticeAction.FOLLOW
        self._store(task_id, new)
        if old.runner == self.me and runner != self.me:
            return NoticeAction.FORWARD
        if old.home == self.me and runner != self.me:
            return NoticeAction.DROP
        return NoticeAction.FOLLOW

    def retell(self, task_id: TaskId, node: NodeId) -> None:
        """A notice of ours did not reach `node`: owe it again (the next `step`)."""
        told = self._told.get(task_id)
        if told is not None:
            told.pop(node, None)

    def on_notice(self, n: Notice) -> NoticeAction:
        return self.on_adoption_notice(n.task_id, n.home, n.epoch, n.runner, n.replicas, n.version)

    # --------------------------------------------------------------- queries

    def record(self, task_id: TaskId) -> Record | None:
        return self._held.get(task_id)

    def taken_from(self, task_id: TaskId, home: NodeId, epoch: int = 1) -> Record | None:
        """The claim, held or heard, by which a node other than `home` took the task
        over (an adoption) past `home`'s own claim `epoch`: `home`'s word on it is
        out of date (None: no such claim)."""
        rec = self._held.get(task_id) or self._seen.get(task_id)
        if rec is None or rec.home == home or rec.epoch == 1:
            return None
        return rec if claim_key(rec.epoch, rec.home) > claim_key(epoch, home) else None

    def held(self) -> dict[TaskId, Record]:
        return dict(self._held)

    def records(self) -> Mapping[TaskId, Record]:
        """The records held, read-only and not copied (the failover tick compares
        thousands of them each second)."""
        return MappingProxyType(self._held)

    def is_authority(self, task_id: TaskId) -> bool:
        rec = self._held.get(task_id)
        return rec is not None and rec.home == self.me

    def in_doubt(self, task_id: TaskId, now: float) -> bool:
        """True while a home that was declared dead or restarted should not place or
        start the task: it may have been adopted (a notice ends the doubt)."""
        return self.is_authority(task_id) and now < self._doubt.get(task_id, -math.inf)

    def notice_for(self, task_id: TaskId, to: NodeId) -> Notice | None:
        rec = self._held.get(task_id) or self._seen.get(task_id)
        if rec is None:
            return None
        return Notice(to, task_id, rec.home, rec.epoch, rec.runner, rec.replicas, rec.version)

    def alive(self) -> list[NodeId]:
        """The members alive in this view (ourselves left out)."""
        return sorted(
            n for n, m in self._members.items() if m.state is MemberState.ALIVE and n != self.me
        )

    def member_state(self, node: NodeId) -> MemberState | None:
        """`node`'s state in this view (None: never heard of)."""
        m = self._members.get(node)
        return None if m is None else m.state

    def is_alive(self, node: NodeId) -> bool:
        """Is `node` alive in this view (not suspect, not gone, not unknown)?"""
        m = self._members.get(node)
        return m is not None and m.state is MemberState.ALIVE

    def known_size(self) -> int:
        """The cluster's size as this view knows it: every member not known to have
        left, the dead among them (a node down is expected back), ourselves too."""
        return self._known  # kept by on_member: each submission asks (replicas.py)

    def copies_wanted(self) -> int:
        """Replicas a task of ours is to have besides us, by the known cluster size
        (replicas_wanted). Stop 53: an adopter kept the replicas of the record it
        held, none for a runner (its guest entry names none) and none for a task
        submitted while a node was down, and added none when the node came back: a
        second loss, after the first was over, could then take the task."""
        return replicas_wanted(self.known_size(), self.configured) - 1

    def gone_for(self, node: NodeId, now: float) -> float | None:
        """How long `node` has been dead or left in this view (None: it is not)."""
        m = self._members.get(node)
        return now - m.since if m is not None and m.state in GONE else None

    # ------------------------------------------------------------------ step

    def step(self, now: float) -> list[Adopt | Rereplicate | Notice]:
        """The adoptions due now, the new replicas of our tasks, then the notices owed."""
        out: list[Adopt | Rereplicate | Notice] = []
        if self.gone_for(self.me, now) is None:
            # Only a record naming a node gone for a grace, or with fewer replicas than
            # wanted, can call for anything: the others are passed over with a set
            # lookup (a home with 10,000 tasks out spent ~25 ms a tick here, stop 45)
            gone = frozenset(n for n in self._members if self._gone_long(n, now))
            held = self._held
            if gone:
                for task_id in sorted(t for t, r in held.items() if r.home in gone):
                    adopt = self._consider(task_id, held[task_id], now)
                    if adopt is not None:
                        out.append(adopt)
            me = self.me
            # an adoption aims for the known cluster's copies, however few it kept
            # when it was made or read back from the journal (a restarted adopter)
            floor = self.copies_wanted()
            short = [
                t
                for t, want in self._copies.items()
                if t not in self._ended
                and (r := held.get(t)) is not None
                and (
                    len(r.replicas) < (max(want, floor) if r.epoch > 1 else want)
                    or me in r.replicas
                    or not gone.isdisjoint(r.replicas)
                )
            ]
            for task_id in sorted(short):
                again = self._rereplicate(task_id, now)
                if again is not None:
                    out.append(again)
        for task_id, told in sorted(self._told.items()):
            for node, m in sorted(self._members.items()):
                if node != self.me and m.state not in GONE and told.get(node) != m.since:
                    told[node] = m.since
                    n = self.notice_for(task_id, node)
                    assert n is not None
                    out.append(n)
        return out

    def _gone_long(self, node: NodeId | None, now: float, graces: float = 1.0) -> bool:
        g = None if node is None else self.gone_for(node, now)
        return g is not None and g >= graces * self.grace

    def _consider(self, task_id: TaskId, rec: Record, now: float) -> Adopt | None:
        if not rec.successor_of(self.me) or not self._gone_long(rec.home, now):
            return None
        if rec.epoch >= MAX_EPOCH:
            return None
        as_runner = rec.runner == self.me
        if not as_runner:
            if not self._gone_long(rec.home, now, REPLICA_WAIT):
                return None  # a runner we have not heard of claims first (see the top)
            if rec.runner not in (None, rec.home) and not self._gone_long(rec.runner, now):
                return None  # the runner (alive, suspect or not long gone) adopts it
            for r in rec.replicas:
                if r == self.me:
                    break
                if not self._gone_long(r, now):
                    return None  # an earlier replica adopts it
        gone = self.gone_for(rec.home, now)
        role = "runner" if as_runner else "replica"
        why = f"{rec.home} dead for {gone:.1f}s (grace {self.grace:.1f}s): adopted as {role}"
        return self._take(task_id, rec, rec.epoch + 1, as_runner, why)

    def counter(self, task_id: TaskId, old: Record, claim: Notice) -> Adopt | None:
        """Claim above `claim`, an adoption naming no runner but its claimant (which
        may have queued or started it since), of a task that ended here (`old`: our
        record before the notice; the caller knows of the end), so that the end stays
        instead of the claimant running the task again. Only as the runner of the
        record it takes over, or against a tie our own adoption lost on node ids (the
        task ended here or at its runner): a counter is never countered in turn (it
        names its claimant as runner, and is above the claim it answers). Stop 54: a
        runner restarted just after its home died dated the death from its restart,
        adopted in the same tick as a copy holder, lost the tie, forgot the end of its
        run, and the holder ran the task again."""
        if claim.runner not in (None, claim.home) or claim.epoch >= MAX_EPOCH:
            return None
        if old.home == self.me:
            if claim.epoch != old.epoch:
                return None  # not a tie: ours was not the adoption it outranks
        elif old.runner != self.me:
            return None
        why = f"{claim.home} claimed it at epoch {claim.epoch} naming no runner; it ended here"
        return self._take(task_id, old, claim.epoch + 1, True, why)

    def _take(self, task_id: TaskId, rec: Record, epoch: int, as_runner: bool, why: str) -> Adopt:
        """Hold the task as its home at `epoch`, with the copies the known cluster calls
        for among the live members; every member owed the notice."""
        live = [n for n, m in self._members.items() if m.state is MemberState.ALIVE]
        want = max(len(rec.replicas), self.copies_wanted())
        replicas = replica_of(task_id, self.me, [*live, self.me], want)
        self._store(task_id, Record(self.me, epoch, self.me if as_runner else None, replicas))
        self._copies[task_id] = want  # fewer live now: more named as members come back
        self._told[task_id] = {}
        return Adopt(task_id, rec.home, epoch, as_runner, replicas, why)

    def _rereplicate(self, task_id: TaskId, now: float) -> Rereplicate | None:
        """Our task keeps `_copies` replicas: while one has been gone for a grace (or
        too few were live when we took it) and a live member can stand in, name it.
        A home in doubt does not: it may no longer be the authority."""
        rec = self._held.get(task_id)
        if rec is None or rec.home != self.me or self.in_doubt(task_id, now):
            return None
        if task_id in self._ended:
            return None
        want = self._copies[task_id]
        if rec.epoch > 1:
            want = max(want, self.copies_wanted())
        kept = [r for r in rec.replicas if r != self.me and not self._gone_long(r, now)]
        if len(kept) >= want:
            return None
        live = [
            n
            for n, m in self._members.items()
            if m.state is MemberState.ALIVE and n != self.me and n not in kept
        ]
        added = replica_of(task_id, self.me, live, want - len(kept))
        if not added:
            return None
        replicas = (*kept, *added)
        version = rec.version + 1
        self._store(task_id, attrs.evolve(rec, replicas=replicas, version=version))
        self._told[task_id] = {}
        lost = [r for r in rec.replicas if r not in kept]
        why = f"replicas {', '.join(lost)} gone" if lost else f"{len(kept)} of {want} replicas"
        return Rereplicate(task_id, rec.epoch, version, replicas, added, why)

    # --------------------------------------------------------------- helpers

    def _store(self, task_id: TaskId, rec: Record) -> None:
        self._held[task_id] = rec
        if rec.home != self.me:
            self._told.pop(task_id, None)
            self._doubt.pop(task_id, None)
            self._copies.pop(task_id, None)
            self._ended.discard(task_id)

    def _remember(self, task_id: TaskId, rec: Record) -> None:
        self._seen.pop(task_id, None)
        self._seen[task_id] = rec
        while len(self._seen) > MAX_SEEN:
            del self._seen[next(iter(self._seen))]

    def _in_doubt_from(self, now: float) -> None:
        for task_id, rec in self._held.items():
            if rec.home == self.me:
                self._doubt[task_id] = now + self.grace


# ------------------------------------------------------------------------ wire


def notice_to_wire(n: Notice) -> dict[str, object]:
    return {
        "id": n.task_id,
        "home": n.home,
        "epoch": n.epoch,
        "runner": n.runner,
        "replicas": list(n.replicas),
        "version": n.version,
    }


def notice_from_wire(obj: object, to: NodeId) -> Notice:
    """A peer's notice (wire.SchemaError naming the field if malformed)."""
    f = wire.Fields(obj, "adoption notice")
    tid = f.task_id("id", required=True)
    home = f.str("home", required=True, max_len=MAX_ID_LEN)
    epoch = f.int("epoch", required=True, lo=1, hi=MAX_EPOCH)
    runner = f.str("runner", None, max_len=MAX_ID_LEN)
    replicas = f.str_list("replicas", max_items=MAX_COPIES)
    version = f.int("version", 0, lo=0, hi=MAX_EPOCH)
    f.done()
    if not home:
        raise wire.SchemaError("adoption notice: field 'home': empty node id")
    if any(not r or len(r) > MAX_ID_LEN for r in replicas):
        raise wire.SchemaError("adoption notice: field 'replicas': an empty or long node id")
    return Notice(to, tid, home, epoch, runner or None, tuple(replicas), version)
