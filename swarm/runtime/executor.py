"""Runs task processes: spawn, logs, exit status, cancel, orphan clean-up.

Each task runs in its own session/process group so that cancel reaches the whole
tree (SIGTERM to the group, SIGKILL after a grace period), and so that stragglers
left in the group when the main process exits are killed too (like systemd's
KillMode=control-group). stdout/stderr go straight to per-task files (the agent
never copies task output through its own memory).

Isolation hooks (running as another user, cgroup limits) are applied through
`ProcessPlan`, which the agent builds; this module only executes the plan.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal as _signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

from ..logs import NULL_LOG, EventLog
from .clock import Clock

OpenLogs = tuple[int, int]  # a task's stdout and stderr files: open descriptors


@attrs.frozen
class ProcessPlan:
    """Everything needed to start one attempt of a task."""

    task_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdout: Path
    stderr: Path
    uid: int | None = None  # switch to this user (agent must be root)
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    cgroup_procs: tuple[Path, ...] = ()  # cgroup.procs files to join before exec
    # cgroup v1, per hierarchy: (the task group's `tasks` file, the agent's own). The
    # starting thread joins the first, starts the process, which inherits it, and
    # goes back: no wrapper process. Empty: the child joins cgroup_procs itself.
    cgroup_threads: tuple[tuple[Path, Path], ...] = ()
    umask: int | None = None  # the task's umask (None: inherit the agent's)


@attrs.frozen
class ProcessResult:
    exit_code: int | None  # None when killed by a signal or never started
    signal: int | None
    spawn_error: str | None = None  # set when the process could not be started
    pid: int | None = None
    started_at: float | None = None  # trio clock
    cancelled: bool = False  # we terminated it (cancel/shutdown/migration)

    @property
    def ok(self) -> bool:
        return self.spawn_error is None and self.exit_code == 0 and self.signal is None


def switches_user(plan: ProcessPlan) -> bool:
    """Does this start change credentials (a root agent running a task as its user)?"""
    return plan.uid is not None and (
        plan.uid != os.geteuid() or plan.gid not in (None, os.getegid())
    )


class UserSwitch:
    """The start of a task as another user, in the child between fork and exec.

    Order matters, and nothing the submitter chose is touched while the child is root:
    join the task's cgroups (needs the agent's privileges; the paths are the agent's
    own), switch user (groups, gid, uid), then chdir to the task's directory *as the
    user* (the kernel's permission checks decide, so a directory the user cannot enter
    fails the task), then execve with the task's environment: the submitter's
    variables (LD_PRELOAD, GCONV_PATH, ...) reach only the task's own program, never a
    root helper. Why not setpriv(1) or a shell: those are programs the dynamic loader
    starts as root, with whatever environment they are given.

    A failure in the child is written to a pipe (the parent learns only "preexec_fn
    failed" from subprocess) so the task fails with the reason."""

    def __init__(self, plan: ProcessPlan) -> None:
        self.plan = plan
        self._r, self._w = os.pipe()

    def preexec(self) -> None:  # runs in the child between fork and exec
        plan = self.plan
        step = "cannot put the process in its cgroup"
        try:
            if not plan.cgroup_threads:
                pid = str(os.getpid()).encode()
                for p in plan.cgroup_procs:
                    fd = os.open(p, os.O_WRONLY)
                    try:
                        os.write(fd, pid)
                    finally:
                        os.close(fd)
            step = "cannot switch to its user"
            assert plan.uid is not None
            os.setgroups(list(plan.groups or ()))
            if plan.gid is not None:
                os.setregid(plan.gid, plan.gid)
            os.setreuid(plan.uid, plan.uid)
            step = f"cannot enter working directory {plan.cwd}"
            os.chdir(plan.cwd)
        except OSError as e:
            msg = f"{step}: {e.strerror or e}"
            if step.startswith("cannot enter"):
                msg += f" (as uid {plan.uid})"
            os.write(self._w, msg.encode(errors="replace")[:4096])
            raise

    def error(self) -> str | None:
        """What the child wrote before it failed (call once Popen has returned)."""
        os.close(self._w)
        self._w = -1
        try:
            data = os.read(self._r, 4096)
        except OSError:
            data = b""
        return data.decode(errors="replace") or None

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1


class HelperStart:
    """A start through swarm-exec (exechelper.py): the same order as UserSwitch, but
    in a small compiled program started on the vfork path with an empty environment.
    The task's environment goes through a memfd (argv is readable by every local
    user in /proc); the helper's verdict comes back through a pipe that a successful
    exec closes unread."""

    def __init__(self, plan: ProcessPlan, helper: Path) -> None:
        assert plan.uid is not None and plan.gid is not None
        self.env_fd = os.memfd_create("swarm-env", os.MFD_CLOEXEC)
        try:
            data = b"".join(
                os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in plan.env.items()
            )
            view = memoryview(data)
            while view:
                view = view[os.write(self.env_fd, view) :]
            self.status_r, self.status_w = os.pipe()
        except BaseException:
            os.close(self.env_fd)
            raise
        groups = ",".join(str(g) for g in plan.groups or ()) or "-"
        joins = [] if plan.cgroup_threads else [str(p) for p in plan.cgroup_procs]
        self.argv = [
            str(helper),
            str(plan.uid),
            str(plan.gid),
            groups,
            plan.cwd,
            str(self.env_fd),
            str(self.status_w),
            *joins,
            "--",
            *plan.argv,
        ]

    def started(self) -> int:
        """Popen returned: drop the child's ends; the status pipe's read end is the
        caller's to await (helper_verdict) and close."""
        os.close(self.env_fd)
        os.close(self.status_w)
        return self.status_r

    def failed(self) -> None:
        for fd in (self.env_fd, self.status_r, self.status_w):
            os.close(fd)


async def helper_verdict(fd: int) -> str | None:
    """None once the task's own program has been exec'd; else the helper's reason."""
    try:
        await trio.lowlevel.wait_readable(fd)
        data = os.read(fd, 8192)
    except OSError as e:
        data = f"cannot read the start's status: {e}".encode()
    finally:
        os.close(fd)
    return data.decode(errors="replace") or None


# Joins the cgroups named before "--", then execs the rest. A shell costs about a
# millisecond; a Python preexec_fn forces fork() of the whole agent instead of vfork
# (8 ms in a bare interpreter, tens of ms in a busy agent), on every task start. Used
# only where the task runs as the agent's own user (no credentials change).
_CGJOIN = (
    'while [ "$1" != "--" ]; do echo $$ > "$1" || '
    '{ echo "swarm: cannot join cgroup $1" >&2; exit 126; }; shift; done; shift; exec "$@"'
)


def _wrapper_joins(plan: ProcessPlan) -> bool:
    """Does the child join its cgroups itself (not inherit them from the starter)?"""
    return bool(plan.cgroup_procs) and not plan.cgroup_threads


def spawn_argv(plan: ProcessPlan) -> tuple[list[str], dict[str, Any]] | None:
    """argv and Popen arguments that keep the start on the fast (vfork) path, for a
    task that runs as the agent's own user: cgroups are inherited from the starting
    thread or joined by a tiny shell wrapper. None: the task changes user, which only
    `UserSwitch` may do (a fork, then the switch before anything else)."""
    if switches_user(plan):
        return None
    argv = list(plan.argv)
    if _wrapper_joins(plan):
        argv = ["/bin/sh", "-c", _CGJOIN, "swarm-cgjoin", *map(str, plan.cgroup_procs), "--", *argv]
    return argv, {}


def _command_exists(plan: ProcessPlan) -> bool:
    """Only for tasks that run as the agent's own user: anything else is checked by
    the kernel, as the task's user, at its exec."""
    cmd = plan.argv[0]
    if "/" in cmd:
        path = cmd if os.path.isabs(cmd) else os.path.join(plan.cwd, cmd)
        return os.path.isfile(path)
    return shutil.which(cmd, path=plan.env.get("PATH", os.defpath)) is not None


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


@attrs.frozen
class Spawn:
    """A process ready to be started: its Popen arguments and open log files."""

    plan: ProcessPlan
    argv: list[str]
    kwargs: dict[str, Any]
    logs: OpenLogs
    switch: UserSwitch | None = None  # the task runs as another user, via a fork
    helper: HelperStart | None = None  # ... started through swarm-exec (vfork)

    @property
    def forks(self) -> bool:
        """Does starting it fork the agent (a preexec_fn: CPython cannot vfork then)?"""
        return self.switch is not None


class Running:
    """Handle for a process in flight: lets the agent terminate it."""

    def __init__(self, task_id: str, proc: Child, grace: float, started: float) -> None:
        self.task_id = task_id
        self.proc = proc
        self.pid = proc.pid
        self.started = started  # trio clock
        self.grace = grace
        self.terminating = False
        self.term_reason = ""
        self._kill_scope: trio.CancelScope | None = None
        self.helper_status: int | None = None  # swarm-exec's status pipe, to await

    def signal(self, sig: int) -> bool:
        return kill_group(self.pid, sig)

    async def terminate(self, reason: str) -> None:
        """SIGTERM the group, SIGKILL after the grace period; returns when it is gone."""
        if not self.terminating:
            self.terminating = True
            self.term_reason = reason
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
    ) -> None:
        self.kill_grace = kill_grace
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
        return self._spawned(spawn, _popen(spawn))

    async def start_in_thread(self, spawn: Spawn) -> Running | ProcessResult:
        """The forking start, in a worker thread: a fork copies the agent, which must
        not stall the loop."""
        return self._spawned(spawn, await trio.to_thread.run_sync(_popen, spawn))

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
            if _wrapper_joins(plan) and not _command_exists(plan):
                # the wrapper would report this as "exit 127": say it plainly instead
                close_logs((out, err))
                msg = _spawn_error(plan, FileNotFoundError(2, "not found", plan.argv[0]))
                return ProcessResult(None, None, spawn_error=msg)
            kwargs["cwd"] = plan.cwd
        else:
            # switch user first, then chdir as the user (no cwd= here: subprocess would
            # chdir as root, before the switch), then exec with the task's environment
            switch = UserSwitch(plan)
            argv = list(plan.argv)
            kwargs = {"preexec_fn": switch.preexec}
        if plan.umask is not None:
            kwargs["umask"] = plan.umask
        kwargs.update(
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        return Spawn(plan, argv, kwargs, (out, err), switch, helper)

    def _spawned(
        self, spawn: Spawn, popen: subprocess.Popen[Any] | BaseException
    ) -> Running | ProcessResult:
        switched = spawn.switch is not None or spawn.helper is not None
        why = None
        if spawn.switch is not None:
            if isinstance(popen, BaseException):
                why = spawn.switch.error()
            spawn.switch.close()
        if not isinstance(popen, BaseException):
            close_logs(spawn.logs)  # the child has its own copies
            handle = self._started(spawn.plan, Child(popen))
            if spawn.helper is not None:
                handle.helper_status = spawn.helper.started()
            return handle
        if spawn.helper is not None:
            spawn.helper.failed()
        msg = why or _spawn_error(spawn.plan, popen, switched=switched)
        try:  # where the task's own stderr would have gone
            os.write(spawn.logs[1], f"swarm: {msg}\n".encode())
        except OSError:
            pass
        close_logs(spawn.logs)
        return ProcessResult(None, None, spawn_error=msg)

    def _started(self, plan: ProcessPlan, proc: Child) -> Running:
        handle = Running(plan.task_id, proc, self.kill_grace, self.clock.now())
        self.running[plan.task_id] = handle
        self._starting.discard(plan.task_id)
        return handle

    async def _supervise(
        self,
        handle: Running,
        on_started: Callable[[int, float], Awaitable[None]] | None,
    ) -> ProcessResult:
        proc = handle.proc
        if handle.helper_status is not None:
            fd, handle.helper_status = handle.helper_status, None
            why = await helper_verdict(fd)
            if why is not None:  # the helper could not start the task: it has exited
                await proc.wait()
                self.running.pop(handle.task_id, None)
                return ProcessResult(None, None, spawn_error=why, pid=proc.pid)
        try:
            doomed = self._doomed.pop(handle.task_id, None)
            if doomed is not None:  # terminated while it was being spawned
                await handle.terminate(doomed)
            if on_started is not None:
                try:
                    ct = psutil.Process(proc.pid).create_time()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    ct = 0.0
                await on_started(proc.pid, ct)
            try:
                rc = await proc.wait()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await handle.terminate(handle.term_reason or "agent cancelled")
                raise
        finally:
            # kill stragglers left in the group (background children of the task)
            kill_group(proc.pid, _signal.SIGKILL)
            self.running.pop(handle.task_id, None)
        if rc < 0:
            return ProcessResult(
                None, -rc, pid=proc.pid, started_at=handle.started, cancelled=handle.terminating
            )
        return ProcessResult(
            rc, None, pid=proc.pid, started_at=handle.started, cancelled=handle.terminating
        )

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


# O_NOFOLLOW: a task's log file is never a symlink someone planted (the agent may be
# root; the file's name comes from a validated task id in a root-owned directory)
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


def _popen(spawn: Spawn) -> subprocess.Popen[Any] | BaseException:
    """Popen, with the failure to start returned (this may run in a worker thread).

    With `cgroup_threads`, the calling thread (alone: v1 moves single threads through
    `tasks`) joins the task's groups for the start: a child is born in its parent
    thread's groups. Two writes per hierarchy (~0.03 ms) instead of exec'ing a shell
    that joins them (~1 ms of CPU and of wall time before the task's own exec)."""
    tid = str(threading.get_native_id())
    joined: list[Path] = []
    try:
        for task_file, home in spawn.plan.cgroup_threads:
            try:
                write_control(task_file, tid)
            except OSError as e:
                return CgroupJoinError(f"cannot put the process in its cgroup: {task_file}: {e}")
            joined.append(home)
        return subprocess.Popen(spawn.argv, **spawn.kwargs)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return e
    finally:
        for home in joined:
            try:
                write_control(home, tid)
            except OSError:
                # never fail a started process for this: the group's removal will
                # report it busy (cgroup.remove_failed), and kills skip the agent
                pass


class CgroupJoinError(Exception):
    """The starting thread could not join the task's cgroup (so nothing was started)."""


def write_control(path: Path, value: str) -> None:
    """Write a kernel control file (cgroupfs): never created, a missing one is an error."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def open_log(path: Path) -> int:
    """A task's output file, created if new, appended to (an attempt after a retry or
    a migration continues the same file)."""
    return os.open(path, LOG_FLAGS, 0o666)


def open_logs(stdout: Path, stderr: Path, open_one: Callable[[Path], int] = open_log) -> OpenLogs:
    out = open_one(stdout)
    try:
        err = open_one(stderr)
    except OSError:
        os.close(out)
        raise
    return out, err


def close_logs(logs: OpenLogs) -> None:
    for fd in logs:
        os.close(fd)


def _spawn_error(plan: ProcessPlan, e: BaseException, *, switched: bool = False) -> str:
    """Why a start failed, in the task's words. For a task run as another user the
    exec's own error is all there is to say: nothing is checked again as root (that
    would tell the user whether a file they cannot see exists)."""
    if isinstance(e, CgroupJoinError):
        return str(e)
    if switched and isinstance(e, OSError) and e.errno in (errno.ENOENT, errno.EACCES):
        what = "command not found" if e.errno == errno.ENOENT else "permission denied"
        return f"{what}: {plan.argv[0]}"
    if isinstance(e, FileNotFoundError):
        if e.filename == plan.cwd or (e.filename is None and not os.path.isdir(plan.cwd)):
            return f"working directory not found: {plan.cwd}"
        return f"command not found: {plan.argv[0]}"
    if isinstance(e, PermissionError):
        return f"permission denied: {e.filename or plan.argv[0]}"
    if isinstance(e, NotADirectoryError):
        return f"working directory is not a directory: {plan.cwd}"
    if isinstance(e, OSError) and e.errno == errno.E2BIG:
        return "argument list too long"
    if isinstance(e, subprocess.SubprocessError) and "preexec_fn" in str(e):
        return "cannot put the process in its cgroup or switch to its user"
    return f"cannot start process: {e}"
