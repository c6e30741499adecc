"""The migration side of a node: the decision loop, the driver's hooks, the peer RPC.

Every few seconds the loop measures what the policy needs from the real node (each
running task's state size and, for CRIU, its memory; suspects from membership) and
hands it to the pure books (node/movebook.py, node/departures.py), which decide with
policy.migration and say which moves to start; each move is driven by movesource.py,
its state streamed by statestream.py. Decisions go to `swarm explain`, outcomes to
the task's migration records (`swarm status`) and counters (`swarm info`).

The process was stopped before its state is sent and never restarts here unless the
move did not happen, and the target runs it only after the home committed it there:
there is never a copy running twice, and until the commit there is always a complete
copy of the state where the task will run. (The phases: node/moves.py.)

The `migrate` peer RPC (route in routes.py) serves both ends: prepare, the state
stream, abort and started (target/source), record and records (the task's home).
"""

from __future__ import annotations

import os
import secrets
import signal as _signal
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import psutil
import trio

from .. import model as m
from .. import wire
from ..cluster import migrate as mx
from ..logs import NULL_LOG, EventLog
from ..node import events as ev
from ..node import moves as mv
from ..node.config import profile_settings
from ..node.departures import candidates
from ..node.movebook import Moves
from ..node.moves import Arrival, Incoming, MoveInstruction, MoveSettings, Outgoing
from ..policy import migration as pol
from . import criu as criu_rt
from .executor import ProcessPlan
from .journal import DelKV, PutKV
from .journal import Event as JEvent
from .movesource import MoveSource
from .net import FramedStream, TransportError
from .peers import RemoteError
from .statestream import dir_size, has_state, receive_state, remove_tree
from .tasks import UnknownTask

if TYPE_CHECKING:
    from ..config import Config
    from .clock import Clock
    from .driver import Driver

MM = m.MigrateMode


