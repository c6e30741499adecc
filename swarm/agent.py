"""The agent: wires the journal, the runner, the submit socket (and, when enabled,
the cluster layer) into one trio nursery. Nothing clever lives here; decisions are
in policy/ and cluster/, I/O in runtime/.
"""

from __future__ import annotations

import os
import pwd
import signal
from collections.abc import AsyncIterator
from typing import Any

import trio

from . import __version__, codec, requests, wire
from . import model as m
from .config import Config
from .logs import EventLog
from .runtime.api import ApiServer, Ops, PeerCred, RequestError
from .runtime.executor import Executor, kill_orphan
from .runtime.journal import DelProc, Journal, JournalError
from .runtime.runner import LocalRunner
from .runtime.tasks import TaskTable, UnknownTask, wall_now

LOG_CHUNK = 64 * 1024


class Agent:
    def __init__(self, config: Config, log: EventLog | None = None) -> None:
        self.config = config
        self.node = config.node_id
        self.log = log or EventLog(fmt=config.log_format, level=config.log_level, node=self.node)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(config.journal_path, self.log, node=self.node)
        self.table = TaskTable(self.journal, self.node, self.log)
        self.executor = Executor(kill_grace=config.kill_grace, log=self.log)
        self.runner = LocalRunner(
            self.table,
            self.executor,
            node=self.node,
            slots=config.slots,
            log_dir=config.log_dir,
            state_dir=config.state_dir,
            log=self.log,
        )
        self.api = ApiServer(config.socket, self._ops(), group=config.socket_group, log=self.log)
        self.started_at = wall_now()
        self.accepting = False
        self._stop = trio.Event()

    # ---------------------------------------------------------------- life

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._recover()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.journal.run)
                await nursery.start(self.runner.run)
                nursery.start_soon(self._signals)
                api_scope = trio.CancelScope()

                async def serve_api(*, task_status: trio.TaskStatus[None]) -> None:
                    with api_scope:
                        await self.api.serve(task_status=task_status)

                await nursery.start(serve_api)
                self.accepting = True
                self.log.info(
                    "agent.ready",
                    version=__version__,
                    socket=str(self.config.socket),
                    slots=self.config.slots,
                    queued=len(self.runner.queue),
                )
                task_status.started()
                await self._stop.wait()
                self.log.info("agent.stopping", running=len(self.runner.running))
                self.accepting = False
                api_scope.cancel()
                await self.runner.shutdown()
                with trio.move_on_after(30):
                    await self.journal.commit([], must_land=True)
                nursery.cancel_scope.cancel()
        finally:
            self.journal.close()
            self.log.info("agent.stopped")

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            async for sig in sigs:
                self.log.info("agent.signal", signal=signal.Signals(sig).name)
                self.request_stop()

    def _recover(self) -> None:
        """Bring the journal's view back to a consistent, runnable state."""
        rec = self.journal.recover()
        for tid, (pid, ct) in rec.procs.items():
            if kill_orphan(pid, ct):
                self.log.warning("agent.orphan_killed", task=tid, pid=pid)
            self.journal.enqueue([DelProc(tid)])
        self.table.load(rec.active)
        requeued = 0
        for t in rec.active:
            S = m.TaskState
            if t.state in (S.RUNNING, S.MIGRATING, S.TRANSFERRING):
                if t.spec.no_retry and t.state is not S.TRANSFERRING:
                    self.table.change(
                        t.id, S.FAILED, "agent restarted while task was running (--no-retry)"
                    )
                    continue
                self.table.change(t.id, S.QUEUED, "agent restarted: will run again", node=self.node)
                requeued += 1
            if self.table.active[t.id].state is S.QUEUED:
                self.runner.enqueue(t.id)
        if rec.active:
            self.log.info("agent.recovered", tasks=len(rec.active), requeued=requeued)

    # ----------------------------------------------------------------- ops

    def _ops(self) -> Ops:
        return Ops(
            unary={
                "submit": self.op_submit,
                "status": self.op_status,
                "list": self.op_list,
                "cancel": self.op_cancel,
                "wait": self.op_wait,
                "info": self.op_info,
            },
            stream={"logs": self.op_logs},
        )

    def _authorize(self, task: m.Task, cred: PeerCred) -> None:
        if cred.uid == 0 or task.spec.uid is None or task.spec.uid == cred.uid:
            return
        raise RequestError("permission_denied", f"task {task.id} belongs to another user")

    async def _task(self, f: wire.Fields) -> m.Task:
        tid = requests.check_task_id(f.str("id", required=True, max_len=64))
        try:
            return await self.table.get(tid)
        except UnknownTask:
            raise RequestError("not_found", f"no task {tid}") from None

    async def op_submit(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        if not self.accepting:
            raise RequestError("unavailable", "agent is shutting down; not accepting tasks")
        spec = requests.submit_spec(
            f, uid=cred.uid, user=_user_name(cred.uid), home=self.node, now=wall_now()
        )
        existing = self.table.get_cached(spec.id)
        if existing is not None:
            if existing.spec.argv != spec.argv:
                raise RequestError(
                    "conflict", f"task id {spec.id} already used for another command"
                )
            return {"id": spec.id, "duplicate": True}
        task = m.new_task(spec, wall_now(), self.node)
        try:
            await self.table.add(task)
        except JournalError as e:
            raise RequestError("journal", f"task not accepted: journal write failed: {e}") from None
        self.runner.enqueue(task.id)
        return {"id": task.id}

    async def op_status(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f)
        f.done()
        self._authorize(t, cred)
        return {"task": codec.task_to_wire(t)}

    async def op_list(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        show_all = f.bool("all", False)
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
        tasks = tasks[-limit:]
        return {"tasks": [codec.task_to_wire(t) for t in tasks]}

    async def op_cancel(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f)
        f.done()
        self._authorize(t, cred)
        S = m.TaskState
        if t.state.terminal:
            raise RequestError("finished", f"task {t.id} already {t.state.value}")
        if t.state is S.QUEUED:
            t = await self.table.change_durably(t.id, S.CANCELLED, f"cancelled by uid {cred.uid}")
        elif t.id in self.runner.running:
            await self.runner.cancel(t.id)
            t = await self.table.wait_terminal(t.id)
        else:
            t = await self.table.change_durably(t.id, S.CANCELLED, f"cancelled by uid {cred.uid}")
        return {"task": codec.task_to_wire(t)}

    async def op_wait(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        t = await self._task(f)
        timeout = f.float("timeout", None, lo=0.0)
        f.done()
        self._authorize(t, cred)
        timed_out = True
        with trio.move_on_after(float("inf") if timeout is None else timeout):
            t = await self.table.wait_terminal(t.id)
            timed_out = False
        if timed_out:
            t = await self.table.get(t.id)
        return {"task": codec.task_to_wire(t), "timed_out": timed_out}

    async def op_info(self, f: wire.Fields, cred: PeerCred) -> dict[str, Any]:
        f.done()
        return {
            "node": self.node,
            "version": __version__,
            "pid": os.getpid(),
            "slots": self.runner.slots,
            "running": len(self.runner.running),
            "queued": len(self.runner.queue),
            "tasks": len(self.table.active),
            "journal_commits": self.journal.commits,
            "journal_ops": self.journal.ops_written,
            "uptime": wall_now() - self.started_at,
            "api": dict(self.api.stats),
        }

    async def op_logs(self, f: wire.Fields, cred: PeerCred) -> AsyncIterator[dict[str, Any]]:
        t = await self._task(f)
        which = f.str("stream", "stdout")
        if which not in ("stdout", "stderr"):
            raise wire.SchemaError("logs: stream must be stdout or stderr")
        follow = f.bool("follow", False)
        offset = f.int("offset", 0, lo=0)
        f.done()
        self._authorize(t, cred)
        out, err = self.runner.log_paths(t.id)
        path = out if which == "stdout" else err
        async for part in _read_log(path, offset, follow, lambda: self.table.get(t.id), self.table):
            yield part


async def _read_log(
    path: os.PathLike[str],
    offset: int,
    follow: bool,
    current: Any,
    table: TaskTable,
) -> AsyncIterator[dict[str, Any]]:
    """Stream a log file from `offset`; with follow, until the task ends and EOF is read."""
    while True:
        data = b""
        try:
            async with await trio.open_file(path, "rb") as fh:
                await fh.seek(offset)
                data = await fh.read(LOG_CHUNK)
        except FileNotFoundError:
            data = b""
        if data:
            offset += len(data)
            yield {"more": True, "data": data, "offset": offset}
            continue
        if not follow:
            break
        task: m.Task = await current()
        if task.state.terminal:
            # one last read: output written just before exit
            try:
                async with await trio.open_file(path, "rb") as fh:
                    await fh.seek(offset)
                    rest = await fh.read()
            except FileNotFoundError:
                rest = b""
            if rest:
                offset += len(rest)
                yield {"more": True, "data": rest, "offset": offset}
            break
        with trio.move_on_after(0.1):
            await table.wait_change(task.id)
    yield {"more": False, "offset": offset, "eof": True}


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
