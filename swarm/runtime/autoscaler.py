"""Elastic pools' I/O (issue 25): the loop that ticks each pool's controller
(node/scaling.py) and carries out what it says.

Each tick (a sixth of the lease ttl, at most a second) it hands every controller the
live members and their newest load reports; it gossips what the controllers announce
(an app message, and the same payload in every push-pull so that a node that joins
hears the current lease), runs hooks (runtime/scalehooks.py) in the background and
feeds their results back, drains victims through the `scale-drain` peer request, asks
them what they hold right before a scale-in hook (`scale-work`), and journals every
action before its hook runs.

Security:
- a local user: `swarm scale status` is for root and the agent's user only (hook
  output may hold a cloud CLI's secrets); nothing else here is reachable locally;
- a key holder (any agent of the cluster): can drain any node of a pool it knows by
  name (`scale-drain`), gossip a lease that keeps this pool's actor from acting for
  a lease ttl, or gossip false reports so the actor picks other victims or counts;
  the hooks it can cause are only the operator's commands, with node names passed
  as environment values, never as shell text; it can ask a node of a pool how many
  tasks it holds (`scale-work`, asked before a scale-in hook: what the node's gossiped
  reports say anyway), and by a false answer delay or let a hook run;
- a network attacker without the key: nothing (gossip and peer requests are
  authenticated and bound to their destination).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import trio

from .. import model as m
from .. import wire
from ..cluster.membership import AppMessage, AppState, Event
from ..logs import EventLog
from ..node.scalemsgs import Announce, Drain, Instruction, RunHook, journal_value
from ..node.scalemsgs import Journal as JournalInstr
from ..node.scaling import PoolController
from ..policy.scalepool import Member, PoolSpec
from .api import PeerCred, RequestError
from .clock import Clock
from .journal import Event as JournalEvent
from .journal import Journal, JournalError, PutKV
from .localops import Shares
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .scalehooks import run_hook

DRAIN_TIMEOUT = 10.0  # s for one scale-drain request


class Autoscaler:
    def __init__(
        self,
        pools: tuple[PoolSpec, ...],
        cluster: ClusterNode,
        journal: Journal,
        shares: Shares,
        local_report: Callable[[], m.LoadReport],
        clock: Clock,
        log: EventLog,
    ) -> None:
        node = cluster.node
        self.node = node
        self.cluster = cluster
        self.journal = journal
        self.shares = shares
        self.local_report = local_report  # this node's report, fresh
        self.clock = clock
        self.log = log
        self.pools: dict[str, PoolController] = {p.key: PoolController(node, p) for p in pools}
        ttl = min((p.lease_ttl for p in pools), default=15.0)
        self.tick_every = min(1.0, ttl / 6)
        self._nursery: trio.Nursery | None = None
        self._kick = trio.Event()

    # ------------------------------------------------------------- start-up

    def restore(self, kv: Mapping[str, Any]) -> None:
        now, wall = self.clock.now(), self.clock.wall()
        for key, ctl in self.pools.items():
            record = kv.get(key)
            if record is not None:
                ctl.restore(record, now, wall)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self.pools:
            task_status.started()
            return
        self.cluster.subscribe(self.on_event)
        # an elastic pool's actor drains a scale-in victim through this peer request
        self.cluster.rpc["scale-drain"] = self.rpc_drain
        # and asks each victim what it holds right before the scale-in hook
        self.cluster.rpc["scale-work"] = self.rpc_work
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self.tick()
                with trio.move_on_after(self.tick_every):
                    await self._kick.wait()
                self._kick = trio.Event()

    # ----------------------------------------------------------------- ticks

    def _members(self) -> tuple[list[Member], set[m.NodeId]]:
        ms = self.cluster.membership
        now = self.clock.now()
        if ms is None:
            return [Member(self.node, self.local_report(), 0.0)], {self.node}
        live = {mb.node for mb in ms.alive_members()}
        live.add(self.node)
        loads = ms.load_view()
        members = []
        for n in sorted(live):
            if n == self.node:
                members.append(Member(n, self.local_report(), 0.0))
                continue
            e = loads.get(n)
            members.append(
                Member(
                    n,
                    None if e is None else e.report,
                    0.0 if e is None else max(0.0, now - e.received_at),
                )
            )
        return members, live

    def tick(self) -> None:
        members, live = self._members()
        now = self.clock.now()
        for ctl in self.pools.values():
            self._carry_out(ctl, ctl.tick(now, members, live))
            # every push-pull carries the pool's seat state as this node knows it: its
            # own lease while it holds the seat, else what it heard, relayed without a
            # lease (a lease kept there after losing the seat would look renewed)
            self.cluster.set_app_state_part(ctl.spec.key, ctl.announcement(now))

    def _carry_out(self, ctl: PoolController, instrs: list[Instruction]) -> None:
        assert self._nursery is not None
        for i in instrs:
            if isinstance(i, Announce):
                try:
                    self.cluster.broadcast_app(i.key, i.payload)
                except ValueError as e:
                    self.log.warning("scale.announce_too_large", pool=ctl.spec.name, error=str(e))
                self.cluster.set_app_state_part(i.key, i.payload)
            elif isinstance(i, JournalInstr):
                # queued behind nothing: the hook that follows is started after it lands
                self._journal_soon(ctl, i)
            elif isinstance(i, RunHook):
                self._nursery.start_soon(self._hook, ctl, i)
            elif isinstance(i, Drain):
                self._nursery.start_soon(self._drain, ctl, i)

    def _journal_soon(self, ctl: PoolController, j: JournalInstr) -> None:
        wall = self.clock.wall()
        value = journal_value(j, wall)
        self.log.info("scale.action", **j.note)
        self.journal.enqueue(
            [PutKV(j.key, value), JournalEvent(wall, "scale", None, self.node, j.note)]
        )

    async def _hook(self, ctl: PoolController, h: RunHook) -> None:
        # the action is journaled first (enqueued just before): wait for it to land
        try:
            await self.journal.commit([])
        except JournalError as e:
            self.log.error("scale.journal_failed", pool=h.pool, error=str(e))
        if h.action == "in":
            held = await self._victims_hold(h)
            if held:
                # not run: an attempt that failed (retried after the back-off, given up
                # after the retries, when the victims are undrained and kept)
                self.log.warning("scale.hook_held", pool=h.pool, attempt=h.attempt, why=held)
                self._carry_out(ctl, ctl.hook_done(self.clock.now(), ok=False, error=held))
                self._kick.set()
                return
        self.log.info(
            "scale.hook_start",
            pool=h.pool,
            action=h.action,
            count=h.env.get("SWARM_SCALE_COUNT"),
            nodes=h.env.get("SWARM_SCALE_NODES"),
            attempt=h.attempt,
        )
        res = await run_hook(h.command, h.env, h.timeout, now=self.clock.now)
        (self.log.info if res.ok else self.log.warning)(
            "scale.hook_done",
            pool=h.pool,
            action=h.action,
            ok=res.ok,
            rc=res.rc,
            error=res.error,
            seconds=round(res.duration, 3),
        )
        now = self.clock.now()
        self._carry_out(
            ctl,
            ctl.hook_done(
                now,
                ok=res.ok,
                rc=res.rc,
                error=res.error,
                output=res.output,
                duration=res.duration,
            ),
        )
        self._kick.set()

    async def _victims_hold(self, h: RunHook) -> str:
        """Before a scale-in hook: each victim's own answer, now, to what it holds
        (running, queued, being offered or migrated away), not the gossiped report that
        made it ready, which may predate a task submitted to it since (found by the
        chaos suite's `elastic` scenario: a task accepted by a victim right after its
        drain was still being offered away when its hook ran). "" when every victim
        is drained and holds nothing; else why the hook must not run now."""
        for n in h.env.get("SWARM_SCALE_NODES", "").split():
            try:
                if n == self.node:
                    ans = self._work()
                else:
                    ans = await self.cluster.request(
                        n, {"op": "scale-work", "pool": h.pool}, timeout=DRAIN_TIMEOUT
                    )
            except (TransportError, RemoteError, RequestError) as e:
                return f"victim {n} did not say what it holds: {e}"
            work = ans.get("work") if isinstance(ans, dict) else None
            if not isinstance(work, int) or isinstance(work, bool):
                return f"victim {n} did not say what it holds"
            if work > 0:
                return f"victim {n} still holds {work} tasks"
            homing = ans.get("homing", 0)
            if isinstance(homing, int) and not isinstance(homing, bool) and homing > 0:
                # it acknowledges those tasks' results: removing it would strand them
                return f"victim {n} is still the home of {homing} unfinished tasks"
            if ans.get("draining") is not True:
                return f"victim {n} is no longer drained"
        return ""

    def _work(self) -> dict[str, Any]:
        """What this node holds now: the ledger's running and queued tasks (the load
        report's figures) or, when more, the active records that put a task on this
        node, which include a task being offered away (TRANSFERRING: one placed on a
        peer at its submission never enters the ledger) or migrating away; and the
        unfinished tasks it is the home of, wherever they run."""
        r = self.local_report()
        active = self.shares.coord.state.records.active.values()
        here = sum(1 for t in active if t.node == self.node and not t.state.terminal)
        return {
            "work": max(int(r.running + r.queued), here),
            "draining": r.draining,
            "homing": r.homing,
        }

    async def _drain(self, ctl: PoolController, d: Drain) -> None:
        why = f"{d.reason} (asked by {self.node})"
        try:
            if d.node == self.node:
                await self.shares.set_drain(d.on, why)
            else:
                await self.cluster.request(
                    d.node,
                    {"op": "scale-drain", "pool": d.pool, "drain": d.on, "why": d.reason},
                    timeout=DRAIN_TIMEOUT,
                )
        except (TransportError, RemoteError, RequestError) as e:
            # the controller asks again when the node's report does not show the drain
            self.log.warning("scale.drain_failed", pool=d.pool, node=d.node, on=d.on, error=str(e))
            return
        self.log.info("scale.drain", pool=d.pool, node=d.node, on=d.on, reason=d.reason)

    # ---------------------------------------------------------------- inputs

    def on_event(self, e: Event) -> None:
        now = self.clock.now()
        if isinstance(e, AppMessage):
            ctl = self.pools.get(e.key)
            if ctl is not None:
                ctl.on_announce(e.payload, now)
        elif isinstance(e, AppState) and isinstance(e.state, dict):
            for key, ctl in self.pools.items():
                payload = e.state.get(key)
                if payload is not None:
                    ctl.on_announce(payload, now)

    async def rpc_drain(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        """A pool's actor drains (or undrains) this node for scale-in."""
        try:
            f = wire.Fields(req, "scale-drain", ignore=("op", "v", "from", "to"))
            pool = f.str("pool", required=True, max_len=64)
            on = f.bool("drain", required=True)
            why = f.str("why", "", max_len=400)
            f.done()
        except wire.WireError as e:
            raise RemoteError("bad_request", str(e)) from None
        if f"scale.{pool}" not in self.pools:
            raise RemoteError("not_found", f"no elastic pool {pool!r} is configured here")
        try:
            answer = await self.shares.set_drain(on, f"{why} (asked by {sender})")
        except RequestError as e:
            raise RemoteError(e.code, str(e)) from None
        self.log.info("scale.drained_by_peer", pool=pool, by=sender, on=on)
        return {"shares": answer.get("shares")}

    async def rpc_work(self, req: dict[str, Any], sender: m.NodeId, stream: Any) -> dict[str, Any]:
        """A pool's actor asks this scale-in victim, right before its hook, what it
        holds now (tasks running, queued or being offered away) and whether it is
        still drained."""
        try:
            f = wire.Fields(req, "scale-work", ignore=("op", "v", "from", "to"))
            pool = f.str("pool", required=True, max_len=64)
            f.done()
        except wire.WireError as e:
            raise RemoteError("bad_request", str(e)) from None
        if f"scale.{pool}" not in self.pools:
            raise RemoteError("not_found", f"no elastic pool {pool!r} is configured here")
        return self._work()

    async def op_scale(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        """`swarm scale status`: every pool as this node sees it."""
        f.done()
        if cred.uid != 0 and cred.uid != os.getuid():
            raise RequestError(
                "permission_denied", "only root or the agent's user may read scale status"
            )
        now = self.clock.now()
        return {"node": self.node, "pools": [c.status(now) for c in self.pools.values()]}
