"""Runs task processes: spawn, logs, exit status, cancel, orphan clean-up.

Each task runs in its own session/process group so that cancel reaches the whole
tree (SIGTERM to the group, SIGKILL after a grace period), and so that stragglers
left in the group when the main process exits are killed too (like systemd's
KillMode=control-group). stdout/stderr go straight to per-task files (the agent
never copies task output through its own memory).

Isolation hooks (running as another user, cgroup limits) are applied through
`ProcessPlan`, which the agent builds; this module only executes the plan. How a
plan becomes a process (user switch, swarm-exec, cgroup join, log files, start
errors) is `procstart.py`; this module decides when, and supervises.
"""

from __future__ import annotations

import errno as _errno
import functools
import os
import signal as _signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

from ..logs import NULL_LOG, EventLog
from . import proctime
from . import shim as shimmod
from .clock import Clock
from .procstart import (
    LOG_FLAGS,
    CgroupJoinError,
    HelperStart,
    OpenLogs,
    ProcessPlan,
    Spawn,
    UserSwitch,
    close_logs,
    command_exists,
    helper_verdict,
    open_log,
    open_logs,
    spawn_argv,
    spawn_error,
    start_process,
    switches_user,
    wrapper_joins,
    write_control,
)

__all__ = [
    "LOG_FLAGS",
    "CgroupJoinError",
    "Child",
    "Executor",
    "OpenLogs",
    "ProcessPlan",
    "ProcessResult",
    "Running",
    "Spawn",
    "close_logs",
    "group_alive",
    "kill_group",
    "kill_orphan",
    "open_log",
    "open_logs",
    "same_process",
    "spawn_argv",
    "switches_user",
    "write_control",
]


@attrs.frozen
class ProcessResult:
    exit_code: int | None  # None when killed by a signal or never started
    signal: int | None
    spawn_error: str | None = None  # set when the process could not be started
    pid: int | None = None
    started_at: float | None = None  # trio clock
    cancelled: bool = False  # we terminated it (cancel/shutdown/migration)
    fenced: bool = False  # its supervisor killed it (or never started it): lease lapsed

    @property
    def ok(self) -> bool:
        return self.spawn_error is None and self.exit_code == 0 and self.signal is None


@functools.cache
def _devnull() -> int:
    """/dev/null, opened once for every task's stdin (subprocess.DEVNULL opens and
    closes it at each start); close-on-exec here, dup'ed onto the child's fd 0."""
    return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def same_process(pid: int, create_time: float) -> bool:
    """Is `pid` still the process we started (not a recycled pid)?"""
    try:
        return bool(abs(psutil.Process(pid).create_time() - create_time) < 0.5)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def kill_orphan(pid: int, create_time: float) -> bool:
    """Kill the process group of a task process left behind by a crashed agent."""
    if not same_process(pid, create_time):
        return False
    return kill_group(pid, _signal.SIGKILL)