def parse_signal(name: str) -> int:
    """SIGUSR1, USR1 or a number; ValueError for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        num = int(text)
        if not 0 < num < _signal.NSIG:
            raise ValueError(f"no signal number {num}")
        return num
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(_signal.Signals[text])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def settings_for(config: Config) -> MoveSettings:
    """From the agent's options; the profile's timings (local: tests, loopback demos,
    fast)."""
    t = profile_settings(config.profile).migration
    policy = pol.MigrationConfig(
        default_bandwidth=config.bandwidth,
        dry_run=config.migration == "dry-run",
        cooldown=t.cooldown,
        rate=t.rate,
        burst=2.0,
        max_report_age=t.max_report_age,
    )
    return MoveSettings(
        mode=config.migration,
        policy=policy,
        period=t.period,
        checkpoint_signal=parse_signal(config.checkpoint_signal),
        checkpoint_timeout=config.checkpoint_timeout,
        default_pause=t.default_pause,
        rpc_timeout=t.rpc_timeout,
        move_timeout=t.move_timeout,
        staged_ttl=t.staged_ttl,
    )


class Migrator:
    """The migration side (driver.MoveHooks, built by the driver through startup's
    migrator_factory)."""

    def __init__(
        self,
        coord: Driver,
        settings: MoveSettings,
        *,
        clock: Clock,
        criu: criu_rt.CriuStatus | None = None,
        owner_of: Callable[[m.TaskSpec], tuple[int, int] | None] | None = None,
        log: EventLog = NULL_LOG,
    ) -> None:
        self.coord = coord
        self.clock = clock
        self.s = settings
        self.criu = criu or criu_rt.CriuStatus(False, "not detected yet")
        self.log = log
        # the task's user on this node (uid, gid) for received state
        self.owner_of: Callable[[m.TaskSpec], tuple[int, int] | None] = owner_of or (
            lambda spec: None
        )
        self.book = Moves(
            coord.node, settings, located_here=self._located_here, token=secrets.token_hex(3)
        )
        self.source = MoveSource(
            coord,
            self.book,
            settings,
            clock=clock,
            log=log,
            criu=lambda: self.criu,
            carry_out=self.carry_out,
            spawn=self._spawn,
        )
        self._nursery: trio.Nursery | None = None
        self._in_round = False  # a decision round is running (rounds never overlap)

    @property
    def node(self) -> m.NodeId:
        return self.coord.node

    # the books, as `swarm info` and retention read them
    @property
    def outgoing(self) -> dict[m.TaskId, Outgoing]:
        return self.book.outgoing

    @property
    def incoming(self) -> dict[m.TaskId, Incoming]:
        return self.book.incoming

    @property
    def arrivals(self) -> dict[m.TaskId, Arrival]:
        return self.book.arrivals

    @property
    def retained(self) -> dict[m.TaskId, tuple[str, float]]:
        return self.book.retained

    @property
    def counters(self) -> Counter[str]:
        return self.book.counters

    def restore(self, kv: dict[str, Any]) -> None:
        self.carry_out(self.book.restore(kv))

    def set_criu(self, status: criu_rt.CriuStatus) -> None:
        """CRIU's start-up check came back (it runs after construction: it is async)."""
        self.criu = status

    def _located_here(self, tid: m.TaskId) -> bool:
        d = self.coord
        if tid in d.runner.running or tid in d.runner.queue or tid in d.state.guest.entries:
            return True
        t = d.table.active.get(tid)
        return t is not None and t.node == self.node

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------- instructions

    def carry_out(self, instrs: list[MoveInstruction]) -> None:
        """The books' instructions, in order (none of them awaits)."""
        for i in instrs:
            if isinstance(i, ev.Persist):
                self.coord.journal.enqueue([_kv(o) for o in i.ops])
            elif isinstance(i, ev.Log):
                getattr(self.log, i.level)(i.event, **dict(i.fields))
            elif isinstance(i, mv.RemoveState):
                self.coord.state.note_state(i.task_id, False)
                # a tree can be big: a worker thread. Most tasks never made one: one
                # lstat here saves them the thread round trip
                path = self.coord.runner.state_dir_of(i.task_id)
                if os.path.lexists(path):
                    self._spawn(trio.to_thread.run_sync, remove_tree, path)
            elif isinstance(i, mv.TellSource):
                self._spawn(self._tell, i.source, "started", i.task_id, i.mid, 5.0)
            elif isinstance(i, mv.AbortAt):
                self._spawn(self._tell, i.target, "abort", i.task_id, i.mid, 3.0)
            elif isinstance(i, mv.StoreRecord):
                rec = JEvent(i.at, "migration", i.task_id, self.node, i.record)
                self.coord.journal.enqueue([rec])
            elif isinstance(i, mv.SendRecord):
                self._spawn(self._send_record, i.home, i.task_id, i.record)
            elif isinstance(i, mv.NoteDecision):
                self.coord.record_explain(i.task_id, i.record)
            elif isinstance(i, mv.PutBack):
                self.source.put_back(i.task_id, i.cause)

    async def _tell(self, node: m.NodeId, kind: str, tid: m.TaskId, mid: str, t: float) -> None:
        """Best effort: "started" (the source deletes its copy after a while anyway),
        "abort" (what the target staged expires anyway)."""
        if self.coord.cluster is None:
            return
        try:
            await self.coord.cluster.request(
                node, {"op": "migrate", "kind": kind, "id": tid, "mid": mid}, t
            )
        except (TransportError, RemoteError):
            pass

    async def _send_record(self, home: m.NodeId, tid: m.TaskId, rec: dict[str, Any]) -> None:
        assert self.coord.cluster is not None
        for attempt in range(4):
            try:
                await self.coord.cluster.request(
                    home, {"op": "migrate", "kind": "record", "id": tid, "rec": rec}, 5.0
                )
                return
            except (TransportError, RemoteError) as e:
                if attempt == 3:
                    self.log.warning("migration.record_lost", task=tid, home=home, error=str(e))
                await trio.sleep(1.0 + 2.0 * attempt)

    # ------------------------------------------------------------- the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # its peer route (`migrate`) is in runtime/routes.py, installed by the agent
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def round_due(self) -> None:
        """The node's timers say a round is due (every `period`, node/timers.py): expire
        stale moves, then decide, unless the last round is still going."""
        self.carry_out(self.book.expire(self.clock.now()))
        if self.s.mode == "off" or self.coord.cluster is None or self._in_round:
            return
        if self._nursery is not None:
            self._in_round = True
            self._nursery.start_soon(self._round_guarded)

    async def _round_guarded(self) -> None:
        try:
            await self.round()
        except Exception as e:  # a bug here must not stop the agent
            self.log.exception("migration.round_failed", e)
        finally:
            self._in_round = False

    async def round(self) -> list[pol.MigrationDecision]:
        """One decision round; returns the decisions (for tests and dry runs)."""
        now = self.clock.now()
        pairs = await self._running(now)
        if not pairs:
            return []
        state = self.coord.state
        local = state.local_report(self.clock.wall())
        cands = candidates(state.view, state.d, state.rng, self.node, now)
        ms = self.coord.cluster.membership if self.coord.cluster is not None else None
        suspects = frozenset(
            mb.node for mb in (ms.members() if ms else []) if mb.state is m.MemberState.SUSPECT
        )
        plan = self.book.plan(pairs, local, cands, suspects, now)
        self.carry_out(plan.instructions)
        for s in plan.starts:
            self._spawn(self.source.migrate, s, local)
        return plan.decisions

    async def _running(self, now: float) -> list[tuple[m.Task, pol.RunningTask]]:
        out = []
        for tid in list(self.coord.runner.running):
            t = self.coord.table.active.get(tid)
            if t is not None and self.book.eligible(t, self.coord.state.guest):
                out.append((t, await self._running_task(t, now)))
        return out

    async def _running_task(self, t: m.Task, now: float) -> pol.RunningTask:
        size = 0
        if mv.keeps_state(t.spec):
            size = await trio.to_thread.run_sync(dir_size, self.coord.runner.state_dir_of(t.id))
        if t.spec.migrate is MM.CRIU:
            size += self._memory_of(t.id)  # the image is about the size of its memory
        return self.book.running_task(t, now, self.clock.wall(), size)

    def _memory_of(self, tid: m.TaskId) -> int:
        handle = self.coord.runner.executor.running.get(tid)
        if handle is None:
            return 0
        try:
            p = psutil.Process(handle.pid)
            return int(sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]))
        except (psutil.Error, OSError):
            return 0

    # ------------------------------------------------------------- the driver's hooks

    def on_started(self, task: m.Task) -> None:
        self.carry_out(self.book.on_started(task, self.clock.now(), self.clock.wall()))

    def on_stopped(self, task: m.Task) -> None:
        """The runner recorded RUNNING -> MIGRATING (restarts here unless it moves)."""
        self.carry_out(self.book.on_stopped(task))

    def on_ended(self, task: m.Task) -> None:
        self.carry_out(self.book.forget(task.id))

    def on_left(self, tid: m.TaskId) -> None:
        """The task no longer lives here: its state goes too, unless a move keeps it."""
        self.carry_out(self.book.on_left(tid))

    async def cancel(self, tid: m.TaskId, cause: str) -> None:
        """Cancel a task stopped for a migration (MIGRATING here)."""
        await self.source.cancel(tid, cause)

    def holds_state(self, t: m.Task) -> bool:
        """Is a task's state directory here (a disk read: the driver asks when a task
        comes to be queued here and tells the node's state, which decides with it)."""
        return mv.keeps_state(t.spec) and has_state(self.coord.runner.state_dir_of(t.id))

    def plan_hook(self, task: m.Task, plan: ProcessPlan) -> ProcessPlan:
        """A task that arrived with a CRIU image starts by restoring it (once)."""
        arr, instrs = self.book.restore_image(task.id)
        if arr is None:
            return plan
        self.carry_out(instrs)
        images = self.coord.runner.state_dir_of(task.id) / criu_rt.CRIU_DIR
        if not self.criu.ok or not images.is_dir():
            return plan  # the task starts afresh from its command
        argv = criu_rt.restore_argv(
            self.criu.path, images, arr.files, plan.argv, uid=plan.uid, gid=plan.gid, cwd=plan.cwd
        )
        return attrs.evolve(plan, argv=tuple(argv), uid=None, gid=None, groups=None)

    async def records_of(self, tid: m.TaskId) -> list[dict[str, Any]]:
        """The task's migrations as its home knows them (oldest first)."""
        parts = await self.coord.journal.events_for(tid, "migration")
        return self.book.records(tid, parts)

    # ------------------------------------------------------------- RPC (all roles)

    async def rpc(
        self, req: dict[str, Any], sender: m.NodeId, stream: FramedStream
    ) -> dict[str, Any] | None:
        kind = req.get("kind")
        if kind == "prepare":
            f = wire.Fields(req, "migrate prepare", ignore=("v", "op", "from", "kind"))
            prep = wire.decode_with(mx.prepare_from_wire, f.map("prep", required=True))
            f.done()
            reply, instrs = self.book.prepare(
                prep,
                sender,
                self.clock.now(),
                admission_refusal=self.coord.admission_refusal,
                local_report=lambda: self.coord.state.local_report(self.clock.wall()),
            )
            self.carry_out(instrs)
            return reply
        if kind == "state":
            await self._on_state(req, sender, stream)
            return None
        f = wire.Fields(req, "migrate", ignore=("v", "op", "from", "kind"))
        tid = f.task_id("id", required=True)
        if kind == "abort":
            mid = f.str("mid", required=True, max_len=300)
            f.done()
            self.carry_out(self.book.abort(tid, mid, sender))
            return {"ok": True}
        if kind == "record":
            rec = mx.check_record(f.map("rec", required=True))
            f.done()
            if not isinstance(rec.get("mid"), str):
                raise wire.SchemaError("migrate record: missing mid")
            try:
                t = await self.coord.table.get(tid)
            except UnknownTask:
                return {"ok": False, "reason": "unknown task"}
            if t.spec.home not in ("", self.node):
                return {"ok": False, "reason": "not this task's home"}
            self.carry_out([self.book.store_record(tid, rec, self.clock.wall())])
            return {"ok": True}
        if kind == "records":
            f.done()
            return {"records": await self.records_of(tid)}
        if kind == "started":
            mid = f.str("mid", required=True, max_len=300)
            f.done()
            self.carry_out(self.book.started_there(tid, mid))
            return {"ok": True}
        raise wire.SchemaError(f"migrate: unknown kind {kind!r}")

    async def _on_state(self, req: dict[str, Any], sender: m.NodeId, stream: FramedStream) -> None:
        f = wire.Fields(req, "migrate state", ignore=("v", "op", "from", "kind"))
        begin = wire.decode_with(mx.begin_from_wire, f.map("begin", required=True))
        f.done()
        tid = begin.task_id
        inc = self.book.prepared(begin, sender)
        if inc is None:
            await stream.send({"ok": False, "reason": "no prepared migration of this task here"})
            return
        t0 = self.clock.now()
        self.log.info("migration.receiving", task=tid, source=sender, bytes=begin.total)
        try:
            nbytes, t_install = await receive_state(
                stream,
                begin,
                root=self.coord.runner.task_state_root,
                final=self.coord.runner.state_dir_of(tid),
                owner=lambda: self.owner_of(inc.spec),
                clock=self.clock,
            )
        except (wire.WireError, TransportError, OSError) as e:
            self.counters["streams_failed"] += 1
            self.log.warning("migration.receive_failed", task=tid, source=sender, error=str(e))
            if not isinstance(e, TransportError):
                try:
                    await stream.send({"ok": False, "reason": str(e)[:500]}, timeout=5.0)
                except TransportError:
                    pass
            return
        now = self.clock.now()
        self.coord.state.note_state(tid, True)  # the task will restart here from it
        self.carry_out(self.book.staged(inc, begin, sender, nbytes, now, self.clock.wall()))
        secs = now - t0
        self.log.info(
            "migration.received",
            task=tid,
            source=sender,
            bytes=nbytes,
            secs=round(secs, 4),
            install_s=round(self.clock.now() - t_install, 4),
        )
        await stream.send({"ok": True, "bytes": nbytes, "seconds": secs}, timeout=10.0)


def _kv(o: ev.Put | ev.Delete) -> PutKV | DelKV:
    return PutKV(o.key, o.value) if isinstance(o, ev.Put) else DelKV(o.key)
