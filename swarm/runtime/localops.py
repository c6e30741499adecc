"""The local API's operations (`swarm submit`, `status`, `list`, `cancel`, `wait`,
`info`, `nodes`, `explain`, `shares`, `logs`), and the two peer RPCs that carry a
client's request to a task's home (`cancel`, `explain`).

runtime/api.py speaks the socket protocol and calls these with the request's fields
and the caller's credentials; each checks who may do what (root and the agent's user
see every task, others their own), then reads or changes the node through the parts
it was built with. `TaskAccess` finds the task a request names and checks the
caller; `Shares` changes the node's shares (drain, undrain).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from .. import codec, request_checks, testbreak, wire
from .. import model as m
from ..logs import EventLog
from ..node.backups import won_by
from ..node.topup import copied
from ..policy import feasible
from ..policy.shares import ShareLedger
from .api import Ops, PeerCred, RequestError
from .clock import Clock
from .driver import Driver
from .explainops import ExplainOps
from .groupops import GroupOps
from .isolation import Identities
from .journal import Event, Journal, JournalError, PutKV
from .logread import read_log
from .moving import Migrator
from .net import TransportError
from .peers import ClusterNode, RemoteError
from .queueops import QueueOps
from .runner import LocalRunner
from .taskaccess import TaskAccess, unreachable, user_name
from .tasks import TaskTable, UnknownTask


class LocalOps(ExplainOps, GroupOps):
    def __init__(
        self,
        *,
        node: m.NodeId,
        table: TaskTable,
        journal: Journal,
        runner: LocalRunner,
        ledger: ShareLedger,
        cluster: ClusterNode,
        coord: Driver,
        migrator: Migrator,
        identities: Identities,
        snapshot: Callable[[], dict[str, Any]],
        clock: Clock,
        log: EventLog,
    ) -> None:
        self.node = node
        self.table = table
        self.journal = journal
        self.runner = runner
        self.ledger = ledger
        self.cluster = cluster
        self.coord = coord
        self.migrator = migrator
        self.identities = identities
        self.snapshot = snapshot  # `swarm info`: runtime/stats.py
        self.clock = clock
        self.log = log
        self.accepting = False  # submissions are taken (between start-up and shutdown)
        self.access = TaskAccess(node=node, table=table, cluster=cluster, copy_of=coord.copy_of)
        coord.parent_reader = self.read_parents  # remote parents' ends (node/depends.py)
        self.shares = Shares(node=node, journal=journal, coord=coord, clock=clock)
        self._submitting: set[m.TaskId] = set()  # chosen ids between check and journal
        self.queue_ops = QueueOps(coord, runner, clock)

    def ops(self, extra: dict[str, Any] | None = None) -> Ops:
        """The handlers, by op name, for runtime/api.py (`extra`: other parts' ops)."""
        return Ops(
            unary={
                **(extra or {}),
                "submit": self.op_submit,
                "status": self.op_status,
                "list": self.op_list,
                "cancel": self.op_cancel,
                "wait": self.op_wait,
                "info": self.op_info,
                "nodes": self.op_nodes,
                "explain": self.op_explain,
                "share": self.queue_ops.op_share,
                "shares": self.shares.op_shares,
            },
            stream={"logs": self.op_logs},
        )

    def start_accepting(self) -> None:
        self.accepting = True

    def stop_accepting(self) -> None:
        """Shutdown: new submissions are refused ("agent is shutting down")."""
        self.accepting = False

    def restore(self, kv: dict[str, Any]) -> None:
        """At start-up, from the journal's key-value records."""
        self.shares.restore(kv)

    async def op_submit(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        if not self.accepting:
            raise RequestError("unavailable", "agent is shutting down; not accepting tasks")
        wait_for_node = f.bool("wait_for_node", False)
        spec, member_of = self.queue_ops.submit_spec(f, cred, user_name(cred.uid), self.node)
        refusal = self.identities.submit_refusal(cred.uid, spec.user)
        if refusal is not None:
            raise RequestError("permission_denied", refusal)
        refusal = self.queue_ops.sharing_refusal(spec, cred, member_of)
        if refusal is not None:  # bad input for this user: the CLI exits 2
            raise RequestError("not_allowed", f"submit: {refusal}")
        never = self._unsatisfiable(spec) or self._gang_never_fits(spec)
        if never is not None and not (wait_for_node and spec.constraints):
            more = "; --wait-for-node queues it until one joins" if spec.constraints else ""
            raise RequestError("unsatisfiable", f"submit: {never}{more}")
        spec = await self.resolve_after(spec, cred)
        chosen = "~" in spec.id  # a client's own id (a generated one is new by chance)
        if chosen:
            dup = await self._resubmitted(spec, cred)
            if dup is not None:
                return dup
            self._submitting.add(spec.id)
        try:
            return await self._accept(spec)
        finally:
            self._submitting.discard(spec.id)

    def _unsatisfiable(self, spec: m.TaskSpec) -> str | None:
        """Why no live member could ever run `spec` (policy.feasible, from the gossiped
        capacities and our own); None while one might, or while we have seeds but
        have not reached anyone yet (the members we do not know could fit it)."""
        if not feasible.asks_for_something(spec):
            return None  # asks for nothing a node could lack (the common, fast case)
        ms = self.cluster.membership
        if ms is None or (self.cluster.seed_addrs and ms.num_live <= 1):
            return None
        s, view = self.coord.sample, self.coord.view
        own = feasible.NodeCapacity(
            self.node, s.cpus, s.mem_total, self.coord.gpus.summary(), self.coord.state.labels
        )
        peers = (
            None if (e := view.get(mb.node)) is None else feasible.NodeCapacity.of(e.report)
            for mb in ms.alive_members()
            if mb.node != self.node
        )
        return feasible.unsatisfiable(spec, own, peers)

    async def _accept(self, spec: m.TaskSpec) -> dict[str, Any]:
        if testbreak.broken("drop-acked") and spec.id[-1] in "0123":  # TEST-ONLY: chaos self-test
            return {"id": spec.id}
        try:
            if spec.is_global:
                await self.coord.globals_io.add(spec)
                return {"id": spec.id, "global": True}
            if not copied(spec):
                # waits for its parents (node/depends.py), then creates its elements
                # (node/arrays.py) or its gang's rounds (node/gangs.py), all here: no
                # copies elsewhere (an array or a gang needs its home)
                start = (
                    self.coord.deps_submitted
                    if spec.after
                    else self.coord.array_submitted
                    if spec.array
                    else self.coord.gang_submitted
                )
                await self.table.add(
                    m.new_task(spec, self.clock.wall(), self.node),
                    on_written=lambda t: start(t.id),
                )
                return {"id": spec.id}
            copies = await self.coord.add_with_copies(spec, self.clock.wall())
        except JournalError as e:
            await self._unaccept(spec.id, f"journal write failed: {e}")
            raise RequestError("journal", f"task not accepted: journal write failed: {e}") from None
        return {"id": spec.id, "replicas": copies}

    async def _resubmitted(self, spec: m.TaskSpec, cred: PeerCred) -> dict[str, Any] | None:
        """A chosen id seen before (in memory or in the journal: a record is never
        overwritten by a new submission): the same submission again from its owner is
        a duplicate; anything else is refused without saying what the record holds."""
        try:
            existing = await self.table.get(spec.id)
        except UnknownTask:
            if spec.id in self._submitting:
                raise RequestError(
                    "conflict", f"task id {spec.id} is being submitted already"
                ) from None
            return None
        if existing.spec.uid != cred.uid:
            # never the owner's: ids are namespaced by user name, so only a uid that
            # lost its name (or a reused name) gets here; say nothing of the record
            raise RequestError("conflict", f"task id {spec.id} is taken")
        if not m.same_submission(existing.spec, spec):
            raise RequestError("conflict", f"task id {spec.id} already used for another task")
        return {"id": spec.id, "duplicate": True}

    async def _unaccept(self, tid: m.TaskId, why: str) -> None:
        """A submission whose record was written but not synced (the fsync failed) may
        be placed or running already: the submitter is told it was not accepted, so it
        must not run. It ends cancelled, which the journal retries until it lands."""
        t = self.table.get_cached(tid)
        if t is None or t.state.terminal:
            return
        self.log.warning("submit.unaccepted", task=tid, reason=why)
        with trio.move_on_after(30):
            await self.cancel_task(t, f"not accepted: {why}")

    async def op_status(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self.access.task(f, cred)
        note = self.access.unanswered.pop(t.id, None)
        f.done()
        self.access.authorize(t, cred)
        out = {"task": codec.task_to_wire(t), "migrations": await self._migrations(t)}
        if t.spec.array:
            out["elements"] = self.coord.state.array_counts(t.id) or {}
        if note is not None:
            out["note"] = note
        return out

    async def _migrations(self, t: m.Task) -> list[dict[str, Any]]:
        """The task's migrations, as its home recorded them."""
        if t.spec.home in ("", self.node) or t.spec.is_global:
            return await self.migrator.records_of(t.id)
        try:
            r = await self.cluster.request(
                t.spec.home, {"op": "migrate", "kind": "records", "id": t.id}, timeout=5.0
            )
        except (TransportError, RemoteError):
            return []
        recs = r.get("records")
        return [x for x in recs if isinstance(x, dict)] if isinstance(recs, list) else []

    async def op_list(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        show_all = f.bool("all", False)
        expand = f.bool("expand", False)
        limit = f.int("limit", 1000, lo=1, hi=100_000)
        f.done()
        tasks = sorted(self.table.active.values(), key=lambda t: (t.created_at, t.id))
        if show_all:
            finished = list(self.table.finished.values())[-limit:]
            if len(finished) < limit:
                seen = {t.id for t in finished}
                older = await self.journal.recent_terminal(limit)
                finished = [t for t in older if t.id not in seen][
                    : limit - len(finished)
                ] + finished
            tasks = sorted(finished, key=lambda t: (t.created_at, t.id)) + tasks
        if not self.access.operator(cred):  # others' tasks (argv, env) are not yours to see
            name = user_name(cred.uid)
            tasks = [t for t in tasks if self.access.owns(t, cred, name)]
        tasks = tasks[-limit:]
        classes = dict(self.queue_ops.sharing.classes)
        return {"tasks": self._listed(tasks, expand), "classes": classes}

    async def op_cancel(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self.access.task(f, cred)
        f.done()
        self.access.authorize(t, cred)
        if t.state.terminal and not t.spec.is_global:
            raise RequestError("finished", f"task {t.id} already {t.state.value}")
        t = await self.cancel_task(t, f"cancelled by uid {cred.uid}")
        return {"task": codec.task_to_wire(t)}

    async def cancel_task(self, t: m.Task, cause: str) -> m.Task:
        S = m.TaskState
        if t.spec.is_global:
            await self.coord.globals_io.remove(t.id)
            with trio.move_on_after(10):
                while True:
                    local = self.table.get_cached(t.id)
                    if local is None or local.state.terminal:
                        break
                    await self.table.wait_change(t.id)
            return self.table.get_cached(t.id) or t
        if (t.spec.array or t.spec.gang is not None) and t.spec.home == self.node:
            return await self.cancel_group(t, cause)
        if t.spec.home != self.node:
            try:
                r = await self.cluster.request(
                    t.spec.home, {"op": "cancel", "id": t.id}, timeout=35.0
                )
            except TransportError as e:
                raise unreachable(t, "cancel it", e) from None
            return codec.task_from_wire(r["task"])
        if t.node == self.node and t.id in self.runner.running:
            await self.runner.cancel(t.id, cause)
            return await self.table.wait_terminal(t.id)
        if t.node == self.node and t.state is S.QUEUED:
            try:
                self.runner.queue.remove(t.id)
            except ValueError:
                pass
            self.ledger.remove(t.id)
            return await self.table.change_durably(t.id, S.CANCELLED, cause)
        if t.node == self.node and t.state is S.MIGRATING:
            await self.migrator.cancel(t.id, cause)
            with trio.move_on_after(30):
                return await self.table.wait_terminal(t.id)
            return await self.table.get(t.id)
        await self.coord.cancel_remote(t.id)
        with trio.move_on_after(30):
            return await self.table.wait_terminal(t.id)
        return await self.table.get(t.id)

    async def rpc_cancel(
        self, req: dict[str, Any], sender: m.NodeId, stream: Any
    ) -> dict[str, Any]:
        tid = request_checks.check_task_id(req.get("id"))
        try:
            t = await self.table.get(tid)
        except UnknownTask:
            raise RemoteError("not_found", f"no task {tid}") from None
        if not t.state.terminal:
            t = await self.cancel_task(t, f"cancelled via {sender}")
        return {"task": codec.task_to_wire(t)}

    async def op_wait(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self.access.task(f, cred)
        timeout = f.float("timeout", None, lo=0.0)
        f.done()
        self.access.authorize(t, cred)
        timed_out = True
        with trio.move_on_after(float("inf") if timeout is None else timeout):
            if t.spec.home in ("", self.node) or t.spec.is_global:
                t = await self.table.wait_terminal(t.id)
            else:
                while not t.state.terminal:
                    await trio.sleep(0.5)
                    t = await self.access.find(t.id)
            timed_out = False
        return {"task": codec.task_to_wire(t), "timed_out": timed_out}

    async def op_info(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        f.done()
        return self.snapshot()

    async def op_nodes(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        f.done()
        ms = self.cluster.membership
        now = self.clock.now()
        out = []
        if ms is not None:
            loads = ms.load_view()
            for mb in sorted(ms.members(), key=lambda x: x.node):
                entry = loads.get(mb.node)
                load = None if entry is None else codec.load_report_to_wire(entry.report)
                if load is not None:
                    load["data"] = load["data"].hex()  # the Bloom digest, as JSON can hold it
                out.append(
                    {
                        **codec.member_to_wire(mb),
                        "self": mb.node == self.node,
                        "load": load,
                        "load_age": None if entry is None else max(0.0, now - entry.received_at),
                    }
                )
        return {"nodes": out}

    async def op_logs(self, f: wire.Fields, cred: PeerCred) -> AsyncIterator[dict[str, Any]]:
        t = await self.access.task(f, cred)
        which = f.str("stream", "stdout")
        if which not in ("stdout", "stderr"):
            raise wire.SchemaError("logs: stream must be stdout or stderr")
        follow = f.bool("follow", False)
        offset = f.int("offset", 0, lo=0)
        f.done()
        self.access.authorize(t, cred)
        if t.spec.gang is not None or t.spec.array:  # runs nothing itself
            what = (
                f"a gang: its members' logs are {t.id.partition('~')[0]}.RANK"
                if t.spec.gang is not None
                else f"an array: its elements' logs are {t.id.partition('~')[0]}[INDEX]"
            )
            raise RequestError("invalid", f"logs: {t.id} is {what}")
        backup = won_by(t)
        if backup is not None:  # its result is its backup's, and so is its output
            t = await self.access.find(backup)
            self.access.authorize(t, cred)
        where = t.node or self.node
        if where == self.node or t.spec.is_global:
            out, err = self.runner.log_paths(t.id)
            path = out if which == "stdout" else err

            async def current() -> m.Task | None:
                try:
                    return await self.table.get(t.id)
                except UnknownTask:
                    return None

            async for part in read_log(path, offset, follow, current, self.table):
                yield part
            return
        async for part in self._remote_logs(t, where, which, follow, offset):
            yield part

    async def _remote_logs(
        self, t: m.Task, where: m.NodeId, which: str, follow: bool, offset: int
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await self.cluster.open_stream(
                where,
                {"op": "logs", "id": t.id, "stream": which, "follow": follow, "offset": offset},
            )
        except TransportError as e:
            raise RequestError(
                "unavailable", f"cannot reach {where} for the logs of {t.id}: {e}"
            ) from None
        async with stream:
            stream.timeout = float("inf")
            while True:
                try:
                    part = await stream.receive(timeout=float("inf") if follow else 30.0)
                except TransportError as e:
                    raise RequestError(
                        "unavailable", f"log stream from {where} broke: {e}"
                    ) from None
                if not isinstance(part, dict):
                    return
                yield part
                if not part.get("more"):
                    return


class Shares:
    """`swarm shares`/`drain`/`undrain`: the node's shares, journaled (the rules are
    node/shares.py's)."""

    def __init__(
        self,
        *,
        node: m.NodeId,
        journal: Journal,
        coord: Driver,
        clock: Clock,
    ) -> None:
        self.node = node
        self.journal = journal
        self.coord = coord
        self.clock = clock
        self.changes = coord.state.share_changes
        self._lock = trio.Lock()

    def restore(self, kv: dict[str, Any]) -> None:
        self.changes.restore(kv)

    async def op_shares(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        # One change at a time: the journal's order of changes is then the order they
        # were asked in (the state's sequence numbers keep the ledger right anyway).
        async with self._lock:
            return await self._change_shares(f, cred)

    async def _change_shares(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        value = f.int("shares", None, lo=0, hi=1 << 31)
        drain = f.bool("drain", False)
        undrain = f.bool("undrain", False)
        f.done()
        if drain and (undrain or value is not None):
            raise wire.SchemaError("shares: drain takes no other field")
        changing = drain or undrain or value is not None
        if changing and cred.uid != 0 and cred.uid != os.getuid():
            raise RequestError(
                "permission_denied", "only root or the agent's user may change shares"
            )
        return await self._apply(value, drain, undrain, "shares")

    async def set_drain(self, on: bool, why: str) -> dict[str, Any]:
        """Drain or undrain at a peer's request (the autoscaler's scale-in: issue 25),
        journaled like `swarm drain`; `why` goes into the journal's event."""
        async with self._lock:
            return await self._apply(None, on, not on, why)

    async def _apply(
        self, value: int | None, drain: bool, undrain: bool, why: str
    ) -> dict[str, Any]:
        change = self.changes.decide(value, drain, undrain)
        if change is None:
            return self.changes.answer()
        note: dict[str, Any] = {"old": change.old, "new": change.new}
        if why != "shares":
            note["why"] = why
        try:
            await self.journal.commit(
                [
                    *(PutKV(o.key, o.value) for o in change.ops),
                    Event(self.clock.wall(), "shares", None, self.node, note),
                ]
            )
        except JournalError as e:
            self.changes.failed(change.seq)
            raise RequestError(
                "journal", f"shares not changed: journal write failed: {e}"
            ) from None
        self.coord.run_inline(self.changes.landed(change.seq))
        return self.changes.answer()
