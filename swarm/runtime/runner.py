"""Runs the tasks queued on this node, at most `slots` at a time, in the node's order.

The runner owns the local run queue and the processes; every state change goes
through the TaskTable (journal first). On shutdown it terminates its processes and
puts their tasks back in the queue (or fails them, for --no-retry tasks), so they
run again on the next start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from .. import model as m
from ..logs import NULL_LOG, EventLog
from ..node.fencing import fenced
from . import shim as shimmod
from .executor import Executor, ProcessPlan, ProcessResult, Running, Spawn
from .journal import DelProc, PutProc
from .logfiles import LogFiles
from .statusdirs import StatusDirs
from .taskplan import task_plan
from .taskqueue import TaskQueue
from .tasks import TaskTable

# Extra hook: the agent may adjust a plan (user switching, cgroups, GPU env). It raises
# PlanRefused when the task cannot run here (e.g. its user does not exist): the task fails.
PlanHook = Callable[[m.Task, ProcessPlan], ProcessPlan]
# After a run: clean up what the plan hook set up; may explain a failure (e.g. OOM), and
# that text replaces the generic "killed by signal 9" as the failure's cause.
ExitHook = Callable[[m.Task, ProcessPlan, ProcessResult], Awaitable["str | None"]]
# Why a queued task may not start now (None: start it): shares, handoff, drain.
StartGate = Callable[[m.Task], "str | None"]
# Told about runs: started (state RUNNING) and ended (terminal, or QUEUED again).
RunHook = Callable[[m.Task], None]
# The queue in start order (priority, fair share, arrival: node/runqueue.py).
OrderHook = Callable[[], "list[m.TaskId]"]
# Every slot is taken and this task waits first: the node may preempt for it.
FullHook = Callable[[m.TaskId], None]


S_RUNNING = m.TaskState.RUNNING


class PlanRefused(Exception):
    """A plan hook's clear reason why a task cannot run on this node."""


@attrs.frozen
class _Launch:
    """A dispatched task's start, as far as the dispatch pass got."""

    plan: ProcessPlan | None
    hooked: bool  # the plan hooks ran: the exit hook undoes what they set up
    begun: Running | ProcessResult | Spawn  # its process; why not; or: start it in a thread
    adopted: bool = False  # started by a previous run of the agent (its process journaled)
    status_dir: Path | None = None  # taken from the pool (statusdirs.py): given back at the end


