"""Failover over the wire: adoption notices out and in, and the membership view that
the node's failover rules follow (node/failover.py, cluster/succession.py). A part of
the Driver (driver.py), which holds the fields below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import model as m
from .. import wire
from ..cluster.membership import EventKind, MemberEvent
from ..cluster.succession import GONE, Notice, notice_from_wire, notice_to_wire
from ..logs import EventLog
from ..node import events as ev
from ..node.failover import NOTICES_PER_MESSAGE
from ..node.replicas import ReplicaMsg, replica_msg_from_wire
from ..node.state import NodeState
from .effects import kv_ops
from .journal import DelKV, JournalError, PutKV
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .replicabatch import ReplicaOutbox
from .tasks import TaskTable


@attrs.frozen
class CopyPlan:
    """How many copies a submission gets, the nodes to ask in order (the first k,
    then stand-ins), and the journal entry naming the first k (written with the
    task's record)."""

    k: int
    candidates: tuple[m.NodeId, ...]
    ops: tuple[PutKV | DelKV, ...] = ()


class FailoverIO:
    node: m.NodeId
    state: NodeState
    cluster: ClusterNode | None
    log: EventLog
    rpc_timeout: float
    replica_outbox: ReplicaOutbox
    table: TaskTable
    _replica_inflight: set[tuple[m.NodeId, m.TaskId, str, m.NodeId | None]]

    if TYPE_CHECKING:  # provided by Driver and Effects

        def _time(self) -> tuple[float, float]: ...
        def _next_id(self) -> str: ...
        def run_inline(self, instrs: list[ev.Instruction]) -> None: ...
        def place_soon(self, tid: m.TaskId) -> None: ...
        async def execute(self, instrs: list[ev.Instruction]) -> None: ...

    async def rpc_succession(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        """A peer's adoption notices (node/failover.py); we answer with ours where
        our claim is the larger."""
        raw = req.get("notices")
        if not isinstance(raw, list) or len(raw) > NOTICES_PER_MESSAGE:
            most = NOTICES_PER_MESSAGE
            raise wire.SchemaError(f"succession: field 'notices' must be a list of <= {most}")
        notices = tuple(notice_from_wire(x, self.node) for x in raw)
        now, wall = self._time()
        answers, instrs = self.state.on_notices(sender, notices, now, wall)
        await self.execute(instrs)
        return {"notices": [notice_to_wire(n) for n in answers]}

    async def _send_notices(self, i: ev.SendNotices) -> None:
        """Send adoption notices to one member; its counter-notices come back as its
        notices; one that does not arrive is owed again."""
        answers: tuple[Notice, ...] = ()
        try:
            if self.cluster is None:
                raise TransportError("no cluster")
            req = {"op": "succession", "notices": [notice_to_wire(n) for n in i.notices]}
            raw = await self.cluster.request(i.dest, req, self.rpc_timeout)
            back = raw.get("notices")
            if not isinstance(back, list) or len(back) > NOTICES_PER_MESSAGE:
                raise wire.SchemaError("succession reply: notices must be a short list")
            answers = tuple(notice_from_wire(x, self.node) for x in back)
        except (TransportError, RemoteError, wire.WireError) as e:
            self.log.debug("failover.notice_failed", dest=i.dest, error=str(e))
            now, wall = self._time()
            stimulus = ev.NoticesUndelivered(now, wall, self._next_id(), i.dest, i.notices)
            self.run_inline(self.state.handle(stimulus))
            return
        if answers:
            now, wall = self._time()
            _, instrs = self.state.on_notices(i.dest, answers, now, wall)
            await self.execute(instrs)

    def _members_seen(self, e: MemberEvent) -> None:
        """Failover follows this node's view: each change, and on a join the whole view
        (a member first heard of as dead, after our restart, comes with no event)."""
        now, wall = self._time()
        states = [(e.member.node, e.member.state)]
        mship = self.cluster.membership if self.cluster is not None else None
        stimuli: list[ev.Event] = []
        if e.kind is EventKind.JOINED and mship is not None:
            states += [(mb.node, mb.state) for mb in mship.members()]
            # a holder of our tasks that died while we were down is dead in the view we
            # learn, with no event: its tasks are re-queued here as for a death we saw
            # (chaos home-loss: a restarted home waited for ever on a lost runner)
            for mb in mship.members():
                if mb.node != self.node and mb.state in GONE and self.state.holds_at(mb.node):
                    stimuli.append(ev.NodeDead(now, wall, self._next_id(), mb.node))
        stimuli.insert(0, ev.MembersSeen(now, wall, self._next_id(), tuple(states)))
        self.run_inline(self.state.handle(*stimuli))

    # ------------------------------------------------------------ replicas

    def copy_of(self, tid: m.TaskId) -> m.Task | None:
        """A copy we keep of another home's task, as a record (queued at its home, or
        at the runner it last told us), for `swarm status` when its home is silent."""
        c = self.state.held.get(tid)
        if c is None:
            return None
        t = m.new_task(c.spec, c.spec.submitted_at or 0.0, c.home, cause="submitted")
        t = attrs.evolve(t, node=c.runner or c.home)
        if c.final is None:
            return t
        f = c.final
        end = m.Transition(f.at, t.state, m.TaskState(f.state), f.reason or f.state, t.node)
        return attrs.evolve(
            t,
            state=m.TaskState(f.state),
            exit_code=f.exit_code,
            signal=f.signal,
            reason=f.reason,
            finished_at=f.at,
            history=(*t.history, end),
        )

    async def add_with_copies(self, spec: m.TaskSpec, wall: float) -> int:
        """Journal a plain submission and make its copies (issue 19); how many hold one.

        It is placed (and started, when it runs here) as soon as its record is written,
        during the journal's fsync, and its copies are asked for then too: the answer
        waits for both, the fsync and the copies, which overlap (issue 23: one after
        the other, a lone submission waited for the sum). Who is to hold them is
        journaled with the record. When the fsync fails after the write, the copies
        are still awaited, so that the caller's undo (the task ends cancelled) releases
        them; a write that fails asks for none."""
        plan = self.plan_copies(spec)
        held: list[int] = []
        failed: JournalError | None = None

        async def copy() -> None:
            held.append(await self.replicate(spec, plan))

        async with trio.open_nursery() as n:

            def written(t: m.Task) -> None:
                self.place_soon(t.id)
                if plan.k:
                    n.start_soon(copy)

            try:
                task = m.new_task(spec, wall, self.node)
                await self.table.add(task, extra_ops=plan.ops, on_written=written)
            except JournalError as e:
                failed = e
        if failed is not None:
            if not held:  # its copies never asked for (the write itself failed)
                self.state.copies_given_up(spec.id)
            raise failed
        return held[0] if held else 0

    def plan_copies(self, spec: m.TaskSpec) -> CopyPlan:
        """Who is to hold copies of a submission, chosen before its record is written
        so that the record's commit names them too (node/replicas.py)."""
        mship = self.cluster.membership if self.cluster is not None else None
        live = [mb.node for mb in mship.alive_members()] if mship is not None else []
        k, candidates = self.state.choose_replicas(spec.id, live)
        put = self.state.replicas_planned(spec.id, tuple(candidates[:k])) if k else None
        return CopyPlan(k, tuple(candidates), () if put is None else tuple(kv_ops((put,))))

    async def replicate(self, spec: m.TaskSpec, plan: CopyPlan) -> int:
        """Copies of a just-journaled submission at other nodes (node/replicas.py),
        before its answer: the first k of the rendezvous order that answer (the next
        ones in order stand in for those that do not). Returns how many hold one.
        `plan`: from plan_copies, its entry journaled with the task's record."""
        k, candidates = plan.k, plan.candidates
        if k == 0:
            return 0
        chosen: list[m.NodeId] = []
        asked: list[m.NodeId] = []
        msg = self.state.hold_msg(spec, tuple(candidates[:k]))

        async def one(node: m.NodeId) -> None:
            asked.append(node)
            if await self._replica_rpc(node, msg):
                chosen.append(node)

        if k == 1:  # the usual case: no nursery and no task of its own (issue 23)
            await one(candidates[0])
        else:
            async with trio.open_nursery() as n:
                for node in candidates[:k]:
                    n.start_soon(one, node)
        for node in candidates[k:]:
            if len(chosen) >= k:
                break
            missing = frozenset(x for x in asked if x not in chosen) | {node}
            await self.execute(self.state.stand_in_asked(spec.id, missing))
            await one(node)
        planned = msg.replicas if plan.ops else ()
        unanswered = tuple(x for x in asked if x not in chosen)
        await self.execute(
            self.state.replicas_chosen(spec.id, tuple(chosen), msg.replicas, planned, unanswered)
        )
        if len(chosen) < k:
            self.log.warning("replica.short", task=spec.id, wanted=k, held=len(chosen))
            names = ", ".join(asked)
            why = {"outcome": f"accepted with {len(chosen)} of {k} copies (asked {names})"}
            self.run_inline([self.state.explain(spec.id, why, self._time()[1])])
        return len(chosen)

    async def _replica_rpc(self, node: m.NodeId, msg: ReplicaMsg) -> bool:
        """One replica message, batched with the others to `node` (replicabatch.py)."""
        if self.cluster is None:
            return False
        return await self.replica_outbox.send(node, msg)

    def _send_replica(self, i: ev.SendReplica) -> None:
        """A replica message owed by the reconciling tick; answered: the state notes
        it; not: the next tick sends it again (one in flight per message)."""
        key = (i.dest, i.msg.task_id, i.msg.kind, i.msg.runner)
        if key in self._replica_inflight or self.cluster is None:
            return
        self._replica_inflight.add(key)

        def answered(ok: bool) -> None:
            self._replica_inflight.discard(key)
            if ok:
                self.run_inline(self.state.replica_acked(i.dest, i.msg))

        self.replica_outbox.post(i.dest, i.msg, answered)

    async def rpc_replica(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        """A home's copy of its task, or news of it (node/replicas.py): one message, as
        agents before issue 23's replica batches send."""
        msg = replica_msg_from_wire(req.get("msg"))
        why, instrs = self.state.on_replica(sender, msg)
        await self.execute(instrs)
        return {"ok": why is None, "reason": why}