class Child:
    """A spawned task process, awaited through a pidfd on trio's loop.

    Why not trio.lowlevel.open_process: it runs Popen in a worker thread, and the
    thread hop (plus the GIL round trips it brings) costs more than the vfork+exec
    itself, on every task start. Popen without preexec_fn takes the vfork path and
    blocks the loop only until the child has exec'd (~0.3 ms).
    """

    def __init__(self, popen: subprocess.Popen[Any]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._lock = trio.Lock()  # several waiters (run, terminate): one reaps
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (OSError, AttributeError):  # old kernel: poll instead
            self._pidfd = None

    async def wait(self) -> int:
        async with self._lock:
            while self.popen.poll() is None:
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                else:
                    await trio.sleep(0.02)
            self._close()
        rc = self.popen.returncode
        assert rc is not None
        return rc

    def _close(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


class Running:
    """Handle for a process in flight: lets the agent terminate it.

    Under a supervisor (runtime/shim.py) `proc` is the shim and `pid` the task's, which
    is also its process group: known once the shim has reported (`ready`); until then
    a termination waits for it (signalling the shim's own group would reach nothing
    of the task's)."""

    def __init__(
        self,
        task_id: str,
        proc: Child | shimmod.Shim,
        grace: float,
        started: float,
        *,
        status_dir: Path | None = None,
        report_fd: int | None = None,
        plan: ProcessPlan | None = None,
    ) -> None:
        self.task_id = task_id
        self.proc = proc
        self.pid = proc.task_pid if isinstance(proc, shimmod.Shim) else proc.pid
        self.started = started  # trio clock
        self.grace = grace
        self.terminating = False
        self.term_reason = ""
        self._kill_scope: trio.CancelScope | None = None
        self.helper_status: int | None = None  # swarm-exec's status pipe, to await
        self.status_dir = status_dir  # the shim's: its exit file
        self.report_fd = report_fd  # the shim's report, to await (then `pid` is known)
        self.plan = plan
        self.fenced = False  # its shim's exit file says "fenced": its lease lapsed
        self.ready = trio.Event()
        if report_fd is None:
            self.ready.set()

    @property
    def supervised(self) -> bool:
        return self.status_dir is not None

    @property
    def shim_pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> int:
        """The task's end, Popen's convention (-signal); under a shim from its exit
        file (-9 when it has none: the shim was killed, the task's end is unknown)."""
        if isinstance(self.proc, shimmod.Shim):
            rec = await self.proc.wait()
            self.fenced = rec is not None and rec.fenced
            return -9 if rec is None else rec.returncode
        rc = await self.proc.wait()
        if self.status_dir is None:
            return rc
        try:
            rec = shimmod.read_exit(self.status_dir)
        except shimmod.ExitFileError:
            rec = None
        # no exit file (a full disk): the shim ended as the task did
        self.fenced = rec is not None and rec.fenced
        return rc if rec is None else rec.returncode

    def signal(self, sig: int) -> bool:
        return kill_group(self.pid, sig)

    async def terminate(self, reason: str) -> None:
        """SIGTERM the group, SIGKILL after the grace period; returns when it is gone."""
        if not self.terminating:
            self.terminating = True
            self.term_reason = reason
        await self.ready.wait()
        kill_group(self.pid, _signal.SIGTERM)
        with trio.move_on_after(self.grace):
            await self.proc.wait()
            # the leader is gone; give the rest of the group the same grace
            while group_alive(self.pid):
                await trio.sleep(0.05)
            return
        kill_group(self.pid, _signal.SIGKILL)
        await self.proc.wait()


class Executor:
    def __init__(
        self,
        kill_grace: float = 10.0,
        log: EventLog = NULL_LOG,
        exec_helper: Path | None = None,
        clock: Clock | None = None,
        shim: Path | None = None,
    ) -> None:
        self.kill_grace = kill_grace
        # swarm-shim (runtime/shim.py): each task started under it outlives the agent;
        # None: tasks are the agent's children and die with it (as before issue 19)
        self.shim = shim
        # a restart that leaves the tasks running (`detach`): cancellation of a
        # supervised task's watch then stops watching, it does not kill the task
        self.detaching = False
        self.clock = clock or Clock.system()
        self.log = log
        # swarm-exec (exechelper.py): starts a task as another user on the vfork path;
        # None: those starts fork the agent (UserSwitch), as safe and slower
        self.exec_helper = exec_helper
        self.running: dict[str, Running] = {}
        # Tasks between run() and their process existing, and the reasons of
        # terminations asked for in that window: a shutdown or cancel that races
        # with a start must still stop the process once it exists.
        self._starting: set[str] = set()
        self._doomed: dict[str, str] = {}

    async def run(
        self,
        plan: ProcessPlan,
        on_started: Callable[[int, float], Awaitable[None]] | None = None,
    ) -> ProcessResult:
        """Run one attempt to completion. Cancellation of the caller kills the group."""
        self.claim(plan.task_id)
        try:
            begun = self.start(plan)
            if isinstance(begun, Spawn):
                begun = await self.start_in_thread(begun)
            if isinstance(begun, ProcessResult):
                return begun
            return await self._supervise(begun, on_started)
        finally:
            self.release(plan.task_id)

    def start(
        self, plan: ProcessPlan, logs: OpenLogs | None = None
    ) -> Running | ProcessResult | Spawn:
        """Start a claimed task's process right now, on the loop (the vfork path costs
        ~0.3 ms), for callers that must not wait for a scheduler pass; then `watch` it.
        `logs`: the plan's stdout/stderr, already open (they are closed here). A
        ProcessResult: it did not start. A Spawn: starting it forks the agent (a user
        switch without swarm-exec): `start_in_thread` does that."""
        spawn = self._prepare(plan, logs)
        if isinstance(spawn, ProcessResult) or spawn.forks:
            return spawn
        return self._spawned(spawn, start_process(spawn))

    async def start_in_thread(self, spawn: Spawn) -> Running | ProcessResult:
        """The forking start, in a worker thread: a fork copies the agent, which must
        not stall the loop."""
        return self._spawned(spawn, await trio.to_thread.run_sync(start_process, spawn))

    async def watch(
        self,
        handle: Running,
        on_started: Callable[[int, float], Awaitable[None]] | None = None,
    ) -> ProcessResult:
        """Wait for a process from `start` to end (as `run` does after its start)."""
        try:
            return await self._supervise(handle, on_started)
        finally:
            self.release(handle.task_id)

    def _prepare(self, plan: ProcessPlan, logs: OpenLogs | None) -> Spawn | ProcessResult:
        if plan.task_id in self._doomed:  # terminated before it started: never start it
            if logs is not None:
                close_logs(logs)
            return ProcessResult(None, None, cancelled=True)
        try:
            out, err = logs if logs is not None else open_logs(plan.stdout, plan.stderr)
        except OSError as e:
            return ProcessResult(None, None, spawn_error=f"cannot open log file: {e}")
        fast = spawn_argv(plan)
        switch: UserSwitch | None = None
        helper: HelperStart | None = None
        env: dict[str, str] = dict(plan.env)
        kwargs: dict[str, Any]
        if fast is None and self.exec_helper is not None and plan.gid is not None:
            try:
                helper = HelperStart(plan, self.exec_helper)
            except OSError as e:
                close_logs((out, err))
                return ProcessResult(None, None, spawn_error=f"cannot start process: {e}")
            # root starts it with an empty environment: the task's is in the memfd
            argv, env = helper.argv, {}
            kwargs = {"pass_fds": (helper.env_fd, helper.status_w)}
        elif fast is not None:
            argv, kwargs = fast
            if wrapper_joins(plan) and not command_exists(plan):
                # the wrapper would report this as "exit 127": say it plainly instead
                close_logs((out, err))
                msg = spawn_error(plan, FileNotFoundError(2, "not found", plan.argv[0]))
                return ProcessResult(None, None, spawn_error=msg)
            kwargs["cwd"] = plan.cwd
        else:
            # switch user first, then chdir as the user (no cwd= here: subprocess would
            # chdir as root, before the switch), then exec with the task's environment
            switch = UserSwitch(plan)
            argv = list(plan.argv)
            kwargs = {"preexec_fn": switch.preexec}
        report: tuple[int, int] | None = None
        if plan.lease is not None and (
            self.shim is None or plan.status_dir is None or switch is not None
        ):
            close_logs((out, err))
            if helper is not None:
                helper.failed()
            if switch is not None:
                switch.close()
            why = "--at-most-once needs the task supervisor (swarm-shim), not available here"
            return ProcessResult(None, None, spawn_error=why)
        if self.shim is not None and plan.status_dir is not None and switch is None:
            try:
                report = self._shim_start(plan.status_dir, plan.lease, plan.status_ready)
            except OSError as e:
                if plan.lease is not None:  # never unfenced: not started
                    close_logs((out, err))
                    if helper is not None:
                        helper.failed()
                    why = f"cannot give its lease to its supervisor: {e}"
                    return ProcessResult(None, None, spawn_error=why)
                # no status directory (a full disk): the task starts as the agent's own
                # child, as without a shim (it will not outlive the agent)
                self.log.warning("executor.unsupervised", task=plan.task_id, error=str(e))
            else:
                argv = shimmod.argv(self.shim, report[1], plan.status_dir, argv)
                kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), report[1])
        if plan.umask is not None:
            kwargs["umask"] = plan.umask
        kwargs.update(
            stdin=_devnull(),
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        return Spawn(plan, argv, kwargs, (out, err), switch, helper, report)

    @staticmethod
    def _shim_start(status_dir: Path, lease: float | None, ready: bool = False) -> tuple[int, int]:
        """The attempt's status directory, fresh (an exit file left by an earlier
        attempt would read as this one's end; so would a lease), its lease for a
        fenced task, and the shim's report pipe. A `ready` one (from the pool) was
        emptied when it was given back: its mkdir only finds it there (a cheap EEXIST,
        no inode allocated), or makes it again if someone removed it meanwhile."""
        # (os.path on strings: pathlib's objects were ~1 % of a busy runner's loop)
        try:
            os.makedirs(status_dir, 0o700)  # new: nothing left in it
        except FileExistsError:
            if not ready:
                for name in (shimmod.EXIT_FILE, shimmod.LEASE_FILE):
                    try:
                        os.unlink(os.path.join(status_dir, name))
                    except FileNotFoundError:
                        pass
        if lease is not None:
            shimmod.write_lease(status_dir, lease)
        r, w = os.pipe2(os.O_CLOEXEC)
        return r, w

    def _spawned(
        self, spawn: Spawn, popen: subprocess.Popen[Any] | BaseException
    ) -> Running | ProcessResult:
        switched = spawn.switch is not None or spawn.helper is not None
        why = None
        if spawn.switch is not None:
            if isinstance(popen, BaseException):
                why = spawn.switch.error()
            spawn.switch.close()
        if spawn.report is not None:
            os.close(spawn.report[1])  # the shim has its own copy
        if not isinstance(popen, BaseException):
            close_logs(spawn.logs)  # the child has its own copies
            handle = self._started(spawn.plan, Child(popen), spawn.report)
            if spawn.helper is not None:
                handle.helper_status = spawn.helper.started()
            return handle
        if spawn.report is not None:
            os.close(spawn.report[0])
        if spawn.helper is not None:
            spawn.helper.failed()
        msg = why or spawn_error(spawn.plan, popen, switched=switched)
        try:  # where the task's own stderr would have gone
            os.write(spawn.logs[1], f"swarm: {msg}\n".encode())
        except OSError:
            pass
        close_logs(spawn.logs)
        return ProcessResult(None, None, spawn_error=msg)

    def _started(
        self, plan: ProcessPlan, proc: Child, report: tuple[int, int] | None = None
    ) -> Running:
        handle = Running(
            plan.task_id,
            proc,
            self.kill_grace,
            self.clock.now(),
            status_dir=plan.status_dir if report is not None else None,
            report_fd=report[0] if report is not None else None,
            plan=plan,
        )
        self.running[plan.task_id] = handle
        self._starting.discard(plan.task_id)
        return handle

    async def _supervise(
        self,
        handle: Running,
        on_started: Callable[[int, float], Awaitable[None]] | None,
    ) -> ProcessResult:
        proc = handle.proc
        if handle.report_fd is not None:
            fd, handle.report_fd = handle.report_fd, None
            try:
                handle.pid = await shimmod.read_report(fd)
            except shimmod.ShimStartError as e:
                await handle.wait()  # the shim has exited (or exits now)
                self.running.pop(handle.task_id, None)
                plan = handle.plan
                msg = spawn_error(plan, e.as_oserror()) if plan and e.exec_failed else str(e)
                fenced = e.errno == _errno.ETIME and not e.exec_failed
                return ProcessResult(None, None, spawn_error=msg, pid=proc.pid, fenced=fenced)
            finally:
                os.close(fd)
                handle.ready.set()
        if handle.helper_status is not None:
            fd, handle.helper_status = handle.helper_status, None
            why = await helper_verdict(fd)
            if why is not None:  # the helper could not start the task: it has exited
                await handle.wait()
                self.running.pop(handle.task_id, None)
                return ProcessResult(None, None, spawn_error=why, pid=proc.pid)
        try:
            doomed = self._doomed.pop(handle.task_id, None)
            if doomed is not None:  # terminated while it was being spawned
                await handle.terminate(doomed)
            if on_started is not None:
                try:
                    ct = proctime.create_time(proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    ct = 0.0
                await on_started(proc.pid, ct)
            try:
                rc = await handle.wait()
            except trio.Cancelled:
                if self.detaching and handle.supervised:
                    handle.terminating = True  # not ours to end: it outlives this agent
                    raise
                with trio.CancelScope(shield=True):
                    await handle.terminate(handle.term_reason or "agent cancelled")
                raise
        finally:
            # kill stragglers left in the group (background children of the task);
            # under a shim it did that, and a detached task keeps its group
            if not (self.detaching and handle.supervised):
                kill_group(handle.pid, _signal.SIGKILL)
            self.running.pop(handle.task_id, None)
        return ProcessResult(
            rc if rc >= 0 else None,
            -rc if rc < 0 else None,
            pid=handle.pid,
            started_at=handle.started,
            cancelled=handle.terminating,
            fenced=handle.fenced,
        )

    def renew_lease(self, task_id: str, deadline: float) -> bool:
        """Move a fenced task's lease forward (node/fencing.py); False when it is not
        running here under a supervisor, or the file cannot be written (then the
        supervisor fences it at the old deadline, which is safe)."""
        h = self.running.get(task_id)
        if h is None or h.status_dir is None:
            return False
        try:
            shimmod.write_lease(h.status_dir, deadline)
        except OSError as e:
            self.log.warning("executor.lease_not_written", task=task_id, error=str(e))
            return False
        return True

    def adopt(self, task_id: str, found: shimmod.Shim, started: float) -> Running:
        """A task a previous run of the agent started under a shim that still runs it
        (recovery): watched from now on as if started here (`watch`)."""
        handle = Running(task_id, found, self.kill_grace, started, status_dir=found.status_dir)
        self.log.info("task.reattached", task=task_id, pid=found.task_pid, shim=found.pid)
        self.running[task_id] = handle
        self._starting.add(task_id)
        return handle

    def claim(self, task_id: str) -> None:
        """A task is on its way to run(): a terminate from now on reaches it."""
        self._starting.add(task_id)

    def release(self, task_id: str) -> None:
        """The task's attempt is over (or never reached run())."""
        self._starting.discard(task_id)
        self._doomed.pop(task_id, None)

    async def terminate(self, task_id: str, reason: str) -> bool:
        """Terminate a task's process; one still being started is stopped as soon as
        it exists (or never started). False: no such task here."""
        h = self.running.get(task_id)
        if h is None:
            if task_id not in self._starting:
                return False
            self._doomed[task_id] = reason
            return True
        await h.terminate(reason)
        return True

    def signal(self, task_id: str, sig: int) -> bool:
        h = self.running.get(task_id)
        return False if h is None else h.signal(sig)