class LocalRunner:
    def __init__(
        self,
        table: TaskTable,
        executor: Executor,
        *,
        node: m.NodeId,
        slots: int,
        log_dir: Path,
        state_dir: Path,
        log: EventLog = NULL_LOG,
        plan_hook: PlanHook | None = None,
        can_start: StartGate | None = None,
        on_started: RunHook | None = None,
        on_finished: RunHook | None = None,
        exit_hook: ExitHook | None = None,
        checkpoint_exit_code: int = 85,
        order: OrderHook | None = None,
        on_full: FullHook | None = None,
        checkpoint_timeout: float = 30.0,
        checkpoint_signal: int = 10,  # SIGUSR1
    ) -> None:
        self.table = table
        self.executor = executor
        self.node = node
        self.slots = slots
        self.log_dir = log_dir
        self.task_state_root = state_dir / "task-state"
        self.shim_root = state_dir / "shim"  # the supervisors' status directories
        self.status_dirs = StatusDirs(self.shim_root)
        # tasks a previous run started that outlived it (recovery): watched again, or
        # their end recorded, once the runner runs
        self.adopting: dict[m.TaskId, shimmod.Shim | ProcessResult] = {}
        self.log = log
        self.plan_hook = plan_hook
        self.can_start = can_start
        self.on_started = on_started
        self.on_finished = on_finished
        self.exit_hook = exit_hook
        self.blocked: dict[m.TaskId, str] = {}  # queued tasks that may not start, and why
        self.reserved: Callable[[], int] = lambda: 0  # slots held for gangs (node/gangs.py)
        self.queue = TaskQueue()
        self.running: set[m.TaskId] = set()
        self.cancel_requested: dict[m.TaskId, str] = {}
        # tasks being stopped for a migration (the migrator sets this before it signals,
        # kills or dumps them): their end is "stopped to move", not a failure
        self.migrating: dict[m.TaskId, m.MigrateMode] = {}
        self.checkpoint_exit_code = checkpoint_exit_code  # "checkpointed, move me"
        self.order = order
        self.checkpoint_timeout = checkpoint_timeout
        self.checkpoint_signal = checkpoint_signal
        self.on_full = on_full
        # tasks being stopped for a higher class (node/runqueue.py): they re-queue
        self.preempting: dict[m.TaskId, str] = {}
        self._kinds: set[tuple[int, str | None, int | None]] = set()
        self._order_dirty = False
        self._ordered_at = float("-inf")
        self.stopping = False
        self._kick = trio.Event()
        self._idle = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._dispatching = False
        log_dir.mkdir(parents=True, exist_ok=True)
        # spare log files (open descriptors): enough for a burst of starts, bounded
        self.logfiles = LogFiles(log_dir, keep=min(64, max(16, 2 * slots)))

    # ------------------------------------------------------------ queue API

    def enqueue(self, task_id: m.TaskId) -> None:
        """Queue a task; with a slot free it is dispatched now, not on the runner's next
        wake-up (one trip through the scheduler less between submit and start)."""
        self.queue.append(task_id)
        self._note_kind(task_id)
        if len(self.running) >= self.slots and self.on_full is not None:
            self.on_full(task_id)  # every slot taken: the node may preempt for it
        if self._nursery is not None and not self._dispatching:
            self._dispatch(self._nursery)
        else:
            self._kick.set()

    def requeue_front(self, task_id: m.TaskId) -> None:
        """Put a task back at the head of the queue (a retry, a move that failed)."""
        self.queue.appendleft(task_id)
        self._note_kind(task_id)
        self._kick.set()

    def kick(self) -> None:
        self._kick.set()

    @property
    def free_slots(self) -> int:
        return max(0, self.slots - len(self.running) - self.reserved())

    def state_dir_of(self, task_id: m.TaskId) -> Path:
        """Where a checkpointing task keeps its state ($SWARM_STATE_DIR)."""
        return self.task_state_root / task_id

    def log_paths(self, task_id: m.TaskId) -> tuple[Path, Path]:
        return self.log_dir / f"{task_id}.out", self.log_dir / f"{task_id}.err"

    # ------------------------------------------------------------- dispatch

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.logfiles.keep_filled)
                task_status.started()
                while True:
                    self._dispatch(nursery)
                    await self._kick.wait()
                    self._kick = trio.Event()
        finally:
            self.logfiles.close()

    def _dispatch(self, nursery: trio.Nursery) -> None:
        """Start queued tasks in the node's order (priority, fair share, arrival) while
        slots are free; a task the gate refuses (reservation, drain, handoff not
        settled, a group's quota) keeps its place."""
        if self.stopping or not self.queue or len(self.running) + self.reserved() >= self.slots:
            return
        self._dispatching = True  # a hook below may enqueue: that waits for the kick
        try:
            self._reorder()
            self._dispatch_some(nursery)
        finally:
            self._dispatching = False

    def _note_kind(self, tid: m.TaskId) -> None:
        """Remember the (priority, user) of a task put in the queue: a queue of one
        kind is in order already (FIFO), and is never sorted."""
        t = self.table.active.get(tid)
        if t is not None:
            self._kinds.add((t.spec.priority, t.spec.user, t.spec.uid))
        self._order_dirty = True

    def _reorder(self) -> None:
        """Put the queue in the node's start order, in place (the node reads it): when
        it holds more than one kind of task and something arrived since the last sort,
        or a second has passed (usage, and so fair share, moves)."""
        if not self.queue:
            self._kinds.clear()
            return
        if self.order is None or len(self._kinds) < 2 or len(self.queue) < 2:
            return
        now = trio.current_time()
        if not self._order_dirty and now - self._ordered_at < 1.0:
            return
        self._order_dirty = False
        self._ordered_at = now
        want = self.order()
        if len(want) == len(self.queue) and all(
            a == b for a, b in zip(want, self.queue, strict=True)
        ):
            return
        wanted = set(want)
        rest = [tid for tid in self.queue if tid not in wanted]
        self.queue.clear()
        self.queue.extend(want)
        self.queue.extend(rest)

    def _dispatch_some(self, nursery: trio.Nursery) -> None:
        keep: deque[m.TaskId] = deque()
        self.blocked.clear()
        while self.queue and len(self.running) + self.reserved() < self.slots:
            tid = self.queue.popleft()
            t = self.table.active.get(tid)
            if t is None or t.state is not m.TaskState.QUEUED or tid in self.running:
                continue  # cancelled or moved while waiting
            if t.node != self.node:
                continue
            why = self.can_start(t) if self.can_start is not None else None
            if why is not None:
                self.blocked[tid] = why
                keep.append(tid)
                continue
            self._start(nursery, t)
        # in place: the node's state machine reads this very deque
        self.queue.extendleft(reversed(keep))

    def start_now(self, t: m.Task) -> str | None:
        """Start a queued task at once, outside the queue (a gang member: its hold kept
        its slot); why not, when the gate refuses (the caller fails it)."""
        if self._nursery is None or self.stopping:
            return "the agent is stopping"
        why = self.can_start(t) if self.can_start is not None else None
        if why is None:
            self._start(self._nursery, t)
        return why

    def _start(self, nursery: trio.Nursery, t: m.Task) -> None:
        """Start a task the gate let through (its shares are taken)."""
        tid = t.id
        self.running.add(tid)
        self.executor.claim(tid)  # a shutdown or cancel from now on reaches it
        # RUNNING (journaled, hooks told) at the gate's decision, not when the
        # task's coroutine first runs: a drain or a reservation that arrives in
        # between must see this start, and the journal must not date it later.
        task = self.table.change(tid, m.TaskState.RUNNING, "started", node=self.node)
        if self.on_started is not None:
            self.on_started(task)
        try:
            launch = self._launch(task)
        except Exception as e:  # a bug in a hook must not take the caller down
            self.log.error("task.launch_failed", task=tid, error=repr(e))
            failed = ProcessResult(None, None, spawn_error=f"cannot start: {e!r}")
            launch = _Launch(None, False, failed)
        nursery.start_soon(self._execute, task, launch)

    def plan(
        self, task: m.Task, status_dir: Path | None = None, ready: bool = False
    ) -> ProcessPlan:
        plan = task_plan(
            task, self.node, self.log_paths(task.id), self.state_dir_of(task.id), status_dir
        )
        return attrs.evolve(plan, status_ready=True) if ready else plan

    def _launch(self, task: m.Task) -> _Launch:
        """Plan a dispatched task's process and start it at once, in the dispatch pass
        itself: waiting for _execute's first scheduler pass would add a few hundred
        microseconds between submit and start."""
        status: Path | None = None
        ready = False
        if self.executor.shim is not None:
            status, ready = self.status_dirs.take()
        plan = self.plan(task, status, ready)
        if self.plan_hook is not None:
            try:
                plan = self.plan_hook(task, plan)
            except PlanRefused as e:
                why = ProcessResult(None, None, spawn_error=str(e))
                return _Launch(plan, False, why, status_dir=status)
        if task.spec.migrate is not m.MigrateMode.NEVER:
            try:
                self.state_dir_of(task.id).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                why = ProcessResult(
                    None, None, spawn_error=f"cannot create its state directory: {e}"
                )
                return _Launch(plan, True, why, status_dir=status)
        try:
            logs = self.logfiles.open_pair(plan.stdout, plan.stderr)
        except OSError as e:
            why = ProcessResult(None, None, spawn_error=f"cannot open log file: {e}")
            return _Launch(plan, True, why, status_dir=status)
        return _Launch(plan, True, self.executor.start(plan, logs), status_dir=status)

    async def _execute(self, task: m.Task, launch: _Launch) -> None:
        tid = task.id
        try:

            async def started(pid: int, create_time: float) -> None:
                h = self.executor.running.get(tid)
                if h is not None and h.status_dir is not None:  # pid: its supervisor's
                    op = PutProc(tid, pid, create_time, h.pid, str(h.status_dir))
                    self.table.journal.enqueue([op])
                    self.log.info("task.process", task=tid, pid=h.pid, shim=pid)
                    return
                self.table.journal.enqueue([PutProc(tid, pid, create_time)])
                self.log.info("task.process", task=tid, pid=pid)

            begun = launch.begun
            if isinstance(begun, Spawn):  # its start forks the agent: in a thread
                begun = await self.executor.start_in_thread(begun)
            if isinstance(begun, ProcessResult):
                result = begun
            else:
                # a re-attached task's process is journaled already
                watched = None if launch.adopted else started
                result = await self.executor.watch(begun, on_started=watched)
            with trio.CancelScope(shield=True):
                why: str | None = None
                if self.exit_hook is not None and launch.plan is not None and launch.hooked:
                    why = await self.exit_hook(task, launch.plan, result)
                if result.pid is not None:
                    self.table.journal.enqueue([DelProc(tid)])
                durable = await self._record(tid, result, why)
                if launch.status_dir is not None and durable and self.table.journal.settled:
                    # its end and DelProc are on disk (written in order): no row names
                    # the directory any more, so the next start may use it
                    leased = launch.plan is not None and launch.plan.lease is not None
                    self.status_dirs.give_back(launch.status_dir, leased)
                after = self.table.get_cached(tid)
                if after is not None and self.on_finished is not None:
                    self.on_finished(after)
                if after is not None and after.state is m.TaskState.QUEUED:
                    self.queue.appendleft(tid)
                    self._note_kind(tid)
        finally:
            self.executor.release(tid)
            self.running.discard(tid)
            self.cancel_requested.pop(tid, None)
            self.migrating.pop(tid, None)
            self.preempting.pop(tid, None)
            self._kick.set()
            if not self.running:
                self._idle.set()

    async def _record(self, tid: m.TaskId, r: ProcessResult, why: str | None = None) -> bool:
        """Journal the outcome; `why` (from the exit hook) explains a failure better.
        True once it is on disk (with everything enqueued before it); False when there
        was nothing to record (the task ended here another way)."""
        task = self.table.active.get(tid)
        if task is None or task.state is not S_RUNNING:
            return False
        end = RunEnd(
            cancelled_by=self.cancel_requested.get(tid),
            preempted_by=self.preempting.get(tid),
            moving=self.migrating.get(tid),
            stopping=self.stopping,
            checkpoint_exit_code=self.checkpoint_exit_code,
        )
        dst, cause, fields = end.outcome(task, r, why)
        await self.table.change_durably(tid, dst, cause, **fields)
        return True

    # ------------------------------------------------------ after a restart

    def adopt_outlived(self) -> None:
        """Tasks that outlived the last run (recovery): watched, or their end recorded."""
        assert self._nursery is not None, "the runner runs before the driver"
        found, self.adopting = self.adopting, {}
        for tid, what in found.items():
            t = self.table.active.get(tid)
            if t is not None and t.state is S_RUNNING:
                self.running.add(tid)
                if self.on_started is not None:
                    self.on_started(t)
                begun: Running | ProcessResult = (
                    what
                    if isinstance(what, ProcessResult)
                    else (self.executor.adopt(tid, what, trio.current_time()))
                )
                self.executor.claim(tid)
                launch = _Launch(self.plan(t), True, begun, adopted=True)  # plan: exit hook
                self._nursery.start_soon(self._execute, t, launch)

    # --------------------------------------------------------------- control

    async def cancel(self, tid: m.TaskId, reason: str = "cancelled") -> bool:
        """Terminate a running task of this runner; False if it is not running here."""
        if tid not in self.running:
            return False
        self.cancel_requested[tid] = reason
        await self.executor.terminate(tid, reason)
        return True

    async def preempt(self, tid: m.TaskId, cause: str, checkpoint: bool) -> None:
        """Stop a running task for a higher class; it re-queues (see _record). A
        checkpointing task gets the checkpoint signal and `checkpoint_timeout` to save
        its state and exit first."""
        if tid not in self.running:
            return
        self.preempting[tid] = cause
        if checkpoint and self.executor.signal(tid, self.checkpoint_signal):
            with trio.move_on_after(self.checkpoint_timeout):
                while (t := self.table.get_cached(tid)) is not None and t.state is S_RUNNING:
                    await self.table.wait_change(tid)
            t = self.table.get_cached(tid)
            if t is None or t.state is not S_RUNNING:
                return
        await self.executor.terminate(tid, cause)

    async def shutdown(self, keep: bool = False) -> None:
        """Stop starting tasks, terminate running ones (they go back to the queue); or,
        with `keep`, leave those under a supervisor running for the next run of the
        agent, which re-attaches to them (issue 19)."""
        self.stopping = True
        if keep and self.executor.shim is not None:
            self.executor.detaching = True
            self.log.info("agent.leaving_tasks", running=len(self.running))
            return
        if not self.running:
            return
        self._idle = trio.Event()
        async with trio.open_nursery() as n:
            for tid in list(self.running):
                n.start_soon(self.executor.terminate, tid, "agent shutdown")
        with trio.move_on_after(self.executor.kill_grace + 5):
            await self._idle.wait()


