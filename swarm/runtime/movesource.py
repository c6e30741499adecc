"""One migration, driven from its source: the mechanics of each phase.

The phases and what each one's failure means are data in node/moves.py (`Phase`,
`ENDINGS`); the books in node/movebook.py. Here: ask the target to prepare (peer
RPC), stop the task (the checkpoint signal, a terminate, or a CRIU dump), stream its
state (statestream.py), move its location through the handoff protocol (the driver's
public offer and apply), and put a stopped task back into this node's run queue when
its move did not happen. The order makes every failure harmless: the task is stopped
only after the target agreed, the target runs it only after the home committed it
there, and until then a complete copy of its state stays here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import model as m
from ..cluster import handoff as h
from ..cluster import migrate as mx
from ..logs import EventLog
from ..node.movebook import Moves
from ..node.moves import ENDINGS, AbortAt, MoveInstruction, MoveSettings, Outgoing, Phase, Start
from . import criu as criu_rt
from .clock import Clock
from .net import TransportError
from .peers import RemoteError
from .statestream import MigrationError, read_entries, remove_tree, send_state

if TYPE_CHECKING:
    from .driver import Driver

S = m.TaskState
MM = m.MigrateMode


class MoveSource:
    def __init__(
        self,
        driver: Driver,
        book: Moves,
        settings: MoveSettings,
        *,
        clock: Clock,
        log: EventLog,
        criu: Callable[[], criu_rt.CriuStatus],
        carry_out: Callable[[list[MoveInstruction]], None],
        spawn: Callable[..., None],
    ) -> None:
        self.driver = driver
        self.book = book
        self.s = settings
        self.clock = clock
        self.log = log
        self.criu = criu
        self.carry_out = carry_out
        self.spawn = spawn

    async def migrate(self, s: Start, local: m.LoadReport) -> None:
        """Drive one move to its end, whatever happens; its record goes to the home."""
        tid = s.task.id
        rec, instrs = self.book.begin(s, self.clock.wall())
        self.carry_out(instrs)
        try:
            outcome, detail = await self._drive(s, local, rec)
        except Exception as e:  # a bug must never lose the task: it restarts here
            self.log.exception("migration.internal_error", e, task=tid)
            outcome, detail = self._end(
                s.out,
                tid,
                "internal-error",
                f"internal error: {type(e).__name__}: {e}",
                cause="migration failed (internal error): runs here again",
            )
        except BaseException:
            self.book.outgoing.pop(tid, None)
            raise
        self.carry_out(self.book.finish(s, rec, outcome, detail, self.clock.wall()))

    def _end(
        self, out: Outgoing, tid: m.TaskId, kind: str, detail: str, cause: str = ""
    ) -> tuple[str, str]:
        """(outcome, detail) of a move that ends as `kind` (ENDINGS): the target is told
        to drop what it staged, and the task put back here (`cause`), where that kind
        says so."""
        ending = ENDINGS[kind]
        if ending.abort_target:
            self.carry_out([AbortAt(out.target, tid, out.mid)])
        if ending.put_back:
            self.put_back(tid, cause)
        return ending.outcome, detail

    async def _drive(self, s: Start, local: m.LoadReport, rec: dict[str, Any]) -> tuple[str, str]:
        t, out = s.task, s.out
        tid, target, cluster = t.id, out.target, self.driver.cluster
        assert cluster is not None
        # 1. the target re-checks with its fresh load before anything happens to the task
        prep = self.book.prepare_message(s, local)
        try:
            r = await cluster.request(
                target,
                {"op": "migrate", "kind": "prepare", "prep": mx.prepare_to_wire(prep)},
                self.s.rpc_timeout,
            )
        except (TransportError, RemoteError) as e:
            return self._end(out, tid, "refused", f"{target} did not answer: {e}")
        if not r.get("ok"):
            return self._end(out, tid, "refused", f"{target} refused: {r.get('reason')}")
        # 2. stop it; if it does not stop, it runs on here and nothing else happens
        out.step = Phase.STOP
        t_stop, stopped_at = self.clock.now(), self.clock.wall()
        why = await self._stop(t, out.mode)
        if why is not None:
            return self._end(out, tid, "not-stopped", why)
        rec["stop_s"] = round(self.clock.now() - t_stop, 4)
        if out.cancel is not None:
            return await self._cancel_now(out, tid, out.cancel)
        # 3. the state first: until the target holds all of it, the task restarts here
        out.step = Phase.TRANSFER
        try:
            nbytes, secs = await self._send_state(s, stopped_at)
        except MigrationError as e:
            why = f"migration to {target} failed ({e}): restarts here"
            return self._end(out, tid, "transfer-failed", f"transfer: {e}", cause=why)
        self.book.transferred(out, rec, nbytes, secs)
        if out.cancel is not None:
            return await self._cancel_now(out, tid, out.cancel)
        # 4. move its location; a refusal or failure puts it back in this node's queue
        out.step = Phase.MOVE
        ok, why = await self._move(t, target)
        if not ok:
            if why.startswith("undecided"):
                return self._end(out, tid, "undecided", why)
            return self._end(out, tid, "move-failed", f"move: {why}")
        now = self.clock.now()
        self.carry_out(self.book.moved(tid, out, rec, now - t_stop, now))
        return self._end(out, tid, "moved", f"to {target}")

    async def _cancel_now(self, out: Outgoing, tid: m.TaskId, cause: str) -> tuple[str, str]:
        ended = self._end(out, tid, "cancelled", cause)
        await self.cancelled(tid, cause)
        return ended

    # ------------------------------------------------------------- stop

    async def _stop(self, t: m.Task, mode: m.MigrateMode) -> str | None:
        """Stop the task for its move: None once it is MIGRATING, else why not."""
        tid, runner, table = t.id, self.driver.runner, self.driver.table
        if tid not in runner.running:
            return "it is no longer running"
        runner.migrating[tid] = mode
        if mode is MM.CHECKPOINT:
            if not runner.executor.signal(tid, self.s.checkpoint_signal):
                runner.migrating.pop(tid, None)
                return "its process is gone"
            limit = self.s.checkpoint_timeout
        elif mode is MM.RESTART:
            self.spawn(runner.executor.terminate, tid, "migration (restart)")
            limit = runner.executor.kill_grace + 10.0
        else:
            failed = await self._dump(t)
            if failed is not None:
                runner.migrating.pop(tid, None)
                return failed
            limit = 10.0
        with trio.move_on_after(limit):
            while (cur := table.active.get(tid)) is not None and cur.state is S.RUNNING:
                await table.wait_change(tid)
        cur = table.get_cached(tid)
        if cur is not None and cur.state is S.RUNNING:
            runner.migrating.pop(tid, None)
            return f"it did not stop within {limit:g}s; it runs on here"
        if cur is None or cur.state is not S.MIGRATING:
            return f"it ended by itself ({'gone' if cur is None else cur.state.value})"
        return None

    async def _dump(self, t: m.Task) -> str | None:
        criu = self.criu()
        if not criu.ok:
            return f"no CRIU here: {criu.reason}"
        handle = self.driver.runner.executor.running.get(t.id)
        if handle is None:
            return "its process is gone"
        images = self.driver.runner.state_dir_of(t.id) / criu_rt.CRIU_DIR

        def reset() -> None:
            remove_tree(images)
            images.mkdir(parents=True)

        await trio.to_thread.run_sync(reset)
        argv = criu_rt.dump_argv(criu.path, handle.pid, images)
        try:
            with trio.fail_after(self.s.checkpoint_timeout):
                res = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False
                )
        except trio.TooSlowError:
            return f"CRIU dump took over {self.s.checkpoint_timeout:g}s; it runs on here"
        except OSError as e:
            return f"cannot run CRIU: {e}"
        if res.returncode != 0:
            return f"CRIU dump failed (exit {res.returncode}, see {images}/dump.log)"
        return None

    # ------------------------------------------------------------- transfer

    async def _send_state(self, s: Start, stopped_at: float) -> tuple[int, float]:
        t, rt, out = s.task, s.running, s.out
        cluster, runner = self.driver.cluster, self.driver.runner
        assert cluster is not None
        sdir = runner.state_dir_of(t.id)
        # a restart starts afresh: no state goes along
        entries = [] if out.mode is MM.RESTART else await read_entries(sdir)
        total = sum(e.size for e in entries if isinstance(e, mx.File))
        files: dict[str, str] = {}
        if out.mode is MM.CRIU:
            so, se = runner.log_paths(t.id)
            files = {"1": str(so), "2": str(se)}
        begin = mx.Begin(
            t.id, out.mid, out.mode, len(entries), total, self.driver.node, stopped_at, rt.age,
            rt.moves + 1, files,
        )  # fmt: skip
        t0 = self.clock.now()
        self.log.info("migration.streaming", task=t.id, to=out.target, bytes=total)
        await send_state(cluster, out.target, begin, sdir, entries, timeout=self.s.rpc_timeout)
        return total, self.clock.now() - t0

    # ------------------------------------------------------------- move

    async def _move(self, t: m.Task, target: m.NodeId) -> tuple[bool, str]:
        d = self.driver
        if t.spec.home in ("", d.node):
            # the home is here: offer it; a failed offer re-queues it here
            return await d.offer_home_task(t.id, target)
        outs = d.state.guest.request_move(t.id, target, self.clock.now())
        if not outs:
            self.put_back(t.id, "the handoff was not settled: runs here again")
            return False, "the handoff was not settled here"
        await d.apply(outs, t.id)
        with trio.move_on_after(self.s.move_timeout):
            while True:
                e = d.state.guest.entries.get(t.id)
                if e is None:
                    return True, ""  # revoked after the commit at the target
                if e.phase is h.GuestPhase.READY:
                    return False, "the home did not carry out the move (it runs here again)"
                await trio.sleep(0.05)
        return False, "undecided: the home has not answered yet (it decides; nothing runs twice)"

    # ------------------------------------------------------------- back here

    def put_back(self, tid: m.TaskId, cause: str) -> None:
        """A stopped task whose move did not happen: back in this node's run queue, where
        it restarts from the state it kept here."""
        d = self.driver
        t = d.table.active.get(tid)
        if t is None or t.state is not S.MIGRATING:
            return
        d.table.change(tid, S.QUEUED, cause, node=d.node)
        if tid not in d.state.ledger:
            d.state.ledger.add(t.spec)
        if tid not in d.runner.queue:
            d.runner.requeue_front(tid)
        d.runner.kick()
        d.load_changed()

    async def cancelled(self, tid: m.TaskId, cause: str) -> None:
        d = self.driver
        t = d.table.active.get(tid)
        if t is None or t.state is not S.MIGRATING:
            return
        after = await d.table.change_durably(tid, S.CANCELLED, cause)
        d.on_finished(after)

    async def cancel(self, tid: m.TaskId, cause: str) -> None:
        """Cancel a task stopped for a migration (MIGRATING here)."""
        e = self.driver.state.home.entries.get(tid)
        offering = e is not None and e.phase is h.HomePhase.OFFERING
        how = self.book.cancel(tid, cause, offering)
        if how == "offer":
            self.driver.state.pending_cancel.add(tid)  # settled when the offer is
        elif how == "now":
            await self.cancelled(tid, cause)
