"""The autoscaler of one pool on one node (pure; issue 25).

Every agent runs one `PoolController` per `[scale.POOL]` table. Each tick it steps the
pool's actor seat (`cluster/actor.py`: rendezvous owner + gossiped lease); only the
seat's holder decides (`policy/autoscale.py`) and acts. Acting means instructions for
the runtime (`runtime/autoscaler.py`), which carries them out and feeds results back:

- `RunHook`: run the pool's scale-out or scale-in command (one at a time per pool;
  a failed attempt is retried after `hook-backoff`, doubled each time, up to
  `hook-retries` times, then the action is given up and forgotten by the policy);
- `Drain`: drain (or undrain) a node, through a peer request to it;
- `Journal`: the action, durably, so a restarted agent keeps its cooldowns;
- `Announce`: the seat's lease with the last action and the nodes being drained, on
  gossip, so that every node's cooldowns count from the same action and a holder that
  takes over finishes the drains its predecessor began.

Scale-in is safe by construction: the victims are the nodes whose removal loses least
(`choose_victims`: fewest running task-seconds, never a node running a task that
cannot migrate for longer than the drain grace, never the acting node itself); they
are drained first (transfer and migration move their queued and movable work away),
and the hook that removes them runs only once their reports show no work, or after
`drain-grace`. A victim that receives work meanwhile (its running + queued count
rises after its drain showed in its report) is undrained and kept.

Gossiped times travel as ages ("ago"): no two nodes' clocks are compared.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs

from .. import wire
from ..cluster.actor import ActorSeat, Lease, SeatStep
from ..model import NodeId
from ..policy import autoscale as asc
from ..policy.scalepool import Member, PoolSpec, in_pool, node_work, pool_view
from .scaleboot import Launch, heard_launches, not_joined
from .scalemsgs import (
    Announce,
    Drain,
    HeardBoot,
    HookRun,
    Instruction,
    Journal,
    RunHook,
    announcement_from,
    announcement_wire,
    booting_wire,
    hook_env,
    journal_instr,
    record_from,
)
from .scalestatus import pool_status
from .scalevictims import Victim, adopt_victims, check_victims, keep_min

HISTORY = 8  # hook runs kept for `swarm scale status`


# ---------------------------------------------------------------------- state


@attrs.define
class Pending:
    action: Literal["out", "in"]
    count: int
    nodes: tuple[NodeId, ...]
    desired: int
    epoch: int
    attempt: int = 0
    next_at: float = 0.0
    running: bool = False
    launch: Launch | None = None  # a scale-out's nodes, booting from its first attempt


class PoolController:
    """One pool's autoscaler on one node. `tick` a few times per lease ttl."""

    def __init__(self, me: NodeId, spec: PoolSpec) -> None:
        self.me = me
        self.spec = spec
        ttl = spec.lease_ttl
        self.seat = ActorSeat(me, spec.key, ttl, grace=ttl)
        self.state = asc.ScaleState()
        self.step: SeatStep | None = None
        self.decision: asc.ScaleDecision | None = None
        self.view: asc.PoolView | None = None
        self.view_at: float | None = None  # when `view` was taken (this node's clock)
        self.launches: list[Launch] = []
        self.victims: dict[NodeId, Victim] = {}
        self.removed: dict[NodeId, float] = {}  # removed by a hook that succeeded, at
        # victims kept (work arrived, the drain never showed, the hook failed): not
        # chosen again until then, or the same node would be drained over and over
        self.spared: dict[NodeId, float] = {}
        self.pending: Pending | None = None
        self.heard_victims: set[NodeId] = set()
        self.heard_booting: HeardBoot | None = None
        self.pool_nodes: frozenset[NodeId] = frozenset()  # the pool at the last acting tick
        self.heard_at = (0, 0)  # (epoch, seq) of the newest seat state heard
        self.seq = 0  # of this node's announcements
        self.heard_holder: NodeId = ""  # whose seat state `heard_at` is
        self.adopted_epoch = 0
        self.history: deque[HookRun] = deque(maxlen=HISTORY)
        self.notes: deque[str] = deque(maxlen=HISTORY)  # drains undone, victims dropped
        self.bad_announcements = 0

    # ------------------------------------------------------------ from others

    def on_announce(self, payload: Any, now: float) -> bool:
        """A peer's announcement (gossip or push-pull; the holder's, or one relayed by
        a node that heard it); False if dropped as malformed (counted)."""
        try:
            h = announcement_from(payload, now)
        except wire.WireError:
            self.bad_announcements += 1
            return False
        lease = h.lease
        if lease is not None and lease.key != self.spec.key:
            return True  # another pool's: none of ours
        if lease is not None:
            self.seat.on_lease(lease, now)  # ours from a previous life: its epoch only
            if lease.holder == self.me:
                return True
        # a relay renews no lease, but its epoch is spent: never claim it again
        self.seat.max_epoch = max(self.seat.max_epoch, h.epoch)
        if h.holder == self.me:
            return True  # our own state, relayed back: we know better
        if h.last is not None:
            self.state = self.state.learn(h.last)
        for n in h.removed:  # a removal is a fact, whatever the order it is heard in
            self.removed.setdefault(n, now)
        if (h.epoch, h.seq) >= self.heard_at:
            # the newest seat state wins (a push-pull from before a partition healed
            # must not bring back victims removed since: found by the chaos suite)
            self.heard_at = (h.epoch, h.seq)
            self.heard_holder = h.holder
            self.heard_victims = set(h.victims) - set(h.removed)
            self.heard_booting = HeardBoot(*(h.booting or (0, now, None)))
        return True

    def restore(self, record: Any, now: float, wall: float) -> None:
        """The pool's journaled record, at start-up: the last action (its cooldowns
        still hold after a restart), the nodes it was draining and those booting."""
        try:
            last, victims, epoch, booting = record_from(record, now, wall)
        except wire.WireError:
            self.bad_announcements += 1
            return
        if last is not None:
            self.state = self.state.learn(last)
        self.seat.max_epoch = max(self.seat.max_epoch, epoch)
        self.heard_victims |= set(victims)
        if booting is not None and self.heard_booting is None:
            self.heard_booting = HeardBoot(*booting)

    # ----------------------------------------------------------------- a tick

    def tick(
        self, now: float, members: Sequence[Member], live: Iterable[NodeId]
    ) -> list[Instruction]:
        """Step the seat; if this node holds it, check drains, retry, or decide."""
        live_set = frozenset(live)
        out: list[Instruction] = []
        hb = self.heard_booting
        if hb is not None and hb.baseline is None:
            hb.baseline = frozenset(
                mb.node for mb in members if mb.node in live_set and in_pool(self.spec, mb)
            )
        step = self.seat.step(live_set, now)
        self.step = step
        if step.epoch and step.epoch != self.adopted_epoch:
            self._adopt(now, step, out)
        if step.announce is not None:
            out.append(Announce(self.spec.key, self._payload(step.announce, now)))
        if not step.acting:
            return out
        said = len(out)
        self._act(now, members, live_set, step, out)
        if len(out) > said:
            self._announce_now(now, out)
        return out

    def _adopt(self, now: float, step: SeatStep, out: list[Instruction]) -> None:
        """A new tenure, from the claim on (its first announcement must carry them):
        finish the drains the previous holder (or a previous life) began, and count
        the nodes it launched that have not joined yet (else they would be launched
        again once the cooldown is over, past max_nodes: tests/unit/test_scaling.py)."""
        self.adopted_epoch = step.epoch
        heard = self.heard_victims - self.removed.keys()
        adopt_victims(self.victims, heard, self.me, self.spec, self.notes, now, out)
        self.heard_victims = set()
        if self.heard_booting is not None:
            self.launches = heard_launches(self.heard_booting, now, self.spec.boot_timeout)
            self.heard_booting = None

    def _act(
        self,
        now: float,
        members: Sequence[Member],
        live_set: frozenset[NodeId],
        step: SeatStep,
        out: list[Instruction],
    ) -> None:
        if self.pending is not None and self.pending.running:
            return  # one hook at a time
        pool = [
            mb
            for mb in members
            if mb.node in live_set and mb.node not in self.removed and in_pool(self.spec, mb)
        ]
        self.pool_nodes = frozenset(mb.node for mb in pool)
        self._forget_removed(now, live_set)
        said = len(out)
        ready = check_victims(
            self.victims,
            self.spec,
            self.notes,
            self._in_hook(),
            now,
            {mb.node: mb for mb in pool},
            out,
        )
        self._spare(now, out[said:])
        p = self.pending
        in_hook = set(p.nodes) if p is not None and p.action == "in" else set()
        ready, drop_hook = keep_min(
            self.victims,
            self.spec,
            self.notes,
            in_hook,
            p is not None and not p.running,
            len(pool),
            ready,
            out,
        )
        if drop_hook:
            self.pending = None
        p = self.pending
        if p is not None:
            if now >= p.next_at:
                out.append(self._run(p, now))
            return
        if ready:
            self.pending = Pending(
                "in", len(ready), tuple(sorted(ready)), len(pool) - len(ready), step.epoch
            )
            out.append(self._run(self.pending, now))
            return
        view = pool_view(
            self.spec, pool, draining=self.victims.keys(), booting=self._booting(now, pool)
        )
        self.view, self.view_at = view, now
        self.state, dec = asc.decide(self.state, view, self.spec.scale, now, epoch=step.epoch)
        self.decision = dec
        if dec.action == "out":
            launch = Launch(now, dec.count, frozenset(mb.node for mb in pool), view.booting)
            self.launches.append(launch)
            self.pending = Pending("out", dec.count, (), dec.desired, step.epoch, launch=launch)
            out.append(self._run(self.pending, now))
            out.append(self._journal(now, "out", dec.count, (), dec.reason))
        elif dec.action == "in":
            self._start_drains(now, pool, dec, out)

    def _start_drains(
        self, now: float, pool: Sequence[Member], dec: asc.ScaleDecision, out: list[Instruction]
    ) -> None:
        work = [
            node_work(mb.report, mb.age)
            for mb in pool
            if mb.report is not None
            and mb.node != self.me
            and mb.node not in self.victims
            and not mb.report.draining
            and self.spared.get(mb.node, now) <= now
        ]
        # the caller's clamp: never below min_nodes. decide's count already is, but it
        # counts booting nodes, which may never come: the floor here is the nodes present
        # (found by tests/unit/test_scaling.py; _keep_min holds it when nodes die)
        room = max(0, len(pool) - len(self.victims) - self.spec.scale.min_nodes)
        chosen = asc.choose_victims(work, min(dec.count, room), long_task=self.spec.drain_grace)
        if not chosen:
            self.state = self.state.failed(now)
            why = (
                f"{len(pool) - len(self.victims)} nodes present, min_nodes"
                f" {self.spec.scale.min_nodes} (booting nodes must join first)"
                if room == 0
                else "the acting node, pinned or busy nodes are never chosen"
            )
            self.decision = attrs.evolve(
                dec,
                action="none",
                count=0,
                reason=f"{dec.reason}; no node can be removed now ({why})",
            )
            return
        if len(chosen) < dec.count:
            self.state = attrs.evolve(self.state, last=asc.Acted("in", len(chosen), now))
        by_node = {mb.node: mb for mb in pool}
        for n in chosen:
            r = by_node[n].report
            assert r is not None
            self.victims[n] = Victim(since=now, work=r.running + r.queued + r.homing)
            out.append(Drain(self.spec.name, n, True, f"scale-in of pool {self.spec.name}"))
        out.append(self._journal(now, "in", len(chosen), tuple(chosen), dec.reason))

    def _spare(self, now: float, said: list[Instruction]) -> None:
        for i in said:
            if isinstance(i, Drain) and not i.on:
                self.spared[i.node] = now + self.spec.drain_grace

    def _in_hook(self) -> set[NodeId]:
        return set(self.pending.nodes) if self.pending is not None else set()

    def _forget_removed(self, now: float, live: frozenset[NodeId]) -> None:
        for n, at in list(self.removed.items()):
            if n not in live or now - at > self.spec.boot_timeout:
                del self.removed[n]

    def _booting(self, now: float, pool: Sequence[Member]) -> int:
        self.launches = [x for x in self.launches if now - x.at < self.spec.boot_timeout]
        return self._not_joined(frozenset(mb.node for mb in pool))

    def _not_joined(self, pool: frozenset[NodeId]) -> int:
        return not_joined(self.launches, pool)

    # ------------------------------------------------------------------ hooks

    def _run(self, p: Pending, now: float) -> RunHook:
        p.running = True
        cmd = self.spec.out_command if p.action == "out" else self.spec.in_command
        return RunHook(
            self.spec.name,
            p.action,
            cmd,
            hook_env(
                self.spec.name, self.me, p.action, p.count, p.nodes, p.desired, p.epoch, p.attempt
            ),
            self.spec.hook_timeout,
            p.attempt,
        )

    def hook_done(
        self,
        now: float,
        *,
        ok: bool,
        rc: int | None = None,
        error: str = "",
        output: str = "",
        duration: float = 0.0,
    ) -> list[Instruction]:
        """The running hook's attempt ended: done, retry later, or give up."""
        p = self.pending
        if p is None or not p.running:
            return []
        p.running = False
        self.history.append(
            HookRun(p.action, p.count, p.nodes, p.attempt, ok, rc, error, output, now, duration)
        )
        out: list[Instruction] = []
        if ok:
            self.pending = None
            if p.launch is not None:
                # its nodes boot from now: a slow hook (or its retries) must not use up
                # the boot timeout, or they would be launched again as they join (found
                # by tests/unit/test_scaling.py)
                p.launch.at = now
            if p.action == "in":
                for n in p.nodes:
                    self.victims.pop(n, None)
                    self.removed[n] = now
                out.append(self._journal(now, "in", p.count, p.nodes, "scale-in hook done"))
                self._announce_now(now, out)
            return out
        if p.attempt < self.spec.hook_retries:
            p.attempt += 1
            p.next_at = now + self.spec.retry_delay(p.attempt)
            return out
        # given up: the policy forgets the action (its cooldown does not hold the next)
        self.pending = None
        self.state = self.state.failed(now)
        if p.action == "out":
            self.launches = [x for x in self.launches if x is not p.launch]
        else:
            for n in p.nodes:
                self.victims.pop(n, None)
                why = f"scale-in hook failed {p.attempt + 1} times: kept"
                self.notes.append(f"{n}: {why}")
                out.append(Drain(self.spec.name, n, False, why))
            self._spare(now, out)
        out.append(self._journal(now, None, 0, (), f"{p.action} hook given up: {error}"))
        self._announce_now(now, out)
        return out

    # ----------------------------------------------------------- what we say

    def _payload(self, lease: Lease, now: float) -> dict[str, Any]:
        self.seq += 1
        return announcement_wire(
            lease=lease,
            holder=self.me,
            epoch=lease.epoch,
            seq=self.seq,
            last=self.state.latest,
            victims=self.victims,
            removed=self.removed,
            booting=self._booting_wire(now),
            now=now,
        )

    def _booting_wire(self, now: float) -> dict[str, Any] | None:
        newest = max((x.at for x in self.launches), default=None)
        return booting_wire(self._not_joined(self.pool_nodes), newest, now)

    def _announce_now(self, now: float, out: list[Instruction]) -> None:
        """An action changed what the lease carries (the last action, the victims): say
        it now, not at the next renewal a third of a ttl later, or a holder that dies
        meanwhile leaves its drains to nobody and its cooldown unknown (found by
        tests/unit/test_scaling.py). Only while the claim is current on this node's
        clock (an extra announcement renews nothing here: the seat's timing is its own)."""
        claim = self.seat.claim
        if claim is None or now - self.seat.announced_at >= self.seat.ttl:
            return
        out[:] = [i for i in out if not isinstance(i, Announce)]
        out.append(Announce(self.spec.key, self._payload(claim, now)))

    def announcement(self, now: float) -> dict[str, Any] | None:
        """What this node carries in every push-pull for the pool: its claim while it
        holds one (a node that joins hears the current epoch); else, relayed without
        a lease, the newest seat state it heard, so that a node that joins or restarts
        after the holder died still learns the spent epoch, the last action (its
        cooldown), the drains to finish and the nodes booting (found by
        tests/unit/test_scaling.py); None when it heard nothing."""
        if self.seat.claim is not None:
            return self._payload(self.seat.claim, now)
        if self.heard_at == (0, 0):
            return None
        hb = self.heard_booting
        return announcement_wire(
            lease=None,
            holder=self.heard_holder,
            epoch=self.heard_at[0],
            seq=self.heard_at[1],
            last=self.state.latest,
            victims=self.heard_victims,
            removed=self.removed,
            booting=None if hb is None else booting_wire(hb.count, hb.at, now),
            now=now,
        )

    def _journal(
        self, now: float, action: str | None, count: int, nodes: tuple[NodeId, ...], why: str
    ) -> Journal:
        # with the nodes booting: a restarted actor counts them (found by
        # tests/unit/test_scaling.py), from the pool they were counted against
        return journal_instr(
            self.spec,
            self.state.latest,
            self.victims,
            self.step.epoch if self.step is not None else 0,
            self._booting_wire(now),
            self.pool_nodes,
            (action, count, nodes, why),
            now,
        )

    def status(self, now: float) -> dict[str, Any]:
        """This pool as this node sees it, for `swarm scale status` (JSON-able)."""
        return pool_status(self, self._not_joined(self.pool_nodes), now)