@attrs.frozen
class RunEnd:
    """What the runner knew of a run when it ended: who asked it to stop, and why."""

    cancelled_by: str | None  # a cancel's reason, as for a queued task
    preempted_by: str | None  # a higher class's cause
    moving: m.MigrateMode | None  # stopped for a migration of this mode
    stopping: bool  # the agent is shutting down
    checkpoint_exit_code: int

    def outcome(
        self, task: m.Task, r: ProcessResult, why: str | None
    ) -> tuple[m.TaskState, str, dict[str, int | None]]:
        """The transition that records run `r` of `task`: state, cause and fields;
        `why` (from the exit hook: an OOM kill) explains a failure better."""
        S = m.TaskState
        if r.cancelled and self.cancelled_by is not None:
            return S.CANCELLED, self.cancelled_by, {"exit_code": r.exit_code, "signal": r.signal}
        if r.fenced:  # its supervisor stopped it: the lease lapsed (node/fencing.py)
            return S.LOST, fenced(task.spec), {"signal": r.signal}
        if self.preempted_by is not None and (
            r.cancelled
            or (
                task.spec.migrate is m.MigrateMode.CHECKPOINT
                and r.exit_code == self.checkpoint_exit_code
            )
        ):
            return S.QUEUED, self.preempted_by, {}
        if r.cancelled and self.stopping:
            if task.spec.no_retry:
                why_ = "agent shut down while running (--no-retry)"
                return S.FAILED, why_, {"signal": r.signal}
            return S.QUEUED, "agent shutdown: will run again", {}
        moving = stopped_to_move(task, r, self.moving, self.checkpoint_exit_code)
        if moving is not None:
            return S.MIGRATING, moving, {}
        if r.spawn_error is not None:
            return S.FAILED, r.spawn_error, {"exit_code": spawn_exit_code(r.spawn_error)}
        if r.signal is not None:
            return S.FAILED, why or f"killed by signal {r.signal}", {"signal": r.signal}
        if r.exit_code == 0:
            return S.SUCCEEDED, "exited 0", {"exit_code": 0}
        return S.FAILED, why or f"exited {r.exit_code}", {"exit_code": r.exit_code}


def spawn_exit_code(why: str) -> int:
    """The exit code a shell would give a start that failed so."""
    if why.startswith("command not found"):
        return 127
    return 126 if "permission" in why else 1


def stopped_to_move(
    task: m.Task, r: ProcessResult, mode: m.MigrateMode | None, checkpoint_exit_code: int
) -> str | None:
    """Why this end of a run is a stop for a migration (RUNNING -> MIGRATING), or
    None when it is an ordinary end. A checkpointing task may also exit with the
    checkpoint code on its own ("checkpointed, move me"): its state is in its
    state dir, so it is never recorded as a failure."""
    if mode is not None and r.cancelled:
        return f"stopped for migration ({mode.value})"
    if mode is m.MigrateMode.CRIU and r.signal == 9:
        return "dumped by CRIU for migration"
    if (
        task.spec.migrate is m.MigrateMode.CHECKPOINT
        and r.spawn_error is None
        and r.exit_code == checkpoint_exit_code
    ):
        return "checkpointed" + (" for migration" if mode is not None else "")
    return None
